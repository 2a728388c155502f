"""`provision sandbox`: real Debian hosts with systemd on this machine, in network namespaces of their own.

Needs root, debootstrap, systemd-nspawn and apt-cacher-ng (.ci/setup installs them). The first run
builds the Debian base tree (about a minute); later runs reuse it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provision.sandbox import layout, machines

PROVISION = str(Path(sys.executable).parent / "provision")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("debootstrap", "systemd-nspawn", "apt-cacher-ng")),
    reason="needs root with debootstrap, systemd-nspawn and apt-cacher-ng",
)


@pytest.fixture(scope="module")
def sandbox() -> list[layout.SandboxHost]:
    from provision.cli import main

    assert main(["sandbox", "up", "--hosts", "rtx6000,b300"]) == 0
    return layout.load_hosts()


def test_hosts_boot_systemd_and_answer_ssh(sandbox, run) -> None:
    rc, out, _ = run("sandbox", "status")
    assert rc == 0
    assert f"rtx6000-sbx (rtx6000) {layout.SUBNET}." in out and f"b300-sbx (b300) {layout.SUBNET}." in out
    assert out.count(": running") == 2  # systemd's own verdict, not "degraded"


def test_exec_passes_the_exit_code_through(sandbox) -> None:
    proc = subprocess.run(
        [PROVISION, "sandbox", "exec", "b300-sbx", "--", "sh", "-c", "hostname; exit 7"], capture_output=True, text=True
    )
    assert proc.returncode == 7 and proc.stdout.strip() == "b300-sbx"


def test_each_host_has_its_own_network_namespace(sandbox) -> None:
    for host in sandbox:
        addrs = subprocess.run(["ip", "-n", host.netns, "-4", "addr"], capture_output=True, text=True, check=True)
        assert host.address in addrs.stdout
    assert len({h.address for h in sandbox}) == 2


def test_apt_works_inside_through_the_proxy(sandbox) -> None:
    host = next(h for h in sandbox if h.type == "rtx6000")
    proc = subprocess.run(
        [*machines.ssh_command(host), "apt-get update -qq && apt-get install -y -qq jq >/dev/null && jq --version"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("jq-")


def test_up_again_keeps_running_hosts(sandbox, run) -> None:
    pids = {h.name: machines.running(h) for h in sandbox}
    rc, _, _ = run("sandbox", "up")
    assert rc == 0
    assert {h.name: machines.running(h) for h in layout.load_hosts()} == pids


def test_plan_and_apply_target_the_sandbox(sandbox, run, tmp_path: Path) -> None:
    import json

    rc, out, _ = run("plan", "--host", "b300", "--sandbox", "--json")
    assert rc == 0
    plan = json.loads(out)
    # the same group_vars as production, except what data/sandbox.yml says (one place)
    assert plan["host"] == "b300-sbx" and plan["gpu"]["arch"] == "10.3" and plan["cuda"]["method"] == "pip"
    # the plan play only: the roles' own proofs are in test_cuda_toolkit.py
    rc, out, _ = run("apply", "--host", "all", "--sandbox", "--state-dir", str(tmp_path), "--tags", "plan")
    assert rc == 0, out
    assert "rtx6000-sbx : ok=" in out and "b300-sbx : ok=" in out


def test_bad_host_types_are_refused(run) -> None:
    rc, _, err = run("sandbox", "up", "--hosts", "rtx6000,h100")
    assert rc == 2 and "--hosts: rtx6000,h100: unknown item 'h100'; allowed: rtx6000, b300, each optionally :N" in err
    rc, _, err = run("sandbox", "up", "--hosts", "b300:9")
    assert rc == 2 and "(1-8)" in err


def test_down_leaves_nothing_behind(sandbox, run) -> None:
    pids = [machines.running(h) for h in sandbox]
    rc, _, _ = run("sandbox", "down")
    assert rc == 0
    assert all(not machines.running(h) for h in sandbox)
    for pid in pids:
        assert (
            pid is None or not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        )
    mounts = Path("/proc/self/mounts").read_text()
    assert str(layout.STATE / "hosts") not in mounts
    assert not any(Path(f"/run/netns/{h.netns}").exists() for h in sandbox)
    assert subprocess.run(["ip", "link", "show", layout.BRIDGE], capture_output=True).returncode != 0
    assert not [p for h in sandbox for p in Path("/sys/fs/cgroup").glob(f"*/{h.cgroup}")]
    # no ssh master outlives its host (a new host at the same address would inherit a dead one)
    assert not list((layout.STATE / "ssh").glob("cm-*"))
    rc, _, err = run("plan", "--host", "b300", "--sandbox")
    assert rc == 2 and "no sandbox is up" in err
