"""`provision plan`: resolve, validate and show what a host gets."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from provision.cli import targets


def run(args: argparse.Namespace, console: Console) -> int:
    from provision.cli.show import print_plan

    plans = targets.plans(args)
    if args.json:
        if len(plans) == 1:
            print(plans[0].model_dump_json(indent=2))
        else:
            print(
                json.dumps({"target": args.host, "hosts": {p.host: p.model_dump(mode="json") for p in plans}}, indent=2)
            )
        return 0
    for plan in plans:
        print_plan(plan, console)
    return 0
