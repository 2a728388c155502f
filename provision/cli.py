"""The `provision` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.console import Console

from provision import __version__, overrides
from provision.errors import InputError
from provision.sandbox.system import SandboxError

DEFAULT_INVENTORY = Path(os.environ.get("PROVISION_INVENTORY", "inventory"))
DEFAULT_STATE = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "dflash-provision" / "runs"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        self.exit(2, f"provision: error: {message} (see `{self.prog} --help`)\n")


def _common(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--host", required=True, help="an inventory host or group")
    where = sub.add_mutually_exclusive_group()
    where.add_argument("--inventory", type=Path, default=DEFAULT_INVENTORY, help="inventory directory or file")
    where.add_argument("--sandbox", action="store_true", help="target the local sandbox hosts' inventory")
    sub.add_argument(
        "--set",
        dest="set_",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one value of the resolved config for this run, e.g. serve.block_size=4 (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="provision", description="Provision SGLang DFlash / DDTree serving on Blackwell boxes.")
    parser.add_argument("--version", action="version", version=f"dflash-provision {__version__}")
    subs = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = subs.add_parser("plan", help="resolve, validate and show what a host gets")
    _common(plan)
    plan.add_argument("--json", action="store_true", help="print one JSON object")

    apply = subs.add_parser("apply", help="run the host type's playbook")
    _common(apply)
    apply.add_argument("--check", action="store_true", help="dry run: report what would change")
    apply.add_argument("--diff", action="store_true", help="show file differences")
    apply.add_argument("--tags", help="only tasks with these tags (comma separated)")
    apply.add_argument("--limit", help="further limit the hosts (Ansible pattern)")
    apply.add_argument("-e", "--extra-vars", action="append", default=[], metavar="K=V", help="extra variable")
    apply.add_argument("--state-dir", type=Path, default=DEFAULT_STATE, help="where run records are kept")

    sandbox = subs.add_parser("sandbox", help="local test hosts (systemd-nspawn), for tests and trials")
    verbs = sandbox.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    sb_up = verbs.add_parser("up", help="bring up one host per type (keeps running ones)")
    sb_up.add_argument("--hosts", default="rtx6000,b300", help="host types, comma separated, each optionally :N")
    verbs.add_parser("down", help="stop the hosts and remove everything the sandbox made")
    verbs.add_parser("status", help="each host's state")
    sb_exec = verbs.add_parser("exec", help="run a command in a sandbox host; its exit code is passed through")
    sb_exec.add_argument("name", metavar="HOST")
    sb_exec.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD")
    return parser


def _inventory_path(args: argparse.Namespace) -> Path:
    if args.sandbox:
        from provision.sandbox.manage import inventory_for_cli

        return inventory_for_cli()
    return args.inventory


def _plans(args: argparse.Namespace) -> list:
    from provision.inventory import Inventory  # Ansible is slow to import: only when needed

    inventory = Inventory(_inventory_path(args))
    return inventory.plans(args.host, overrides.split_set(args.set_))


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    from provision.show import print_plan

    plans = _plans(args)
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


def cmd_apply(args: argparse.Namespace, console: Console) -> int:
    from provision.apply import playbook_for, run_playbook

    extravars = {}
    for item in args.extra_vars:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError("-e", item, "expected K=V")
        extravars[key] = value
    plans = _plans(args)  # bad input stops here, before Ansible touches any host
    playbook = playbook_for({p.host: p.groups for p in plans})
    limit = args.host if not args.limit else f"{args.host}:&{args.limit}"
    return run_playbook(
        plans,
        playbook,
        _inventory_path(args),
        limit,
        overrides.split_set(args.set_),
        extravars,
        check=args.check,
        diff=args.diff,
        tags=args.tags,
        state_dir=args.state_dir,
        console=console,
    )


def cmd_sandbox(args: argparse.Namespace, console: Console) -> int:
    from provision.sandbox import manage

    if args.verb == "up":
        types = manage.parse_types(args.hosts)
        with console.status("bringing up sandbox hosts (the first run builds the Debian base tree)"):
            hosts = manage.up(types)
        for host in hosts:
            console.print(f"{host.name} ({host.type}) at {host.address}: running", highlight=False)
        console.print(f"inventory: {manage.inventory_dir()}", highlight=False)
    elif args.verb == "down":
        manage.down()
        console.print("sandbox down: no hosts, mounts, namespaces, cgroups or bridge left")
    elif args.verb == "status":
        rows = manage.status()
        for host, state in rows:
            console.print(f"{host.name} ({host.type}) {host.address}: {state}", highlight=False)
        if not rows:
            console.print("no sandbox hosts")
    else:
        command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not command:
            raise InputError(
                "exec", args.name, "give a command after --, like: provision sandbox exec b300 -- uname -a"
            )
        return manage.exec_in(args.name, command)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console()
    commands = {"plan": cmd_plan, "apply": cmd_apply, "sandbox": cmd_sandbox}
    try:
        return commands[args.command](args, console)
    except InputError as err:
        print(f"provision: error: {err}", file=sys.stderr)
        return 2
    except SandboxError as err:
        print(f"provision: sandbox: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("provision: interrupted", file=sys.stderr)
        return 130
