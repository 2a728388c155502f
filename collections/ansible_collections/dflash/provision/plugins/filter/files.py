"""Which of the files a role writes the host probe saw otherwise: content, owner, group or mode.

One comparison for the roles that declare their files as data ({path, mode, sha1}, owned by root), so that the
list is read once per decision: a Jinja expression that names it twice templates it twice, and the roles'
file lists hold whole rendered units.
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


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"drifted": drifted}
