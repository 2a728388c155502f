"""Where the tool's own files are, found in one place (as kolla-ansible's get_data_files_path does).

A wheel ships the checkout's playbooks/, roles/, collections/, inventory/ and ansible.cfg as package data
under provision/_data (pyproject.toml maps them there); a checkout (an editable install included) uses its
root. Python code that ships to hosts lives in the package itself (the SGLang stand-in, the sandbox's tiny
models, the verify scripts).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def data_dir() -> Path:
    shipped = PACKAGE / "_data"
    return shipped if (shipped / "playbooks").is_dir() else PACKAGE.parent


def playbooks() -> Path:
    return data_dir() / "playbooks"


def host_types(groups: Iterable[str]) -> list[str]:
    """A host's types among its groups: those with a playbook of their own (apply runs it)."""
    return sorted(g for g in groups if g != "all" and (playbooks() / f"{g}.yml").is_file())


def roles() -> Path:
    return data_dir() / "roles"


def ansible_config() -> Path:
    return data_dir() / "ansible.cfg"


def example_inventory() -> Path:
    """The production inventory's example (placeholder hosts) and the group_vars the sandbox links."""
    return data_dir() / "inventory"


def role_file(role: str, name: str) -> Path:
    """A host-side script a role ships (roles/ROLE/files/NAME), for day-2 work and verify to run too."""
    return roles() / role / "files" / name


def standin() -> Path:
    """The SGLang stand-in: a test double of the server for hosts without GPUs."""
    return PACKAGE / "sandbox" / "sglang_double.py"


def sandbox_models() -> Path:
    """Tiny well-formed model directories (config.json, index, safetensors shards) for the sandbox."""
    return PACKAGE / "sandbox" / "models"
