"""`provision apply`: validate, then run the host type's playbook."""

from __future__ import annotations

import argparse

from rich.console import Console

from provision.cli import targets
from provision.errors import InputError


def run(args: argparse.Namespace, console: Console) -> int:
    from provision.ansible.runner import playbook_for, run_playbook

    extravars = {}
    for item in args.extra_vars:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError("-e", item, "expected K=V")
        extravars[key] = value
    cli_set, _ = targets.cli_set(args)
    plans = targets.plans(args)  # bad input stops here, before Ansible touches any host
    playbook = playbook_for({p.host: p.groups for p in plans})
    limit = args.host if not args.limit else f"{args.host}:&{args.limit}"
    return run_playbook(
        plans,
        playbook,
        targets.inventory_path(args),
        limit,
        cli_set,
        extravars,
        check=args.check,
        diff=args.diff,
        tags=args.tags,
        state_dir=args.state_dir,
        console=console,
    )
