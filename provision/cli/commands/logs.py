"""`provision logs`: the service's journal."""

from __future__ import annotations

import argparse

from rich.console import Console

from provision.cli import targets


def run(args: argparse.Namespace, console: Console) -> int:
    from provision.remote.reconfigure import logs

    return logs(targets.inventory(args), args.host, args.n, args.follow)
