"""What an install into the service venv is made from, and whether the venv still holds it.

python_env writes the stamp after an install; the roles whose part includes an install (python_env, sglang,
flashinfer) compare it with the stamp the host probe read, and their requirements with what the probe
found installed (a package removed or replaced since is drift), so a settled host is known settled before
any of their tasks run. One function each, so the writer and the readers can never disagree.
"""

from __future__ import annotations

import json
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name


def pip_indexes(index_url: str = "", extra_index_url: str = "") -> list[str]:
    """pip's index options: the plan's index, then the torch index as an extra one."""
    return ([f"--index-url={index_url}"] if index_url else []) + (
        [f"--extra-index-url={extra_index_url}"] if extra_index_url else []
    )


def install_stamp(requirements: list[str], deps: Any, index_url: str = "", extra_index_url: str = "") -> str:
    return json.dumps(
        {"requirements": list(requirements), "deps": deps, "indexes": pip_indexes(index_url, extra_index_url)}
    )


def unmet(requirements: list[str], installed: dict[str, str]) -> list[str]:
    """The requirements the venv does not meet now (absent, or another version), as the host probe read it."""
    out = []
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            out.append(text)  # pip refuses it too: the install says why
            continue
        version = installed.get(canonicalize_name(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            out.append(text)
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"install_stamp": install_stamp, "pip_indexes": pip_indexes, "unmet": unmet}
