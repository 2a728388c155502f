"""Apply takes over nothing it did not create, on a fresh sandbox host: a configuration directory that
exists (root's, with a file in it) and a login account as the service user are refused by name before
any change (the host unchanged byte for byte); adopted, the directory passes the guard, a login account
never does.

Needs what test_sandbox.py needs. tests/test_managed_paths.py has the model's rules and the module's cases.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from provision.cli import main
from provision.sandbox import layout
from tests.conftest import ROOT
from tests.test_sandbox import pytestmark  # noqa: F401 - the same requirements
from tests.test_stack import on, recap

# what the roles and the guard would touch first, and the account files
TREES = ("/etc/sglang-dflash /etc/passwd /etc/shadow /etc/group /etc/gshadow /etc/systemd /opt /usr/local /models "
         "/var/cache/sglang-dflash /var/lib/sglang-dflash /var/lib/dflash-provision /home/sglang")  # fmt: skip
LISTING = (
    f"for p in {TREES}; do test -e $p || echo absent $p; done; "
    f"find {TREES} -xdev -printf '%p %y %u:%g %m %s %l\\n' 2>/dev/null | sort; "
    f"find {TREES} -xdev -type f -print0 2>/dev/null | sort -z | xargs -0 -r sha256sum"
)


@pytest.fixture(scope="module")
def host():
    assert main(["sandbox", "down"]) == 0
    assert main(["sandbox", "up", "--hosts", "b300"]) == 0
    (found,) = layout.load_hosts()
    prepared = on(found, "mkdir /etc/sglang-dflash && echo keep > /etc/sglang-dflash/note && "
                         "useradd -m -s /bin/bash sglang")  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr
    yield found
    main(["sandbox", "down"])


def listing(host: layout.SandboxHost) -> bytes:
    proc = on(host, LISTING)
    assert proc.returncode == 0 and b"/etc/sglang-dflash/note" in proc.stdout, proc.stderr
    return proc.stdout


def apply(tmp_path: Path, *extra: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "apply", "--host", "b300", "--sandbox", "--state-dir", str(tmp_path),
         *extra],
        capture_output=True, text=True, timeout=1200, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250"},  # a task name a line
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def test_existing_directory_and_login_account_are_refused_before_any_change(host, tmp_path: Path) -> None:
    before = listing(host)
    rc, out = apply(tmp_path)
    assert rc != 0, out[-3000:]
    assert "/etc/sglang-dflash (service.config_dir) exists (directory, root:root) and apply did not create it" in out
    assert "the account sglang (service.user) exists and apply did not create it: uid 1000, shell /bin/bash" in out
    # the guard is part of the one look at the host, with the facts (read-only): nothing after it ran
    tail = out[out.index("TASK Look at the whole host at once") :]
    assert "\n  TASK" not in tail, tail
    assert recap(out)[host.name][1:] == (0, 0, 1)
    assert listing(host) == before


def test_a_login_account_is_refused_even_adopted(host, tmp_path: Path) -> None:
    before = listing(host)
    rc, out = apply(tmp_path, "--set", 'service.adopt=["/etc/sglang-dflash", "sglang"]')
    assert rc != 0, out[-3000:]
    assert "/etc/sglang-dflash (service.config_dir)" not in out
    assert "the account sglang (service.user) exists" in out and "choose a service.user that does not exist" in out
    assert listing(host) == before


def test_the_adopted_directory_passes_the_guard(host, tmp_path: Path) -> None:
    before = listing(host)
    # a dry run: the guard passes, the roles go on (and change nothing)
    rc, out = apply(tmp_path, "--check", "--set", 'service.adopt=["/etc/sglang-dflash"]', "--set", "service.user=llm")
    assert (
        "Look at the whole host at once (read-only), gather its facts, and refuse what apply did not create\n"
        "    ok: b300-sbx" in out
    ), out[-3000:]
    # the facts came with the look: the release is known after it
    assert "Refuse a release the roles do not support\n    ok: b300-sbx" in out
    assert rc == 0, out[-3000:]
    assert listing(host) == before
