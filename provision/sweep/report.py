"""The sweep's report in the seed's shape: a markdown table, the same as CSV, and a throughput/acceptance plot.

    | config | C=1 60 tok | C=1 1k | C=1 4k | C=32 60 tok | C=32 4k | accept | coding |

One row per config (the matrix's order), one column per grid cell: output tok/s, or "failed". `accept` is the
mean of the config's per-cell accept lengths; `coding` is passed/total from the config's record that has it.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from provision.files import write_atomic
from provision.sweep.matrix import GridCell, Matrix
from provision.sweep.results import CONFIG_LEVEL, Record

FAILED = "failed"
MISSING = "-"


def tokens_label(n: int) -> str:
    """The seed's spelling: 60 tok, 1k, 4k."""
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n} tok"


def column_label(cell: GridCell, grid: list[GridCell]) -> str:
    """C=1 60 tok, C=32 4k; with the output length only where two cells would otherwise read the same."""
    label = f"C={cell.concurrency} {tokens_label(cell.input_tokens)}"
    twins = [c for c in grid if (c.concurrency, c.input_tokens) == (cell.concurrency, cell.input_tokens)]
    return label + (f" out{cell.output_tokens}" if len(twins) > 1 else "")


@dataclass
class Row:
    config: str
    throughput: dict[str, float | str]  # cell id -> output tok/s, FAILED or MISSING
    accept: float | None
    coding: str


def _latest(records: Iterable[Record]) -> dict[tuple[str, str], Record]:
    # a rerun without --resume appends again: the last record of a (config, cell) is the one that counts
    return {(r.config, r.cell): r for r in records}


def summarize(records: Iterable[Record], matrix: Matrix) -> list[Row]:
    latest = _latest(records)
    rows: list[Row] = []
    for config in matrix.configs:
        name = config.name
        config_failed = (name, CONFIG_LEVEL) in latest and latest[(name, CONFIG_LEVEL)].status == "failed"
        throughput: dict[str, float | str] = {}
        accepts: list[float] = []
        for cell in matrix.grid:
            rec = latest.get((name, cell.id))
            if rec is None:
                throughput[cell.id] = FAILED if config_failed else MISSING
            elif rec.status == "failed" or not rec.result:
                throughput[cell.id] = FAILED
            else:
                throughput[cell.id] = float(rec.result["output_tok_s"])
                if rec.accept_length is not None:
                    accepts.append(rec.accept_length)
        mine = [r for (c, _), r in latest.items() if c == name]
        scored = [r for r in mine if r.coding is not None]
        if scored:
            coding = f"{scored[-1].coding.passed}/{scored[-1].coding.total}"  # type: ignore[union-attr]
        elif any(r.cell == "coding" and r.status == "failed" for r in mine) or config_failed:
            coding = FAILED
        else:
            coding = MISSING
        rows.append(Row(name, throughput, sum(accepts) / len(accepts) if accepts else None, coding))
    return rows


def _header(matrix: Matrix) -> list[str]:
    return ["config", *(column_label(c, matrix.grid) for c in matrix.grid), "accept", "coding"]


def _cells(row: Row, matrix: Matrix, digits: int) -> list[str]:
    def number(value: float | str) -> str:
        return f"{value:.{digits}f}" if isinstance(value, float) else value

    accept = f"{row.accept:.2f}" if row.accept is not None else MISSING
    return [row.config, *(number(row.throughput[c.id]) for c in matrix.grid), accept, row.coding]


def markdown(rows: list[Row], matrix: Matrix) -> str:
    header = _header(matrix)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cells(row, matrix, 1)) + " |" for row in rows]
    outputs = " or ".join(str(n) for n in sorted({c.output_tokens for c in matrix.grid}))
    note = f"Cells: output tok/s ({outputs} output tokens a request); accept: mean accept length."
    return "\n".join(lines) + "\n\n" + note + "\n"


def to_csv(rows: list[Row], matrix: Matrix) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_header(matrix))
    writer.writerows(_cells(row, matrix, 2) for row in rows)
    return buffer.getvalue()


def plot(records: Iterable[Record], matrix: Matrix, path: Path) -> None:
    """Output tok/s against accept length: a series per concurrency (a marker per input length), labelled by config."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a control node; must precede pyplot
    import matplotlib.pyplot as plt

    latest = _latest(records)
    markers = "os^Dv<>Pp*"
    inputs = sorted({c.input_tokens for c in matrix.grid})
    concurrencies = sorted({c.concurrency for c in matrix.grid})
    colors = {c: f"C{i % 10}" for i, c in enumerate(concurrencies)}
    fig, ax = plt.subplots(figsize=(9, 6))
    for cell in matrix.grid:
        points = []
        for config in matrix.configs:
            rec = latest.get((config.name, cell.id))
            if rec and rec.status == "ok" and rec.result and rec.accept_length is not None:
                points.append((rec.accept_length, float(rec.result["output_tok_s"]), config.name))
        if not points:
            continue
        xs, ys, names = zip(*points, strict=True)
        marker = markers[inputs.index(cell.input_tokens) % len(markers)]
        ax.scatter(xs, ys, color=colors[cell.concurrency], marker=marker, label=column_label(cell, matrix.grid))
        for i, (x, y, name) in enumerate(sorted(points)):
            # alternate above/below so configs with near-equal accept lengths stay readable
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4 if i % 2 else -9), fontsize=7)
    ax.set_xlabel("accept length (tokens per verify step)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title("DFlash / DDTree sweep: throughput against acceptance")
    ax.grid(True, which="both", alpha=0.3)
    ys = [y for series in ax.collections for _, y in series.get_offsets()]
    if ys and min(ys) > 0 and max(ys) / min(ys) > 10:  # C=1 and C=32 differ ~10x: a log axis shows both
        ax.set_yscale("log")
    if ax.collections:
        ax.legend(fontsize=8)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    try:
        with os.fdopen(fd, "wb") as handle:
            fig.savefig(handle, format="png", dpi=120, bbox_inches="tight")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)


@dataclass
class ReportFiles:
    markdown: Path
    csv: Path
    png: Path


def write_report(records: Iterable[Record], matrix: Matrix, out_dir: Path, stem: str = "report") -> ReportFiles:
    """report.md, report.csv and report.png in `out_dir`, each written atomically."""
    records = list(records)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = summarize(records, matrix)
    files = ReportFiles(out_dir / f"{stem}.md", out_dir / f"{stem}.csv", out_dir / f"{stem}.png")
    write_atomic(files.markdown, markdown(rows, matrix), mode=0o644)
    write_atomic(files.csv, to_csv(rows, matrix), mode=0o644)
    plot(records, matrix, files.png)
    return files
