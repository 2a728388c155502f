"""The sweep's results: an append-only JSONL file, one record per finished (config, cell).

Each record is one line written with a single os.write on an O_APPEND descriptor, then fsynced, so a record
is either wholly in the file or (after a kill mid-write) a torn last line without its newline. Loading drops a
torn line with a warning and cuts it off the file, so the next append starts on a line of its own.
"""

from __future__ import annotations

import json
import os
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from provision.sweep.coding import CodingScore

CONFIG_LEVEL = "*"  # the cell of a record for the whole config (it could not be planned, applied or started)


class TornLineWarning(UserWarning):
    """The results file ended in a partly written line (the sweep was killed while appending)."""


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: str
    cell: str  # a grid cell id (c1-in60), CONFIG_LEVEL, or another step's name (coding)
    status: Literal["ok", "failed"]
    error: str | None = None
    started: str
    finished: str
    result: dict[str, Any] | None = None  # a load.CellResult as a dict
    accept_length: float | None = None
    coding: CodingScore | None = None
    server_args: dict[str, Any] | None = None
    trained_block_size: int | None = None  # the drafter's, as read when the config ran


def now() -> str:
    """A record's timestamp: UTC, ISO 8601, seconds."""
    return datetime.now(UTC).isoformat(timespec="seconds")


class Results:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._records: list[Record] = self._load()

    def _load(self) -> list[Record]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        complete, _, torn = raw.rpartition(b"\n")
        if torn:  # no newline after the last write: it was cut short
            warnings.warn(
                f"{self.path}: dropped a partly written last line ({len(torn)} bytes), "
                "left by a sweep stopped while writing; that cell will run again",
                TornLineWarning,
                stacklevel=3,
            )
            keep = len(complete) + 1 if complete else 0
            with open(self.path, "r+b") as handle:
                handle.truncate(keep)
                os.fsync(handle.fileno())
        records: list[Record] = []
        for number, line in enumerate(complete.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(Record.model_validate(json.loads(line)))
            except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as err:
                warnings.warn(f"{self.path}:{number}: skipped an unreadable record: {err}", stacklevel=3)
        return records

    def append(self, record: Record | dict[str, Any]) -> Record:
        """Add one record durably: the whole line in one write, then fsync."""
        rec = record if isinstance(record, Record) else Record.model_validate(record)
        line = (rec.model_dump_json() + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)
            if written != len(line):  # a short write to a regular file: disk full; never leave half a record
                os.ftruncate(fd, os.fstat(fd).st_size - written)
                raise OSError(f"{self.path}: short write ({written} of {len(line)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:  # make the new directory entry durable too
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self._records.append(rec)
        return rec

    def records(self) -> list[Record]:
        return list(self._records)

    def done(self) -> set[tuple[str, str]]:
        """(config, cell) pairs with a record, ok or failed: `--resume` skips them and redoes none."""
        return {(r.config, r.cell) for r in self._records}

    def skip(self, config: str, cell: str) -> bool:
        """Whether `--resume` skips this cell: it has a record, or its whole config failed."""
        done = self.done()
        return (config, cell) in done or (config, CONFIG_LEVEL) in done
