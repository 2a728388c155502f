"""`provision status`: the service's state, serving and last good config."""

from __future__ import annotations

import argparse

from rich.console import Console

from provision.cli import targets


def run(args: argparse.Namespace, console: Console) -> int:
    from provision.remote.reconfigure import status

    return status(targets.inventory(args), args.host, console)
