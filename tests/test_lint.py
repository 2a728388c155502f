"""The codebase's own standards: ansible-lint's production profile and ruff."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

BIN = Path(sys.executable).parent
LINTED = ["playbooks", "roles", "collections", "bench"]


def test_ansible_lint_production_profile() -> None:
    proc = subprocess.run(
        [str(BIN / "ansible-lint"), "--profile", "production", "--nocolor", *LINTED],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(Path.home()), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Profile 'production' was required, and it passed" in proc.stderr + proc.stdout


def test_ruff() -> None:
    proc = subprocess.run(
        [str(BIN / "ruff"), "check", "provision", "tests", "collections", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
