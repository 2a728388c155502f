"""`provision discover`: read a host's GPUs and compare them with the inventory's profile."""

from __future__ import annotations

import argparse

from rich.console import Console

from provision.cli import targets


def run(args: argparse.Namespace, console: Console) -> int:
    from provision.remote.discover import discover

    return max(discover(plan, targets.inventory_path(args), console) for plan in targets.plans(args))
