"""`provision sweep`: benchmark each config of a matrix on one host."""

from __future__ import annotations

import argparse

from rich.console import Console

from provision.cli import targets
from provision.errors import InputError


def run(args: argparse.Namespace, console: Console) -> int:
    from provision.sweep.run import sweep

    if args.set_:
        raise InputError("--set", "", "a sweep takes its settings from --matrix; put them in the matrix's configs")
    return sweep(targets.inventory(args), args.host, args.matrix, args.out, args.resume, args.keep, console)
