"""Files that are either wholly written or not at all, and file names made from names of the inventory."""

from __future__ import annotations

import hashlib
import os
import string
import tempfile
from pathlib import Path

# Kept as they are in a file name; every other byte of the name's UTF-8 is %XX, '%' included, so that two names
# never share a file name.
FILE_NAME_SAFE = frozenset((string.ascii_letters + string.digits + "_.-").encode())
MAX_FILE_NAME = 200  # of NAME_MAX's 255 bytes, room for a suffix and write_atomic's temporary prefix


def file_name(name: str) -> str:
    """A host (or other inventory) name as one file name of a directory on the control node: '/', '..', NUL,
    newlines, controls and a leading '.' cannot appear, so `../../x` or `/etc/x` stays inside the directory. A name
    too long for a file name keeps its start and gets the hash of the whole."""
    raw = name.encode("utf-8", "surrogatepass")  # a lone surrogate (YAML's "\ud800") too
    encoded = "".join(chr(b) if b in FILE_NAME_SAFE else f"%{b:02X}" for b in raw)
    if encoded.startswith("."):  # '.', '..' and hidden files
        encoded = "%2E" + encoded[1:]
    if len(encoded) > MAX_FILE_NAME:
        encoded = f"{encoded[: MAX_FILE_NAME - 65]}-{hashlib.sha256(raw).hexdigest()}"
    return encoded


def write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
