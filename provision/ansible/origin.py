"""Where Ansible loaded a value from: its data-tagging Origin, the one private Ansible API provision reads.

Kept here, in the Ansible adapter, so planning stays pure pydantic; without the API (another ansible-core), errors
name the inventory instead of file:line, and nothing else changes."""

from __future__ import annotations

import os
from typing import Any

try:
    from ansible._internal._datatag._tags import Origin
except ImportError:  # pragma: no cover - an ansible-core without 2.19's data tagging
    Origin = None  # type: ignore[assignment,misc]


def origin_path(value: Any) -> str | None:
    """The file Ansible loaded a value from, if it knows."""
    if Origin is None:
        return None
    tag = value if isinstance(value, Origin) else Origin.get_tag(value)
    return tag.path if tag is not None and tag.path else None


def origin_of(value: Any) -> str | None:
    """ "file:line" where Ansible loaded a value from (or of an Origin itself), if it knows."""
    if Origin is None:
        return None
    tag = value if isinstance(value, Origin) else Origin.get_tag(value)
    if tag is None or not tag.path:
        return None
    path = os.path.relpath(tag.path) if tag.path.startswith(os.getcwd() + os.sep) else tag.path
    return f"{path}:{tag.line_num}" if tag.line_num else path
