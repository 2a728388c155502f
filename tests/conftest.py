"""Shared fixtures: a copy of the real inventory with unreachable loopback hosts (never the placeholders)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from provision.cli import main

ROOT = Path(__file__).resolve().parent.parent
COLLECTIONS = ROOT / "collections"


def run_module(module: str, args: dict, tmp_path: Path) -> dict:
    """A module's answer (a file under the collection's plugins/modules, or -m NAME), run the way Ansible's module
    debugging runs one: its arguments from a file."""
    spec = tmp_path / f"{module.replace('/', '_')}-args.json"
    spec.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    target = ["-m", module[3:]] if module.startswith("-m ") else [str(COLLECTIONS / module)]
    proc = subprocess.run(
        [sys.executable, *target, str(spec)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(COLLECTIONS)},
    )  # fmt: skip
    return json.loads(proc.stdout)


LOCAL_HOSTS = {
    "all": {
        # Only the controller-side plan play runs against these (`--tags plan`). Should anything try to
        # connect, it meets a closed loopback port: never this machine's shell, never another host.
        "vars": {"ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_connection": "ssh"},
        "children": {
            "rtx6000": {"hosts": {"rtx-test": None}},
            "b300": {"hosts": {"b300-test": None}},
        },
    }
}


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    """The repository's group_vars with local test hosts."""
    inv = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory", inv)
    (inv / "hosts.yml").write_text(yaml.safe_dump(LOCAL_HOSTS, sort_keys=False))
    return inv


Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """Run the CLI in-process: (exit code, stdout, stderr)."""

    def _run(*argv: str) -> tuple[int, str, str]:
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse
            rc = int(exc.code or 0)
        out, err = capsys.readouterr()
        return rc, out, err

    return _run


@pytest.fixture
def plan_json(run: Run) -> Callable[..., dict]:
    def _plan(*argv: str) -> dict:
        rc, out, err = run("plan", "--json", *argv)
        assert rc == 0, err
        return json.loads(out)

    return _plan
