"""What an install into the service venv is made from, as the stamp python_env leaves in it.

python_env writes it after an install; the roles whose part includes an install (python_env, sglang,
flashinfer) compare it with the stamp the host probe read, so a settled host is known settled before
any of their tasks run. One function, so the writer and the readers can never disagree.
"""

from __future__ import annotations

import json
from typing import Any


def pip_indexes(index_url: str = "", extra_index_url: str = "") -> list[str]:
    """pip's index options: the plan's index, then the torch index as an extra one."""
    return ([f"--index-url={index_url}"] if index_url else []) + (
        [f"--extra-index-url={extra_index_url}"] if extra_index_url else []
    )


def install_stamp(requirements: list[str], deps: Any, index_url: str = "", extra_index_url: str = "") -> str:
    return json.dumps(
        {"requirements": list(requirements), "deps": deps, "indexes": pip_indexes(index_url, extra_index_url)}
    )


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"install_stamp": install_stamp, "pip_indexes": pip_indexes}
