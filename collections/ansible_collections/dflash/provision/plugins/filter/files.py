"""What a role's files and writes mean for the play's look at the host.

drifted: which of the files a role writes the host probe saw otherwise (content, owner, group or mode): one
comparison for the roles that declare their files as data ({path, mode, sha1}, owned by root), so that the
list is read once per decision (a Jinja expression that names it twice templates it twice, and the roles'
file lists hold whole rendered units).

reaches: whether what a role is about to write can change what a role after it in the play looked at, so that
those roles look at the host again only where the earlier look no longer holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def drifted(files: Sequence[Mapping[str, Any]], found: Mapping[str, Any]) -> list[str]:
    """The paths among files whose "owner:group:mode:SHA-1" on the host (found: a host probe check's result,
    with file_state and file_sha1) is not root's with the declared mode and content."""
    state, digest = found["file_state"], found["file_sha1"]
    return [
        f["path"]
        for f in files
        if f"{state.get(f['path'], '')}:{digest.get(f['path'], '')}" != f"root:root:{f['mode']}:{f['sha1']}"
    ]


def _paths(value: Any) -> list[str]:
    """Every absolute path in a check's argument (a string, or inside lists and mappings' values)."""
    if isinstance(value, str):
        return [value] if value.startswith("/") else []
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, Sequence):
        return [path for item in value for path in _paths(item)]
    return []


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def reaches(writes: Sequence[str], checks: Mapping[str, Any], order: Sequence[str], role: str) -> bool:
    """Whether any of writes (absolute paths a role is about to create or change; "/" for anything, e.g. packages)
    can change what a check of a role after `role` in `order` (the play's roles) looks at.

    A write reaches a looked-at path that is the same, lies under it, or holds it; a directory a check names
    under `dirs` is looked at for its own owner, group and mode only, so only a write of that very directory
    reaches it. Roles not in order (none ran before) count as after it."""
    later = list(order)[list(order).index(role) + 1 :] if role in order else [name for name in checks if name != role]
    for name in later:
        args = (checks.get(name) or {}).get("args") or {}
        for key, value in args.items():
            for path in _paths(value):
                for write in writes:
                    if write == path or (key != "dirs" and (_under(write, path) or _under(path, write))):
                        return True
    return False


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"drifted": drifted, "reaches": reaches}
