"""Running the host's own tools (ip, mount, debootstrap, ...) with errors that say what failed; finding and
ending processes by what /proc says they are, never by what a pid file claims."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from provision.errors import SandboxError, one_line


def sh(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SandboxError(f"`{' '.join(args)}` failed (rc {proc.returncode}): {' / '.join(detail)}")
    return proc


def warn(message: str) -> None:
    """Something was wrong and has been put right: said on stderr, in the CLI's one-line form."""
    sys.stderr.write(f"provision: sandbox: {one_line(message)}\n")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def cmdline(pid: int) -> list[str]:
    """A process's argv; [] when it is gone, a zombie or a kernel thread."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.rstrip(b"\0").split(b"\0")] if raw else []


def processes() -> dict[int, tuple[int, list[str]]]:
    """Every live user-space process: pid -> (parent pid, argv)."""
    table: dict[int, tuple[int, list[str]]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        argv = cmdline(int(entry.name))
        if fields and fields[0] != "Z" and argv:
            table[int(entry.name)] = (int(fields[1]), argv)
    return table


def end_processes(pids: Iterable[int], grace_s: float, kill_s: float = 5) -> list[int]:
    """SIGTERM, then SIGKILL to those still there after the grace time; reaps any that are our children.
    Returns the pids still alive kill_s after the SIGKILL (uninterruptible sleep, say)."""
    pending = set(pids)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_s)):
        for pid in pending:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        end = time.monotonic() + wait_s
        while True:
            for pid in pending:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            pending = {pid for pid in pending if pid_alive(pid)}
            if not pending or time.monotonic() > end:
                break
            time.sleep(0.05)
        if not pending:
            break
    return sorted(pending)


def wait_port(address: str, port: int, deadline_s: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Until something listens there; `alive` lets a caller stop waiting for a server that has already died."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            if not alive():
                raise SandboxError(f"the process that was to listen on {address}:{port} exited") from None
            if time.monotonic() > end:
                raise SandboxError(f"nothing listens on {address}:{port} after {deadline_s:.0f} s") from None
            time.sleep(0.1)


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below `path`, deepest first (the order to unmount them in)."""
    with open("/proc/self/mounts") as mounts:
        # the kernel writes space, tab, newline and backslash in a mount point as octal escapes
        points = [Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[1])) for line in mounts]
    return sorted({p for p in points if p.is_relative_to(path)}, key=lambda p: len(p.parts), reverse=True)


def mounted(path: str) -> bool:
    return Path(path) in mounts_under(Path(path))


def unmount_all(path: Path) -> None:
    """Every mount at or below `path`; one still busy is detached lazily (it goes when its last user does)."""
    for point in mounts_under(path):
        if sh("umount", str(point), check=False).returncode != 0:
            sh("umount", "--lazy", str(point))
