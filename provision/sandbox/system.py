"""Running the host's own tools (ip, mount, debootstrap, ...) with errors that say what failed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from provision.errors import SandboxError


def sh(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SandboxError(f"`{' '.join(args)}` failed (rc {proc.returncode}): {' / '.join(detail)}")
    return proc


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def terminate(pid: int, grace_s: float) -> None:
    """SIGTERM, then SIGKILL after the grace time; reap it if it is our child."""
    if pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while pid_alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def wait_port(address: str, port: int, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while True:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > end:
                raise SandboxError(f"nothing listens on {address}:{port} after {deadline_s:.0f} s") from None
            time.sleep(0.1)


def mounted(path: str) -> bool:
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == path for line in mounts)
