"""Run the verification suite (checks/) over planned hosts and summarize it per host and check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from provision.files import write_atomic
from provision.planning.types import Plan

CHECKS = Path(__file__).resolve().parent / "checks"
STYLE = {"passed": "green", "failed": "bold red", "skipped": "cyan"}


def verify(plans: list[Plan], inventory: Path, out_dir: Path, console: Console) -> int:
    """pytest-testinfra over the hosts; writes out_dir/verify.xml (JUnit) and verify.json; pytest's exit code."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plans_file = out_dir / "plans.json"
    write_atomic(plans_file, json.dumps({p.host: p.model_dump(mode="json") for p in plans}), mode=0o600)
    report = out_dir / "verify.json"
    hosts = ",".join(f"ansible://{p.host}" for p in plans)
    cmd = [
        sys.executable, "-m", "pytest", str(CHECKS), "-p", "provision.verify.report", "-p", "no:cacheprovider",
        f"--hosts={hosts}", f"--ansible-inventory={inventory}", f"--dflash-plans={plans_file}",
        f"--dflash-report={report}", f"--junitxml={out_dir / 'verify.xml'}", "-q", "-rs", "--no-header",
    ]  # fmt: skip
    # testinfra's ansible backend runs ansible-inventory: this interpreter's bin first
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if not report.is_file():
        console.print(proc.stdout[-4000:] + proc.stderr[-4000:])
        return proc.returncode or 1
    _summary(json.loads(report.read_text()), {p.host: p for p in plans}, console)
    if proc.returncode not in (0, 5):
        failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        console.print("\n".join(failed[:20]))
    console.print(f"[dim]JUnit: {out_dir / 'verify.xml'}, JSON: {report}[/]")
    return proc.returncode


def _summary(records: list[dict], plans: dict[str, Plan], console: Console) -> None:
    table = Table(title="provision verify", show_lines=False)
    for column in ("host", "area", "check", "result", "why"):
        table.add_column(column, overflow="fold")
    for rec in records:
        outcome = rec["outcome"]
        plan = plans.get(rec["host"])
        standin = plan is not None and plan.config.service.launcher == "standin" and rec["area"] == "service"
        # a check the stand-in served proves the unit and the HTTP contract, never a GPU
        label = f"{outcome} (stand-in)" if standin and outcome == "passed" else outcome
        style = STYLE.get(outcome, "")
        table.add_row(rec["host"], rec["area"], rec["check"], f"[{style}]{label}[/]", rec["reason"])
    console.print(table)
