"""One `up` or `down` at a time per sandbox: an flock on a file in its state directory.

A second process waits for the first to finish rather than failing at once: `up` then finds the hosts running
and `down` finds nothing left, which is what either caller wanted. The wait is bounded by WAIT_S, longer than
the slowest honest holder (the first `up` builds the Debian base tree in one to two minutes), so that a stuck
holder is named instead of waited on forever. `status` and `exec` take no lock: they only read, and the pid
file repair they may do writes what /proc says, which any racing process would write too.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from provision.errors import BusyError
from provision.sandbox.layout import lock_file
from provision.sandbox.system import warn

WAIT_S = 600.0


def _holder() -> str:
    words = lock_file().read_text().split() if lock_file().exists() else []
    if len(words) == 2 and words[0].isdigit():
        return f"`provision sandbox {words[1]}` (pid {words[0]})"
    return "another process"


@contextmanager
def exclusive(verb: str) -> Iterator[None]:
    """Hold the sandbox's lock; the file says who holds it, for those who wait. The kernel drops the lock when
    the holder dies, so a crash never leaves it held (the file is never removed: that would race)."""
    lock_file().parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file(), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        end = time.monotonic() + WAIT_S
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > end:
                    raise BusyError(
                        f"{_holder()} has held {lock_file()} for more than {WAIT_S:.0f} s; gave up waiting"
                        " (if it is stuck, stop it, then run `provision sandbox down`)"
                    ) from None
                if not waited:
                    warn(f"waiting for {_holder()} to finish (at most {WAIT_S:.0f} s)")
                    waited = True
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {verb}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
