"""The `provision` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from provision import __version__, overrides
from provision.errors import InputError, ProvisionError, one_line
from provision.files import write_atomic

if TYPE_CHECKING:
    from provision.inventory import Inventory
    from provision.plan import Plan

STATE_ROOT = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "dflash-provision"
DEFAULT_STATE = STATE_ROOT / "runs"


class _Console(Console):
    def on_broken_pipe(self) -> None:  # rich's hook (its default exits 1): one handler for every closed pipe, main's
        raise BrokenPipeError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        self.exit(2, f"provision: error: {message} (see `{self.prog} --help`)\n")


def _inventory_arg(value: str) -> Path:
    if not value.strip():  # Path("") is the current directory: never an inventory by accident
        raise argparse.ArgumentTypeError("is empty; name an inventory directory or file")
    return Path(value)


def _common(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--host", required=True, help="an inventory host or group")
    where = sub.add_mutually_exclusive_group()
    where.add_argument(
        "--inventory",
        type=_inventory_arg,
        help="inventory directory or file (default: $PROVISION_INVENTORY, else ./inventory)",
    )
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
    parser.add_argument("--debug", action="store_true", help="print the traceback of an internal error")
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

    verify = subs.add_parser("verify", help="testinfra checks of GPUs, kernel JIT and the service on each host")
    _common(verify)
    verify.add_argument("--out", type=Path, default=Path("verify-report"), help="where the JUnit and JSON reports go")

    discover = subs.add_parser("discover", help="read a host's GPUs and compare them with the inventory's profile")
    _common(discover)

    reconf = subs.add_parser("reconfigure", help="switch the serving config safely (lock, drain, ready, roll back)")
    _common(reconf)
    reconf.add_argument(
        "--allow-untrained-depth", action="store_true", help="allow a block size above the drafter's trained one"
    )
    reconf.add_argument("--serial", type=int, help="roll through the hosts N at a time (default: all at once)")

    status = subs.add_parser("status", help="the service's state, serving and last good config, acceptance, GPU memory")
    _common(status)

    sweep = subs.add_parser("sweep", help="benchmark each config of a matrix on one host; report the table")
    _common(sweep)
    sweep.add_argument(
        "--matrix", type=Path, required=True, help="configs and grid (sweeps/seed.yml, sweeps/quick.yml)"
    )
    sweep.add_argument("--out", type=Path, required=True, help="results.jsonl and the report go here")
    sweep.add_argument("--resume", action="store_true", help="skip the cells recorded in --out; redo none")
    sweep.add_argument("--keep", choices=["start", "best"], default="start", help="the config left serving")

    logs = subs.add_parser("logs", help="the service's journal")
    _common(logs)
    logs.add_argument("-n", type=int, default=100, help="lines (default 100)")
    logs.add_argument("--follow", action="store_true")

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
    if args.inventory is not None:
        return args.inventory
    named = os.environ.get("PROVISION_INVENTORY")
    if named is None:
        return Path("inventory")
    if not named.strip():
        raise InputError("PROVISION_INVENTORY", "", "is empty; unset it or name an inventory directory or file")
    return Path(named)


def _inventory(args: argparse.Namespace) -> Inventory:
    from provision.inventory import Inventory  # Ansible is slow to import: only when needed

    return Inventory(_inventory_path(args))


def _plans(args: argparse.Namespace) -> list[Plan]:
    return _inventory(args).plans(args.host, overrides.split_set(args.set_))


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


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    from provision.verify.run import verify

    return verify(_plans(args), _inventory_path(args), args.out, console)


def cmd_discover(args: argparse.Namespace, console: Console) -> int:
    from provision.discover import discover

    return max(discover(plan, _inventory_path(args), console) for plan in _plans(args))


def cmd_reconfigure(args: argparse.Namespace, console: Console) -> int:
    from provision.reconfigure import reconfigure

    if args.serial is not None and args.serial < 1:
        raise InputError("--serial", str(args.serial), "must be 1 or more")
    cli_set = overrides.split_set(args.set_)
    return reconfigure(_inventory(args), args.host, cli_set, args.allow_untrained_depth, args.serial, console)


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    from provision.reconfigure import status

    return status(_inventory(args), args.host, console)


def cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    from provision.sweep import sweep

    if args.set_:
        raise InputError("--set", "", "a sweep takes its settings from --matrix; put them in the matrix's configs")
    return sweep(_inventory(args), args.host, args.matrix, args.out, args.resume, args.keep, console)


def cmd_logs(args: argparse.Namespace, console: Console) -> int:
    from provision.reconfigure import logs

    return logs(_inventory(args), args.host, args.n, args.follow)


def cmd_sandbox(args: argparse.Namespace, console: Console) -> int:
    from provision.sandbox import manage

    if args.verb == "up":
        types = manage.parse_types(args.hosts)
        with console.status("bringing up sandbox hosts (the first run builds the Debian base tree)"):
            hosts = manage.up(types)
        for host in hosts:
            console.print(f"{host.name} ({host.type}) at {host.address}: running", highlight=False, markup=False)
        console.print(f"inventory: {manage.inventory_dir()}", highlight=False, markup=False)
    elif args.verb == "down":
        manage.down()
        console.print("sandbox down: no hosts, mounts, namespaces, cgroups or bridge left")
    elif args.verb == "status":
        rows = manage.status()
        for host, state in rows:
            console.print(f"{host.name} ({host.type}) {host.address}: {state}", highlight=False, markup=False)
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


def _crash_report(err: BaseException) -> str:
    """Where the traceback went (or why it could not be written), for the one-line internal error."""
    path = STATE_ROOT / f"crash-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, "".join(traceback.format_exception(err)))
    except OSError as write_err:
        return f"the traceback could not be written ({one_line(str(write_err))}); rerun with --debug to print it"
    return f"traceback written to {path}; rerun with --debug to print it"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = _Console()
    commands = {
        "plan": cmd_plan,
        "apply": cmd_apply,
        "verify": cmd_verify,
        "discover": cmd_discover,
        "reconfigure": cmd_reconfigure,
        "status": cmd_status,
        "logs": cmd_logs,
        "sweep": cmd_sweep,
        "sandbox": cmd_sandbox,
    }
    try:
        rc = commands[args.command](args, console)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return rc
    except BrokenPipeError:
        # The reader went away (`| head`): end quietly as a SIGPIPE'd tool would (128 + 13), and point stdout at
        # /dev/null so the interpreter's final flush cannot raise again (Python's documented recipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except ProvisionError as err:
        print(f"provision: {err.label}: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("provision: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # the last resort: one line and a crash file, never a bare traceback
        if args.debug:
            traceback.print_exc()
        else:
            where = _crash_report(err)
            print(f"provision: internal error: {type(err).__name__}: {one_line(str(err))} ({where})", file=sys.stderr)
        return 1
