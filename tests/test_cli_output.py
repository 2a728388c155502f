"""What the CLI prints: values exactly as typed, one line per failure, a quiet end on a closed pipe."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from provision import cli
from provision.cli import targets
from provision.errors import BusyError, ExitCode, InputError, OutputError, ProvisionError, SandboxError, one_line
from provision.files import file_name
from tests.conftest import ROOT
from tests.test_bad_input import assert_refused

MARKUP = "[/x][bold]kimi:thumbs_up:[link=https://x.invalid]"


def test_markup_in_a_value_is_shown_as_typed(run, inventory: Path) -> None:
    rc, out, err = run(
        "plan", "--host", "b300-test", "--inventory", str(inventory), "--set", f"model.served_name={MARKUP}"
    )
    assert rc == 0, err
    assert MARKUP in out


def test_markup_in_a_group_name_is_shown_as_typed(run, inventory: Path) -> None:
    # no '/' (a group name is a file name under group_vars/): markup that opens, but never closes
    hosts = inventory / "hosts.yml"
    hosts.write_text(hosts.read_text() + "    '[x]fast[bold]:smile:':\n      hosts:\n        b300-test:\n")
    rc, out, err = run("plan", "--host", "b300-test", "--inventory", str(inventory))
    assert rc == 0, err
    assert "b300-test ([x]fast[bold]:smile:, b300)" in out


def _closed_pipe_run(*argv: str) -> tuple[int, str]:
    """The CLI writing into a pipe whose reader is gone (`| head -c 10` once head has exited)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "provision", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        os.close(write_end)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("json", [True, False], ids=["json", "human"])
def test_closed_pipe_ends_quietly(inventory: Path, json: bool) -> None:
    rc, err = _closed_pipe_run("plan", *(["--json"] if json else []), "--host", "all", "--inventory", str(inventory))
    assert rc == 141  # 128 + SIGPIPE, as a shell reports a tool that SIGPIPE ended
    assert err == ""


def test_head_of_json(inventory: Path) -> None:
    cmd = f"{sys.executable} -m provision plan --json --host all --inventory {inventory} | head -c 10"
    proc = subprocess.run(
        ["bash", "-c", cmd], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert proc.stdout.startswith("{")
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr


@pytest.fixture
def crash(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An unexpected exception deep in `plan`; the crash files go under tmp_path."""

    def broken(args: object) -> None:
        raise ValueError("boom\nsecond line")

    monkeypatch.setattr(targets, "plans", broken)
    monkeypatch.setattr(cli, "STATE_ROOT", tmp_path / "state")
    return tmp_path / "state"


def test_internal_error_is_one_line_and_a_crash_file(run, inventory: Path, crash: Path) -> None:
    rc, out, err = run("plan", "--host", "b300-test", "--inventory", str(inventory))
    assert rc == 1 and out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("provision: internal error: ValueError: boom\\nsecond line (traceback written to ")
    assert "rerun with --debug" in err
    [report] = crash.glob("crash-*.txt")
    assert str(report) in err
    assert "Traceback" in report.read_text() and "ValueError: boom" in report.read_text()
    assert report.stat().st_mode & 0o077 == 0


def test_debug_prints_the_traceback(run, inventory: Path, crash: Path) -> None:
    rc, out, err = run("--debug", "plan", "--host", "b300-test", "--inventory", str(inventory))
    assert rc == 1
    assert "Traceback (most recent call last)" in err and "ValueError: boom" in err
    assert not crash.exists()


def test_unwritable_state_dir_still_one_line(run, inventory: Path, crash: Path) -> None:
    crash.parent.mkdir(exist_ok=True)
    crash.write_text("a file where the state directory should be")
    rc, _, err = run("plan", "--host", "b300-test", "--inventory", str(inventory))
    assert rc == 1
    assert len(err.splitlines()) == 1 and "the traceback could not be written" in err


def test_an_error_is_one_line(run, inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(args: object) -> None:
        raise InputError("file\n.yml", "field\rname", "bad\x1b[31m\nvalue\u2028end")

    monkeypatch.setattr(targets, "plans", refuse)
    rc, out, err = run("plan", "--host", "b300-test", "--inventory", str(inventory))
    assert rc == 2 and out == ""
    assert err == "provision: error: file\\n.yml: field\\rname: bad\\x1b[31m\\nvalue\\u2028end\n"


def test_deeply_nested_set_is_one_line(run, inventory: Path) -> None:
    argv = ["plan", "--host", "b300-test", "--inventory", str(inventory), "--set", "serve.extra_args=" + "[" * 5000]
    assert_refused(*run(*argv), ["--set", "serve.extra_args", "nested too deeply"])


def test_one_error_hierarchy() -> None:
    from provision.sandbox.system import SandboxError as FromSystem

    assert FromSystem is SandboxError
    assert issubclass(InputError, ProvisionError) and issubclass(SandboxError, ProvisionError)
    assert (InputError.exit_code, SandboxError.exit_code) == (2, 1)
    assert str(SandboxError("`ip` failed:\nno such device")) == "`ip` failed:\\nno such device"


# What a hostile inventory or value may carry: escape sequences, C1 controls, bidi overrides and isolates,
# zero-width and line-separator characters. None may reach the terminal raw.
HOSTILE = "\x1bc\x9b2J\u202e\u2066\u200b\u200e\ufeff\u2028"
HOSTILE_SHOWN = "\\x1bc\\x9b2J\\u202e\\u2066\\u200b\\u200e\\ufeff\\u2028"


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if not c.isprintable() and c != "\n"]


def _hostile_inventory(inventory: Path) -> None:
    """A host and a group whose names carry HOSTILE, next to the inventory's b300-test."""
    hosts = inventory / "hosts.yml"
    name = json.dumps(f"evil{HOSTILE}")  # a YAML double-quoted key
    hosts.write_text(
        hosts.read_text().replace("        b300-test: null\n", f"        b300-test: null\n        {name}: null\n")
        + f"    {json.dumps('grp' + HOSTILE)}:\n      hosts:\n        b300-test:\n"
    )


def test_hostile_names_and_values_in_the_plan_are_escaped(run, inventory: Path) -> None:
    _hostile_inventory(inventory)
    bidi = "\u202e\u2066\u200b\u200e\ufeff"  # format characters: a value may hold them (controls are refused)
    rc, out, err = run("plan", "--host", "b300", "--inventory", str(inventory), "--set", f"model.served_name=x{bidi}")
    assert rc == 0, err
    assert _raw_controls(out) == []
    assert f"evil{HOSTILE_SHOWN}" in out and f"grp{HOSTILE_SHOWN}" in out
    # the launch command shows the value as bash's $'...', which reads back as the value itself
    assert "$'x\\U0000202e\\U00002066\\U0000200b\\U0000200e\\U0000feff'" in out


def test_a_refused_value_is_escaped_in_the_error(run, inventory: Path) -> None:
    rc, out, err = run(
        "plan", "--host", "b300-test", "--inventory", str(inventory), "--set", f"model.served_name={HOSTILE}"
    )
    assert rc == 2 and out == ""
    assert f"--set model.served_name={HOSTILE_SHOWN}: " in err and _raw_controls(err) == []


@pytest.mark.parametrize("target", [f"evil{HOSTILE}", "b300"], ids=["one-host", "group"])
def test_hostile_names_in_plan_json_are_escaped(run, inventory: Path, target: str) -> None:
    _hostile_inventory(inventory)
    rc, out, err = run("plan", "--json", "--host", target, "--inventory", str(inventory))
    assert rc == 0, err
    assert out.isascii()  # \uXXXX escapes: the same JSON, nothing raw for a terminal
    plan = json.loads(out) if target != "b300" else json.loads(out)["hosts"][f"evil{HOSTILE}"]
    assert plan["host"] == f"evil{HOSTILE}"


def test_hostile_host_in_an_error_is_escaped(run, inventory: Path) -> None:
    rc, out, err = run("plan", "--host", f"evil{HOSTILE}", "--inventory", str(inventory))
    assert rc == 2 and out == ""
    assert f"--host: evil{HOSTILE_SHOWN}: unknown host or group" in err
    assert _raw_controls(err) == []


def test_hostile_argument_in_a_usage_error_is_escaped(run) -> None:
    rc, out, err = run("plan", "--host", "x", f"--bogus{HOSTILE}")
    assert rc == 2 and out == ""
    assert HOSTILE_SHOWN in err and _raw_controls(err) == []


def test_apply_progress_escapes_names_and_messages() -> None:
    from provision.ansible.runner import Progress, print_recap

    console = Console(file=io.StringIO(), width=200)
    progress = Progress(console)
    events = [
        {"event": "playbook_on_play_start", "event_data": {"name": f"play{HOSTILE}"}},
        {"event": "playbook_on_task_start", "event_data": {"task": f"task{HOSTILE}"}},
        {"event": "runner_on_failed", "event_data": {"host": f"evil{HOSTILE}", "res": {"msg": f"bad\n{HOSTILE}"}}},
        {
            "event": "runner_on_ok",
            "event_data": {"host": "h", "task_action": "debug", "res": {"msg": [f"note{HOSTILE}"]}},
        },
    ]
    for event in events:
        progress(event)
    print_recap({"ok": {f"evil{HOSTILE}": 1}}, console)
    out = console.file.getvalue()
    assert _raw_controls(out) == []
    for shown in (
        f"play{HOSTILE_SHOWN}",
        f"task{HOSTILE_SHOWN}",
        f"failed: evil{HOSTILE_SHOWN} - bad\\n{HOSTILE_SHOWN}",
    ):
        assert shown in out
    assert f"note{HOSTILE_SHOWN}" in out and f"evil{HOSTILE_SHOWN} : ok=1" in out


def test_every_console_print_is_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    # the net under every verb's output (status, sweep, verify print what hosts reply): raw text, markup kept
    console = cli._Console()
    console.print(f"[bold]host[/]: reply{HOSTILE}\nnext line")
    out = capsys.readouterr().out
    assert out == f"host: reply{HOSTILE_SHOWN}\nnext line\n"


def test_one_line_escapes_format_and_control_characters() -> None:
    text = "a\tb\x00\x7f\x85\u200f\u202a\u2069\u2029\U000e0001\ud800 ok é ü 漢"
    assert one_line(text) == "a\\tb\\x00\\x7f\\x85\\u200f\\u202a\\u2069\\u2029\\U000e0001\\ud800 ok é ü 漢"
    assert one_line("a\nb\x1b", keep_newlines=True) == "a\nb\\x1b"


@pytest.mark.parametrize("host", ["../../x", "/etc/x", "a/b", "a\x00b", "a\nb", ".", "..", "%2F", "é" * 200])
def test_a_host_name_is_one_safe_file_name(tmp_path: Path, host: str) -> None:
    name = file_name(host)
    assert "/" not in name and not name.startswith(".") and name.isascii() and name.isprintable()
    assert len(name) <= 200
    (tmp_path / name).write_text(host)  # one file, in this directory
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_host_file_names_never_collide() -> None:
    hosts = ["a/b", "a%2Fb", "a%252Fb", "..", "%2E.", ".x", "%2Ex", "b300", "B300"]
    assert len({file_name(h) for h in hosts}) == len(hosts)


def test_run_record_plans_stay_in_the_run_directory(plan_json, inventory: Path, tmp_path: Path) -> None:
    from provision.ansible.runner import record_plans
    from provision.planning.types import Plan

    plan = Plan.model_validate(plan_json("--host", "b300-test", "--inventory", str(inventory)))
    hosts = ["../../x", "/etc/x", "a/b", "a\nb", "..", f"evil{HOSTILE}"]
    run_dir = tmp_path / "state" / "run"
    record_plans([plan.model_copy(update={"host": h}) for h in hosts], run_dir)
    written = sorted(p.relative_to(run_dir) for p in (tmp_path / "state").rglob("*") if p.is_file())
    assert [p.parent for p in written] == [Path("plans")] * len(hosts)
    assert sorted(json.loads((run_dir / p).read_text())["host"] for p in written) == sorted(hosts)


def _closed(fd: int) -> Callable[[], None]:
    return lambda: os.close(fd)


def test_closed_stdout_is_a_write_error(inventory: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "plan", "--json", "--host", "b300-test", "--inventory", str(inventory)],
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=_closed(1),
    )
    assert proc.returncode == ExitCode.WRITE_ERROR == 4
    assert proc.stderr == "provision: error: cannot write the output: stdout is closed\n"


@pytest.mark.parametrize("json_out", [True, False], ids=["json", "human"])
def test_full_disk_is_a_write_error(inventory: Path, json_out: bool) -> None:
    argv = ["plan", *(["--json"] if json_out else []), "--host", "all", "--inventory", str(inventory)]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "provision", *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    assert proc.returncode == 4
    assert proc.stderr == "provision: error: cannot write the output: No space left on device\n"


def test_closed_stderr_still_gives_the_output(inventory: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "plan", "--json", "--host", "b300-test", "--inventory", str(inventory)],
        stdout=subprocess.PIPE,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=_closed(2),
    )
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["host"] == "b300-test"


def test_bad_input_with_a_full_stderr_keeps_its_exit_code(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "provision", "plan", "--host", "x", "--inventory", str(tmp_path / "none")],
            stdout=subprocess.PIPE,
            stderr=full,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    assert proc.returncode == 2 and proc.stdout == b""


@pytest.mark.parametrize("env", [{"ANSIBLE_DEBUG": "1"}, {"ANSIBLE_DEBUG": "True", "ANSIBLE_VERBOSITY": "4"}])
def test_nothing_but_the_json_on_stdout(inventory: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "plan", "--json", "--host", "b300-test", "--inventory", str(inventory)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["host"] == "b300-test"


@pytest.mark.parametrize("verb", ["status", "logs", "sweep"])
def test_set_is_refused_where_it_would_be_ignored(run, verb: str) -> None:
    extra = ["--matrix", "m.yml", "--out", "o"] if verb == "sweep" else []
    rc, out, err = run(verb, "--host", "b300-test", "--set", "x=1", *extra)
    assert rc == 2 and out == ""
    assert "unrecognized arguments: --set x=1" in err


def test_exit_code_contract() -> None:
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 130, 141]
    assert (ProvisionError.exit_code, InputError.exit_code, BusyError.exit_code) == (1, 2, 3)
    assert OutputError(OSError(28, "No space left on device")).exit_code == 4
