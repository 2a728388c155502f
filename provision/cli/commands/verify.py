"""`provision verify`: testinfra checks of GPUs, kernel JIT, the service and its sandbox."""

from __future__ import annotations

import argparse

from rich.console import Console

from provision.cli import targets


def run(args: argparse.Namespace, console: Console) -> int:
    from provision.verify.run import verify

    return verify(targets.plans(args), targets.inventory_path(args), args.out, console)
