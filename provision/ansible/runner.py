"""`provision apply`: the host type's playbook through ansible-runner, with live per-task progress."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import ansible.constants as C
import ansible_runner
from rich.console import Console
from rich.text import Text

from provision import paths
from provision.ansible.handoff import APPLY_PLANS_ENV, CLI_SET_VAR
from provision.errors import one_line
from provision.files import file_name, write_atomic
from provision.planning.types import Plan

DEBUG_ACTIONS = ("debug", "ansible.builtin.debug")
STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "bold red", "unreachable": "bold red", "skipped": "cyan"}


def playbook_for(groups_by_host: dict[str, list[str]]) -> Path:
    """The one host-type playbook every targeted host belongs to, else site.yml (all types)."""
    types = {g for groups in groups_by_host.values() for g in groups if (paths.playbooks() / f"{g}.yml").is_file()}
    return paths.playbooks() / (f"{types.pop()}.yml" if len(types) == 1 else "site.yml")


class Progress:
    """ansible-runner event handler: one line per task and per host result. Names and messages are one_line'd: a
    host, task or message brings no newline, control or bidi character to the terminal."""

    def __init__(self, console: Console) -> None:
        self.console = console
        # each host's last resolved plan: the play resolves again for the host's own systemd, and the roles
        # act on that one
        self.resolved: dict[str, dict[str, Any]] = {}

    def __call__(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        if kind == "playbook_on_play_start":
            self.console.print(Text("PLAY ", style="bold").append(one_line(str(data.get("name", ""))), style=""))
        elif kind == "playbook_on_task_start":
            self.console.print(Text("  TASK ", style="bold").append(one_line(str(data.get("task", ""))), style=""))
        elif kind.startswith("runner_on_") and kind != "runner_on_start":
            res = data.get("res", {})
            if kind == "runner_on_ok" and "dflash_plan" in res.get("ansible_facts", {}):
                self.resolved[data.get("host", "")] = res["ansible_facts"]["dflash_plan"]
            status = {
                "runner_on_ok": "changed" if res.get("changed") else "ok",
                "runner_on_failed": "ignored" if data.get("ignore_errors") else "failed",
                "runner_on_unreachable": "unreachable",
                "runner_on_skipped": "skipped",
            }.get(kind)
            if status:
                line = (
                    Text("    ")
                    .append(status, style=STATUS_STYLE.get(status, "white"))
                    .append(f": {one_line(str(data.get('host', '')))}")
                )
                if status in ("failed", "unreachable") and res.get("msg"):
                    line.append(f" - {one_line(str(res['msg']))}")  # text as Ansible wrote it: never markup
                self.console.print(line, highlight=False, soft_wrap=True)
                if status == "ok" and data.get("task_action") in DEBUG_ACTIONS and res.get("msg"):
                    # what a role reports on purpose, like why a check was skipped
                    for text in res["msg"] if isinstance(res["msg"], list) else [res["msg"]]:
                        self.console.print(
                            f"      {one_line(str(text))}", highlight=False, soft_wrap=True, markup=False
                        )
        return True


def record_plans(plans: list[Plan], run_dir: Path, resolved: dict[str, dict[str, Any]] | None = None) -> None:
    """What was decided for each host, next to ansible-runner's artifacts of the same run: plans/HOST.json (the host
    name made a safe file name, files.file_name), the CLI's plan before the run (the play takes it from there:
    provision.ansible.handoff), then the one the play resolved last for the host (rendered for its own systemd),
    which the roles applied."""
    plan_dir = run_dir / "plans"
    plan_dir.mkdir(parents=True, exist_ok=True)
    for plan in plans:
        played = (resolved or {}).get(plan.host)
        text = json.dumps(played, indent=2) if played is not None else plan.model_dump_json(indent=2)
        write_atomic(plan_dir / f"{file_name(plan.host)}.json", text + "\n")


def runner_env(plans_dir: Path | None = None) -> dict[str, str]:
    """The environment ansible-playbook runs in under ansible-runner: the shipped ansible.cfg, this environment's
    ansible-playbook first, the host key check as Ansible resolves it for that configuration (ansible-runner
    turns the check off where the environment does not name it), and where the plans apply validated are (else
    empty, whatever this environment says: the play resolves them itself)."""
    return {
        "ANSIBLE_CONFIG": str(paths.ansible_config()),
        # this environment's ansible-playbook first, whatever PATH says
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_HOST_KEY_CHECKING": str(bool(C.HOST_KEY_CHECKING)),
        APPLY_PLANS_ENV: str(plans_dir.resolve()) if plans_dir else "",
    }


def run_playbook(
    plans: list[Plan],
    playbook: Path,
    inventory: Path,
    limit: str,
    cli_set: dict[str, str],
    extravars: dict[str, Any],
    check: bool,
    diff: bool,
    tags: str | None,
    state_dir: Path,
    console: Console,
) -> int:
    run_dir = state_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    record_plans(plans, run_dir)
    cmdline = ["--limit", limit]
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    if tags:
        cmdline += ["--tags", tags]
    shown = playbook.relative_to(paths.data_dir())
    console.print(f"playbook {shown}, inventory {inventory}, run record {run_dir}", style="dim", markup=False)
    progress = Progress(console)
    runner = ansible_runner.run(
        private_data_dir=str(run_dir),
        project_dir=str(paths.data_dir()),
        playbook=str(playbook.relative_to(paths.data_dir())),
        inventory=str(inventory.resolve()),
        extravars={**extravars, CLI_SET_VAR: cli_set},
        cmdline=shlex.join(cmdline),
        # the play takes the plans recorded above, unless extra vars reach it that the CLI's resolution did not see
        envvars=runner_env(None if extravars else run_dir / "plans"),
        event_handler=progress,
        quiet=True,
    )
    record_plans(plans, run_dir, progress.resolved)
    print_recap(runner.stats or {}, console)
    if runner.rc != 0 and not runner.stats:
        console.print(f"[bold red]ansible-playbook failed (rc {runner.rc}):[/]")
        console.print(runner.stdout.read()[-4000:], highlight=False, markup=False)
    return int(runner.rc or 0)


def print_recap(stats: dict[str, dict[str, int]], console: Console) -> None:
    hosts = sorted({h for counts in stats.values() if isinstance(counts, dict) for h in counts})
    if not hosts:
        return
    console.print("[bold]PLAY RECAP[/]")
    # ansible-runner's stats keys, in the order and with the names of Ansible's own recap line.
    columns = [
        ("ok", "ok"),
        ("changed", "changed"),
        ("unreachable", "dark"),
        ("failed", "failures"),
        ("skipped", "skipped"),
        ("rescued", "rescued"),
        ("ignored", "ignored"),
    ]
    for host in hosts:
        counts = " ".join(f"{name}={stats.get(key, {}).get(host, 0)}" for name, key in columns)
        console.print(f"{one_line(host)} : {counts}", highlight=False, soft_wrap=True, markup=False)
