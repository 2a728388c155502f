"""`provision sandbox`: real Debian hosts with systemd on this machine, in network namespaces of their own.

Needs root, debootstrap, systemd-nspawn and apt-cacher-ng (.ci/setup installs them). The first run
builds the Debian base tree (about a minute); later runs reuse it. Each test brings the hosts up if an earlier
one took them down (about a second once the base exists).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provision.sandbox import layout, lock, machines, teardown

PROVISION = str(Path(sys.executable).parent / "provision")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("debootstrap", "systemd-nspawn", "apt-cacher-ng")),
    reason="needs root with debootstrap, systemd-nspawn and apt-cacher-ng",
)


@pytest.fixture
def sandbox() -> list[layout.SandboxHost]:
    from provision.cli import main

    assert main(["sandbox", "up", "--hosts", "rtx6000,b300"]) == 0
    return layout.load_hosts()


def nspawn_pids(host: layout.SandboxHost) -> list[int]:
    """Read straight from /proc, not through the code under test: nspawn processes booted on the host's root."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = proc.joinpath("cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"systemd-nspawn") and f"--directory={host.root}".encode() in argv:
            found.append(int(proc.name))
    return sorted(found)


def processes_naming(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in argv and int(proc.name) != os.getpid():
            found.append(f"{proc.name}: {argv}")
    return found


def dead_pid() -> int:
    proc = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    return int(proc.stdout)


def assert_consistent_up(hosts: list[layout.SandboxHost]) -> None:
    """Exactly one container per registered host, and its pid file names it."""
    assert [h.name for h in layout.load_hosts()] == [h.name for h in hosts]
    for host in hosts:
        pids = nspawn_pids(host)
        assert len(pids) == 1, (host.name, pids)
        assert host.pid_file.read_text().strip() == str(pids[0])


def assert_nothing_left(hosts: list[layout.SandboxHost]) -> None:
    for what in (layout.STATE / "hosts", layout.STATE / "apt-proxy" / "conf", layout.STATE / "ssh" / "cm-"):
        assert not processes_naming(str(what))
    assert str(layout.STATE / "hosts") not in Path("/proc/self/mounts").read_text()
    assert not any(Path(f"/run/netns/{h.netns}").exists() for h in hosts)
    for link in [layout.BRIDGE, *(h.veth for h in hosts)]:
        assert subprocess.run(["ip", "link", "show", link], capture_output=True).returncode != 0, link
    assert not [p for h in hosts for p in Path("/sys/fs/cgroup").glob(f"*/{h.cgroup}")]
    assert not list((layout.STATE / "ssh").glob("cm-*"))
    assert not (layout.STATE / "hosts").exists() or not list((layout.STATE / "hosts").iterdir())
    assert layout.load_hosts() == []
    assert teardown.leftovers() == []


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


def test_a_pid_file_naming_another_process_is_repaired(sandbox, run) -> None:
    real = {h.name: nspawn_pids(h) for h in sandbox}
    first, second = sandbox
    first.pid_file.write_text(f"{os.getpid()}\n")  # alive, but not a container
    second.pid_file.write_text(f"{dead_pid()}\n")
    rc, out, err = run("sandbox", "status")
    assert rc == 0 and out.count(": running") == 2
    assert "now names the running one" in err
    assert_consistent_up(sandbox)
    # `up` repairs too, and boots no second container beside the one it adopts
    first.pid_file.write_text(f"{dead_pid()}\n")
    rc, _, err = run("sandbox", "up")
    assert rc == 0, err
    assert_consistent_up(sandbox)
    assert {h.name: nspawn_pids(h) for h in sandbox} == real


def test_down_finds_containers_whatever_their_pid_files_say(sandbox, run) -> None:
    pids = [pid for h in sandbox for pid in nspawn_pids(h)]
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        sandbox[0].pid_file.unlink()
        sandbox[1].pid_file.write_text(f"{bystander.pid}\n")
        rc, _, err = run("sandbox", "down")
        assert rc == 0, err
        assert bystander.poll() is None  # the wrong pid was not signalled
    finally:
        bystander.kill()
        bystander.wait()
    assert not any(Path(f"/proc/{pid}/cmdline").exists() and Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids)
    assert_nothing_left(sandbox)


def test_down_empties_a_busy_cgroup(sandbox) -> None:
    host = sandbox[0]
    # ignores SIGTERM (the disposition survives exec), so only the SIGKILL after the grace time ends it
    squatter = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 300"], start_new_session=True)
    try:
        moved = 0
        for procs in Path("/sys/fs/cgroup").glob(f"*/{host.cgroup}/cgroup.procs"):
            procs.write_text(str(squatter.pid))
            moved += 1
        assert moved
        # another process, so that it does not reap our child and hide how it ended
        down = subprocess.run([PROVISION, "sandbox", "down"], capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        assert f"ending processes [{squatter.pid}]" in down.stderr
        assert squatter.wait(timeout=10) == -9
    finally:
        squatter.kill()
        squatter.wait()
    assert_nothing_left(sandbox)


def test_concurrent_up_and_down_leave_a_consistent_state(sandbox, run) -> None:
    def together(*verbs: str) -> list[subprocess.CompletedProcess[str]]:
        procs = [
            subprocess.Popen([PROVISION, "sandbox", verb], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for verb in verbs
        ]
        outputs = [p.communicate(timeout=300) for p in procs]
        return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outputs, strict=True)]

    assert run("sandbox", "down")[0] == 0
    # two `up`s from nothing: one boots each host, the other waits and then finds them running
    for result in together("up", "up"):  # the default --hosts: the fixture's two
        assert result.returncode == 0, result.stderr
    assert_consistent_up(sandbox)
    # `up` and `down` at once: whichever ran second decides, and its state is whole
    for result in together("up", "down"):
        assert result.returncode == 0, result.stderr
    if layout.load_hosts():
        assert_consistent_up(sandbox)
    else:
        assert_nothing_left(sandbox)
    assert run("sandbox", "down")[0] == 0
    assert_nothing_left(sandbox)


def test_a_stuck_holder_is_named_when_the_wait_gives_up(monkeypatch, run) -> None:
    monkeypatch.setattr(lock, "WAIT_S", 0.5)
    with lock.exclusive("up"):
        rc, _, err = run("sandbox", "down")
    assert rc == 3  # ExitCode.BUSY
    assert f"`provision sandbox up` (pid {os.getpid()}) has held {layout.lock_file()} for more than 0 s" in err
    assert "gave up waiting" in err


def test_down_leaves_nothing_behind(sandbox, run) -> None:
    pids = [machines.running(h) for h in sandbox]
    rc, _, _ = run("sandbox", "down")
    assert rc == 0
    assert all(not machines.running(h) for h in sandbox)
    for pid in pids:
        assert (
            pid is None or not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        )
    # no ssh master outlives its host (a new host at the same address would inherit a dead one)
    assert_nothing_left(sandbox)
    rc, _, err = run("plan", "--host", "b300", "--sandbox")
    assert rc == 2 and "no sandbox is up" in err
