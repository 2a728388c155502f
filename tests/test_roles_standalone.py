"""A role runs alone from the example in its README: a play with only that role and literal values, no plan.

The sglang_service example runs verbatim (its `## Alone` block, read from the README) on a fresh sandbox host:
apply, re-apply changed=0, a dry run that changes nothing, and drift in the unit undone. The other roles'
examples are checked for what can be checked without a GPU host: every required parameter is given, none is
unknown, and no example mentions dflash_plan.

Needs what test_sandbox.py needs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provision.cli import main
from provision.sandbox import layout
from tests.conftest import ROOT
from tests.test_sandbox import pytestmark  # noqa: F401 - the same requirements
from tests.test_stack import on

BIN = Path(sys.executable).parent
ROLES = sorted(p.parent.name for p in (ROOT / "roles").glob("*/README.md") if p.parent.name != "dflash_plan")


def example(role: str) -> list[dict]:
    """The play in the README's `## Alone` section."""
    text = (ROOT / "roles" / role / "README.md").read_text()
    section = text.split("\n## Alone\n", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, f"{role}: no yaml block under ## Alone"
    return yaml.safe_load(block.group(1))


@pytest.mark.parametrize("role", ROLES)
def test_each_readme_example_gives_the_required_parameters_and_no_plan(role: str) -> None:
    (play,) = example(role)
    (entry,) = play["roles"]
    given = {k for k in entry if k != "role"}
    options = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options = options["argument_specs"]["main"]["options"]
    assert entry["role"] == role
    assert {name for name, o in options.items() if o.get("required")} <= given
    assert given <= set(options), given - set(options)
    assert "dflash_plan" not in yaml.safe_dump(play)
    # and the role's own files never read it: the playbooks pass it
    for path in (ROOT / "roles" / role).rglob("*.yml"):
        assert "dflash_plan" not in path.read_text(), path


@pytest.fixture(scope="module")
def host():
    assert main(["sandbox", "down"]) == 0
    assert main(["sandbox", "up", "--hosts", "b300"]) == 0
    (found,) = layout.load_hosts()
    yield found
    main(["sandbox", "down"])


def recap(out: str) -> dict[str, tuple[int, ...]]:
    """ansible-playbook's recap: host to (ok, changed, unreachable, failed)."""
    found = re.findall(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", out, re.M)
    return {host: tuple(int(x) for x in counts) for host, *counts in found}


def play(tmp_path: Path, host: layout.SandboxHost, *args: str) -> tuple[int, str]:
    playbook = tmp_path / "alone.yml"
    playbook.write_text(yaml.safe_dump(example("sglang_service"), sort_keys=False))
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(layout.inventory_dir()), "--limit", host.name, *args, str(playbook)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
             "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def test_sglang_service_runs_alone_from_its_readme(host, tmp_path: Path) -> None:
    health = "curl -s -o /dev/null -w %{http_code} http://127.0.0.1:30080/health_generate"
    rc, out = play(tmp_path, host, "--check")
    assert rc == 0, out[-3000:]
    assert recap(out)[host.name][3] == 0
    assert on(host, "test ! -e /etc/systemd/system/health-demo.service").returncode == 0

    rc, out = play(tmp_path, host)
    assert rc == 0, out[-3000:]
    assert recap(out)[host.name][1] > 0
    assert "health-demo is ready at http://127.0.0.1:30080" in out
    assert on(host, "systemctl is-active health-demo; systemctl is-enabled health-demo").stdout.split() == [
        b"active",
        b"enabled",
    ]
    assert on(host, health).stdout == b"200"

    rc, out = play(tmp_path, host)
    assert rc == 0, out[-3000:]
    assert recap(out)[host.name][1] == 0

    # drift in the unit: the dry run sees it and leaves it, the apply restores it and restarts the service
    unit = "/etc/systemd/system/health-demo.service"
    assert on(host, f"printf '# drift\\n' >> {unit}; chmod 0600 {unit}").returncode == 0
    rc, out = play(tmp_path, host, "--check")
    assert rc == 0 and recap(out)[host.name][1] > 0, out[-3000:]
    assert on(host, f"tail -1 {unit}").stdout == b"# drift\n"
    rc, out = play(tmp_path, host)
    assert rc == 0 and recap(out)[host.name][1] > 0, out[-3000:]
    assert b"# drift" not in on(host, f"cat {unit}").stdout
    assert on(host, f"stat -c %U:%G:%a {unit}").stdout.strip() == b"root:root:644"
    assert on(host, health).stdout == b"200"
