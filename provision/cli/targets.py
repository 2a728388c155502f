"""Which inventory and hosts a command targets: --inventory, --sandbox or $PROVISION_INVENTORY."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provision.errors import InputError
from provision.model import overrides

if TYPE_CHECKING:
    from provision.inventory.reader import Inventory
    from provision.planning.types import Plan


def inventory_path(args: argparse.Namespace) -> Path:
    if args.sandbox:
        from provision.sandbox.manage import inventory_for_cli

        return inventory_for_cli()
    if args.inventory is not None:
        return args.inventory
    named = os.environ.get("PROVISION_INVENTORY")
    if named is None:
        return Path("inventory")
    if not named.strip():
        raise InputError("PROVISION_INVENTORY", "", "is empty; unset it or name an inventory directory or file")
    return Path(named)


def inventory(args: argparse.Namespace) -> Inventory:
    from provision.inventory.reader import Inventory  # Ansible is slow to import: only when needed

    return Inventory(inventory_path(args))


def cli_set(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """`--set` as typed overrides (read once, here) and the text as given, for messages."""
    text = overrides.split_set(args.set_)
    return overrides.parse_set(text), text


def plans(args: argparse.Namespace) -> list[Plan]:
    return inventory(args).plans(args.host, *cli_set(args))
