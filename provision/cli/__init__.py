"""The `provision` command line: its parser, and main(), which dispatches to provision/cli/commands/VERB.py and turns
every failure into one line."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
from pathlib import Path

from rich.console import Console

from provision import __version__
from provision.errors import ProvisionError, one_line
from provision.files import write_atomic

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
    reconf.add_argument("--force", action="store_true", help="apply a config the acceptance watchdog rolled back")

    status = subs.add_parser("status", help="the service's state, serving and last good config, acceptance, GPU memory")
    _common(status)

    sweep = subs.add_parser("sweep", help="benchmark each config of a matrix on one host; report the table")
    _common(sweep)
    sweep.add_argument(
        "--matrix", type=Path, required=True, help="configs and grid (sweeps/seed.yml, sweeps/quick.yml)"
    )
    sweep.add_argument("--out", type=Path, required=True, help="results.jsonl and the report go here")
    sweep.add_argument("--resume", action="store_true", help="skip the cells recorded in --out; redo none")
    sweep.add_argument(
        "--keep", default="start", metavar="start|best:WORKLOAD",
        help="the config left serving: the one it started with, or the best for a workload of the grid "
        "(c1-short, c1-long, c32-short, c32-long on the seed's grid)",
    )  # fmt: skip

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
    try:
        # each verb's module is imported only when used: Ansible is slow to import
        rc = importlib.import_module(f"provision.cli.commands.{args.command}").run(args, console)
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
