# Owner, group and mode of the files and directories the roles manage, as one string the roles'
# `when:` compares with what they declare ("root:root:0644"), so a drift in any of the three is seen
# by the same read-only probe that already compares content.

from __future__ import annotations

import grp
import hashlib
import os
import pwd
from collections.abc import Callable


def _name(lookup: Callable[[int], tuple], ident: int) -> str:
    try:
        return lookup(ident)[0]
    except KeyError:  # an id with no name (chown 4242) is drift too: report the number
        return str(ident)


def path_state(path: str) -> str:
    """Owner, group and mode as "owner:group:mode" (like root:root:0644), links followed; empty when missing."""
    try:
        info = os.stat(path)
    except OSError:
        return ""
    return f"{_name(pwd.getpwuid, info.st_uid)}:{_name(grp.getgrgid, info.st_gid)}:{info.st_mode & 0o7777:04o}"


def dir_state(path: str) -> str:
    """path_state of a directory; empty when the path is missing or not a directory."""
    return path_state(path) if os.path.isdir(path) else ""


def file_state(path: str) -> str:
    """path_state of a regular file; empty when the path is missing or not a regular file."""
    return path_state(path) if os.path.isfile(path) else ""


def sha1(path: str) -> str:
    """SHA-1 of a regular file's content; empty when the path is missing or not a regular file."""
    if not os.path.isfile(path):
        return ""
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def report(files: list[str] = (), dirs: list[str] = (), paths: list[str] = ()) -> dict[str, dict[str, str]]:
    """What the probes return for managed paths: each file's SHA-1 and state, each directory's and path's state."""
    return {
        "file_sha1": {path: sha1(path) for path in files},
        "file_state": {path: file_state(path) for path in files},
        "dir_state": {path: dir_state(path) for path in dirs},
        "path_state": {path: path_state(path) for path in paths},
    }
