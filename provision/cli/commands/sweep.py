"""`provision sweep`: benchmark each config of a matrix on one host."""

from __future__ import annotations

import argparse

from rich.console import Console

from provision.cli import targets


def run(args: argparse.Namespace, console: Console) -> int:
    from provision.sweep.run import sweep

    return sweep(targets.inventory(args), args.host, args.matrix, args.out, args.resume, args.keep, console)
