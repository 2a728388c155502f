"""The `provision` command line: its parser, and main(), which dispatches to provision/cli/commands/VERB.py and turns
every failure into one line and an exit code (provision.errors.ExitCode)."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console, ConsoleOptions, RenderableType, RenderHook, RenderResult
from rich.segment import Segment

from provision import __version__
from provision.errors import ExitCode, OutputError, ProvisionError, one_line
from provision.files import write_atomic

STATE_ROOT = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "dflash-provision"
DEFAULT_STATE = STATE_ROOT / "runs"


class _Escaped:
    """A renderable's segments with their text escaped by one_line (newlines kept); rich's own control codes (the
    cursor moves of a live status) pass as they are."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.renderable, options):
            yield segment if segment.control else Segment(one_line(segment.text, keep_newlines=True), segment.style)


class _EscapeAll(RenderHook):
    """Everything the console prints (plan tables, apply's progress, status, sweep and verify reports) reaches the
    terminal with no control or format character of a host, group, value or remote's reply left raw. Escaping after
    layout can widen a line: the plan table escapes its values itself, before layout; this catches the rest."""

    def process_renderables(self, renderables: list[Any]) -> list[Any]:
        return [_Escaped(renderable) for renderable in renderables]


class _Console(Console):
    def __init__(self) -> None:
        super().__init__()
        self.push_render_hook(_EscapeAll())

    def on_broken_pipe(self) -> None:  # rich's hook (its default exits 1): one handler for every closed pipe, main's
        raise BrokenPipeError


class _Stdout:
    """sys.stdout while a verb runs: a failed write or flush raises OutputError (main's handler reports it, exit 4);
    a closed pipe stays BrokenPipeError (141)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return _guarded(self._stream.write, text)

    def flush(self) -> None:
        _guarded(self._stream.flush)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ... as the stream's
        return getattr(self._stream, name)


def _guarded(call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except BrokenPipeError:
        raise
    except OSError as err:
        raise OutputError(err) from None


def _open_standard_streams() -> bool:
    """Point a closed fd 0, 1 or 2 at /dev/null and give Python a stream for it; whether stdout was open. Left closed,
    the next file opened takes the number, and what Ansible, a child or Python write to it lands in that file (and
    Ansible fails at import on a missing sys.stderr)."""
    stdout_open = sys.stdout is not None
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd itself, when the lower ones are open
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    sys.stdin = sys.stdin or open(0, closefd=False)  # noqa: SIM115 - the process's own stream, never closed
    sys.stdout = sys.stdout or open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = sys.stderr or open(2, "w", closefd=False)  # noqa: SIM115
    return stdout_open


def _say(line: str) -> None:
    """One line to stderr, if it can be written: a full or broken stderr leaves the exit code to tell."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        _say(f"provision: error: {one_line(message)} (see `{self.prog} --help`)")
        self.exit(ExitCode.BAD_INPUT)


def _inventory_arg(value: str) -> Path:
    if not value.strip():  # Path("") is the current directory: never an inventory by accident
        raise argparse.ArgumentTypeError("is empty; name an inventory directory or file")
    return Path(value)


def _common(sub: argparse.ArgumentParser, takes_set: bool = True) -> None:
    """--host and where the inventory is; --set only for the verbs that plan with it: a setting taken and then
    ignored is refused by argparse instead (exit 2)."""
    sub.add_argument("--host", required=True, help="an inventory host or group")
    where = sub.add_mutually_exclusive_group()
    where.add_argument(
        "--inventory",
        type=_inventory_arg,
        help="inventory directory or file (default: $PROVISION_INVENTORY, else ./inventory)",
    )
    where.add_argument("--sandbox", action="store_true", help="target the local sandbox hosts' inventory")
    if takes_set:
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
    _common(status, takes_set=False)

    sweep = subs.add_parser("sweep", help="benchmark each config of a matrix on one host; report the table")
    _common(sweep, takes_set=False)  # its settings are the matrix's configs
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
    _common(logs, takes_set=False)
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
    stdout_open = _open_standard_streams()
    # Ansible's debug lines go to stdout, into `plan --json`: off, before any verb imports Ansible (the environment
    # also reaches the ansible-playbook apply starts, whose output ansible-runner keeps).
    os.environ["ANSIBLE_DEBUG"] = "False"
    args = build_parser().parse_args(argv)
    console = _Console()
    stdout = sys.stdout
    sys.stdout = _Stdout(stdout)  # type: ignore[assignment]
    try:
        if not stdout_open:  # refused before anything is done: what it did could not be reported
            raise OutputError(OSError(errno.EBADF, "stdout is closed"))
        # each verb's module is imported only when used: Ansible is slow to import
        rc = importlib.import_module(f"provision.cli.commands.{args.command}").run(args, console)
        sys.stdout.flush()  # a closed pipe or a full disk shows here, inside the handlers, not at interpreter exit
        return rc
    except BrokenPipeError:
        # The reader went away (`| head`): end quietly as a SIGPIPE'd tool would, and point stdout at /dev/null so
        # the interpreter's final flush cannot raise again (Python's documented recipe).
        _discard_stdout(stdout)
        return ExitCode.CLOSED_PIPE
    except OutputError as err:
        _discard_stdout(stdout)
        _say(f"provision: {err.label}: {err}")
        return err.exit_code
    except ProvisionError as err:
        _say(f"provision: {err.label}: {err}")
        return err.exit_code
    except KeyboardInterrupt:
        _say("provision: interrupted")
        return ExitCode.INTERRUPTED
    except Exception as err:  # the last resort: one line and a crash file, never a bare traceback
        if args.debug:
            traceback.print_exc()
        else:
            where = _crash_report(err)
            _say(f"provision: internal error: {type(err).__name__}: {one_line(str(err))} ({where})")
        return ExitCode.FAILED
    finally:
        sys.stdout = stdout


def _discard_stdout(stdout: TextIO) -> None:
    """What stdout still buffers goes to /dev/null: the interpreter's final flush would fail again (exit 120)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
    except (OSError, ValueError):  # not a file (a test's capture): nothing is flushed to a descriptor at exit
        pass
