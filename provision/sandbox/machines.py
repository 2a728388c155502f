"""Booting, stopping and reaching one test host (systemd-nspawn on an overlay of the base tree)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from pathlib import Path

from provision.errors import SandboxError
from provision.files import write_atomic
from provision.sandbox.layout import (
    CGROUP_NAME,
    STATE,
    SandboxHost,
    base_dir,
    control_path,
    hosts_dir,
    key_file,
    known_hosts,
)
from provision.sandbox.system import cmdline, end_processes, mounted, processes, sh, wait_port, warn

CGROUP_ROOTS = [Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified")]


def _nspawn_root(argv: list[str]) -> Path | None:
    if argv and Path(argv[0]).name == "systemd-nspawn":
        for arg in argv:
            if arg.startswith("--directory="):
                return Path(arg.partition("=")[2])
    return None


def containers() -> dict[int, Path]:
    """Every container of this sandbox, found in /proc whatever the pid files say: nspawn pid -> its root.
    nspawn forks while it starts and the forks share its argv; only the one whose parent is not one of them
    counts."""
    table = processes()
    ours = {
        pid: root
        for pid, (_, argv) in table.items()
        if (root := _nspawn_root(argv)) and root.parent.parent == hosts_dir()
    }
    return {pid: root for pid, root in ours.items() if table[pid][0] not in ours}


def _is_nspawn_of(pid: int, host: SandboxHost) -> bool:
    argv = cmdline(pid)
    return _nspawn_root(argv) == host.root and f"--machine={host.name}" in argv


def _recorded_pid(host: SandboxHost) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(host.pid_file.read_text())
    return None


def running(host: SandboxHost) -> int | None:
    """The nspawn pid when the host runs. The pid file is only trusted when its pid is this host's nspawn (not a
    recycled pid, a file left by a crash, or one a racing process overwrote); otherwise it is repaired: the
    container that runs on the host's root is adopted, or the stale file removed."""
    recorded = _recorded_pid(host)
    if recorded is not None and _is_nspawn_of(recorded, host):
        return recorded
    found = sorted(pid for pid, root in containers().items() if root == host.root)
    said = f"named {recorded}" if recorded is not None else "was missing or unreadable"
    # best effort: a repair that fails (the host's directory going away under a racing `down`) changes no answer
    with contextlib.suppress(OSError):
        if found:
            write_atomic(host.pid_file, f"{found[0]}\n", mode=0o644)
            warn(f"{host.name}: its pid file {said}, not its container; now names the running one ({found[0]})")
        elif host.pid_file.exists():
            host.pid_file.unlink()
            warn(f"{host.name}: removed a stale pid file (it {said}; the host does not run)")
    return found[0] if found else None


def ensure_key() -> None:
    if not key_file().exists():
        key_file().parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dflash-sandbox", "-f", str(key_file()))


def _prepare_root(host: SandboxHost) -> None:
    for sub in ("upper", "work", "root"):
        (host.dir / sub).mkdir(parents=True, exist_ok=True)
    if not mounted(str(host.root)):
        options = f"lowerdir={base_dir()},upperdir={host.dir / 'upper'},workdir={host.dir / 'work'}"
        sh("mount", "-t", "overlay", "overlay", "-o", options, str(host.root))
    ssh_dir = host.root / "root" / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(Path(f"{key_file()}.pub").read_text())
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    if not (host.root / "etc/ssh/ssh_host_ed25519_key").exists():
        sh("ssh-keygen", "-A", "-f", str(host.root))
    (host.root / "etc/hostname").write_text(host.name + "\n")
    # the hosts have no DNS: without its own name here every fact gathering waits on a lookup
    (host.root / "etc/hosts").write_text(f"127.0.0.1 localhost\n{host.address} {host.name}\n::1 localhost\n")


def _cgroup_dirs(host: SandboxHost) -> list[Path]:
    return [root / host.cgroup for root in CGROUP_ROOTS if root.is_dir()]


def _enter_own_cgroup(dirs: list[Path]) -> None:
    """In the child before exec: each container starts from a cgroup of its own (else the second one's
    systemd fails to attach and reports degraded)."""
    for directory in dirs:
        (directory / "cgroup.procs").write_text("0")


def boot(host: SandboxHost) -> int:
    if pid := running(host):
        return pid
    _prepare_root(host)
    dirs = _cgroup_dirs(host)
    for directory in dirs:
        directory.mkdir(exist_ok=True)
    log = open(host.dir / "console.log", "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(
        [
            "systemd-nspawn", "--keep-unit", "--register=no", "--boot", "--quiet",
            f"--directory={host.root}", f"--machine={host.name}",
            f"--network-namespace-path=/run/netns/{host.netns}", "--console=passive",
        ],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=lambda: _enter_own_cgroup(dirs),
    )  # fmt: skip
    write_atomic(host.pid_file, f"{proc.pid}\n", mode=0o644)
    try:
        wait_port(host.address, 22, 60, alive=lambda: proc.poll() is None)
    except SandboxError as err:
        raise SandboxError(f"{host.name}: {err}; see {host.dir / 'console.log'}") from None
    _trust_host_key(host)
    return proc.pid


def _trust_host_key(host: SandboxHost) -> None:
    key = (host.root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
    lines = [line for line in _known_lines() if not line.startswith(host.address + " ")]
    lines.append(f"{host.address} {' '.join(key)}")
    known_hosts().write_text("\n".join(lines) + "\n")


def _known_lines() -> list[str]:
    return known_hosts().read_text().splitlines() if known_hosts().exists() else []


def close_ssh_master(host: SandboxHost) -> None:
    """End Ansible's ssh master to this address; it would outlive the host."""
    sh("ssh", "-o", f"ControlPath={control_path()}", "-O", "exit", f"root@{host.address}", check=False, timeout=10)


def ssh_masters() -> list[int]:
    """ssh masters on this sandbox's control sockets (ssh titles a master `ssh: <socket> [mux]`), whatever
    address they serve."""
    prefix = f"ssh: {STATE / 'ssh' / 'cm-'}"
    return sorted(pid for pid, (_, argv) in processes().items() if argv[0].startswith(prefix))


def stop_containers(pids: list[int]) -> None:
    """SIGTERM first: nspawn shuts the container's systemd down cleanly (under 2 s here)."""
    if left := end_processes(pids, grace_s=20):
        raise SandboxError(f"nspawn pids {left} survived SIGKILL")


def cgroup_dirs() -> list[Path]:
    """This sandbox's cgroup directories, one per host and hierarchy, by exact name (others' never match)."""
    return sorted(
        directory
        for root in CGROUP_ROOTS
        if root.is_dir()
        for directory in root.iterdir()
        if CGROUP_NAME.fullmatch(directory.name) and directory.is_dir()
    )


def cgroup_pids(directory: Path) -> list[int]:
    """Every process in the cgroup or below it."""
    pids: set[int] = set()
    for procs in directory.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids.update(int(pid) for pid in procs.read_text().split())
    return sorted(pids)


def remove_cgroup(directory: Path, deadline_s: float = 15) -> None:
    """Kill what is still in it (container stragglers, anything moved in), then remove it bottom-up. rmdir
    answers EBUSY while a process is in it, and for a moment after the last one died, so it is retried."""
    end = time.monotonic() + deadline_s
    while True:
        if pids := cgroup_pids(directory):
            warn(f"ending processes {pids}, left in {directory} after its container stopped")
            end_processes(pids, grace_s=2)
        try:
            for sub in sorted(directory.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if sub.is_dir():
                    with contextlib.suppress(FileNotFoundError):
                        sub.rmdir()
            with contextlib.suppress(FileNotFoundError):
                directory.rmdir()
            return
        except OSError as err:
            if err.errno != errno.EBUSY or time.monotonic() > end:
                raise SandboxError(f"stays busy (pids {cgroup_pids(directory)})") from None
        time.sleep(0.1)


def ssh_command(host: SandboxHost) -> list[str]:
    return [
        "ssh", "-i", str(key_file()), "-o", f"UserKnownHostsFile={known_hosts()}", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", f"root@{host.address}",
    ]  # fmt: skip


def system_state(host: SandboxHost) -> str:
    proc = subprocess.run(
        [*ssh_command(host), "systemctl is-system-running --wait"], capture_output=True, text=True, timeout=60
    )
    return proc.stdout.strip() or f"unreachable ({proc.stderr.strip()[:80]})"


def require_state_dir() -> None:
    if os.geteuid() != 0:
        raise SandboxError("the sandbox needs root (network namespaces, mounts, systemd-nspawn)")
    STATE.mkdir(parents=True, exist_ok=True)
