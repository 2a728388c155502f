"""Booting, stopping and reaching one test host (systemd-nspawn on an overlay of the base tree)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from provision.errors import SandboxError
from provision.sandbox.layout import STATE, SandboxHost, base_dir, control_path, key_file, known_hosts
from provision.sandbox.system import mounted, pid_alive, sh, terminate, wait_port

CGROUP_ROOTS = [Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified")]


def running(host: SandboxHost) -> int | None:
    """The nspawn pid when the host runs."""
    if host.pid_file.exists():
        pid = int(host.pid_file.read_text())
        if pid_alive(pid):
            return pid
    return None


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
    host.pid_file.write_text(str(proc.pid))
    wait_port(host.address, 22, 60)
    _trust_host_key(host)
    return proc.pid


def _trust_host_key(host: SandboxHost) -> None:
    key = (host.root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
    lines = [line for line in _known_lines() if not line.startswith(host.address + " ")]
    lines.append(f"{host.address} {' '.join(key)}")
    known_hosts().write_text("\n".join(lines) + "\n")


def _known_lines() -> list[str]:
    return known_hosts().read_text().splitlines() if known_hosts().exists() else []


def stop(host: SandboxHost) -> None:
    pid = running(host)
    # end Ansible's ssh master to this address; it would outlive the host
    sh("ssh", "-o", f"ControlPath={control_path()}", "-O", "exit", f"root@{host.address}", check=False)
    if pid:
        terminate(pid, grace_s=20)  # SIGTERM: nspawn shuts the container's systemd down cleanly
    if mounted(str(host.root)):
        sh("umount", str(host.root))
    for directory in _cgroup_dirs(host):
        if directory.exists():
            for child in sorted(directory.rglob("*"), reverse=True):
                if child.is_dir():
                    child.rmdir()
            directory.rmdir()
    host.pid_file.unlink(missing_ok=True)
    _forget_host_key(host)


def _forget_host_key(host: SandboxHost) -> None:
    if known_hosts().exists():
        lines = [line for line in _known_lines() if not line.startswith(host.address + " ")]
        known_hosts().write_text("\n".join(lines) + ("\n" if lines else ""))


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
