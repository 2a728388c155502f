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
        # json's ASCII escapes: a bidi or zero-width character of a value shows as \uXXXX, as every control does
        if len(plans) == 1:
            print(json.dumps(plans[0].model_dump(mode="json"), indent=2))
        else:
            hosts = {p.host: p.model_dump(mode="json") for p in plans}
            print(json.dumps({"target": args.host, "hosts": hosts}, indent=2))
        return 0
    for plan in plans:
        print_plan(plan, console)
    return 0
