"""pytest plugin of the verification suite: one JSON record per host and check, written atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from provision.files import write_atomic

_records: list[dict[str, Any]] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--dflash-report", required=True, help="where to write the JSON report")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # a check's outcome is its call phase, or the setup phase that skipped or broke it
    if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    module, _, rest = report.nodeid.partition("::")
    name, _, param = rest.partition("[")
    reason = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    elif report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        reason = (crash.message if crash else str(report.longrepr)).strip().splitlines()[0][:500]
    _records.append(
        {
            "host": param.rstrip("]").removeprefix("ansible://"),
            "area": Path(module).stem.removeprefix("test_"),
            "check": name.removeprefix("test_"),
            "outcome": report.outcome,
            "reason": reason,
            "seconds": round(report.duration, 2),
        }
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = Path(session.config.getoption("--dflash-report"))
    write_atomic(path, json.dumps(_records, indent=2) + "\n", mode=0o644)
