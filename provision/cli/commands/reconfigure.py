"""`provision reconfigure`: switch the serving config safely (lock, drain, ready, roll back)."""

from __future__ import annotations

import argparse

from rich.console import Console

from provision.cli import targets
from provision.errors import InputError


def run(args: argparse.Namespace, console: Console) -> int:
    from provision.remote.reconfigure import reconfigure

    if args.serial is not None and args.serial < 1:
        raise InputError("--serial", str(args.serial), "must be 1 or more")
    cli_set, cli_text = targets.cli_set(args)
    return reconfigure(
        targets.inventory(args),
        args.host,
        cli_set,
        cli_text,
        args.allow_untrained_depth,
        args.serial,
        console,
        args.force,
    )
