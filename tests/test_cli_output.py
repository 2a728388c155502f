"""What the CLI prints: values exactly as typed, one line per failure, a quiet end on a closed pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from provision import cli
from provision.cli import targets
from provision.errors import InputError, ProvisionError, SandboxError
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
    hosts = inventory / "hosts.yml"
    hosts.write_text(hosts.read_text() + "    '[/x]fast[bold]':\n      hosts:\n        b300-test:\n")
    rc, out, err = run("plan", "--host", "b300-test", "--inventory", str(inventory))
    assert rc == 0, err
    assert "b300-test ([/x]fast[bold], b300)" in out


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
