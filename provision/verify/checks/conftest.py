"""Fixtures of the verification suite: each testinfra host's plan, and what the host can be asked.

The plans come from `provision verify` (one JSON file, --dflash-plans), so the checks judge a host
against exactly what `provision plan` shows for it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from provision import paths


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--dflash-plans", required=True, help="JSON file: host name -> plan")


@pytest.fixture(scope="session")
def plans(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    return json.loads(Path(request.config.getoption("--dflash-plans")).read_text())


@pytest.fixture
def plan(host: Any, plans: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return plans[host.backend.get_hostname()]


@pytest.fixture
def gpus(host: Any) -> None:
    """Skip, with the reason, where the host has no GPU: such a check is never reported as passed."""
    if not host.exists("nvidia-smi"):
        pytest.skip(f"no GPU on {host.backend.get_hostname()}: nvidia-smi is not installed")
    probe = host.run("nvidia-smi -L")
    if probe.rc != 0 or "GPU " not in probe.stdout:
        pytest.skip(f"no GPU on {host.backend.get_hostname()}: nvidia-smi -L says {probe.stdout.strip()[:120]!r}")


def run_script(host: Any, script: str, python: str, args: str = "", env: dict[str, str] | None = None) -> Any:
    """Send a role's helper script (roles/ROLE/files/NAME) inside the command, to a private temporary
    directory on the host, and run it with the given Python: the host needs nothing of ours."""
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    name = Path(script).name
    text = (paths.roles() / script).read_text()
    command = (
        f"d=$(mktemp -d) && cat > $d/{name} <<'DFLASH_PROBE_EOF'\n{text}DFLASH_PROBE_EOF\n"
        f"cd $d && env {assigns} {shlex.quote(python)} $d/{name} {args}; rc=$?; rm -rf $d; exit $rc"
    )
    return host.run(command)


def service_key(host: Any, plan: dict[str, Any]) -> str | None:
    """The API key, read on the host (root only); never printed."""
    path = plan["config"]["serve"]["api_key_file"]
    if not path:
        return None
    return host.check_output(f"cat {shlex.quote(path)}").strip() or None
