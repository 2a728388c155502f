"""`provision reconfigure`, `status` and `logs`: day-2 work on the serving hosts.

The new config is validated by the models and by the installed build's own parser before any host
is touched; the switch itself runs on the host (roles/sglang_service/files/service_switch.py) under
a per-host lock, and rolls back to the last good config when the new one does not become ready.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from provision import paths
from provision.errors import ExitCode, InputError
from provision.inventory.reader import Inventory
from provision.model.deployment import Deployment
from provision.planning.types import Plan
from provision.remote.connection import Remote, for_host

UNTRAINED = "serve.allow_untrained_depth"

SWITCH = paths.role_file("sglang_service", "service_switch.py")
LOCKED = 3  # service_switch.py's exit code when another switch holds the host's lock
REFUSED = 4  # ... when the acceptance watchdog marked the config failed on the host (and no --force)


@dataclass
class Outcome:
    host: str
    code: int
    result: dict[str, Any]


def trained_block_size(remote: Remote, dep: Deployment) -> int | None:
    """The drafter's trained block size from its config.json on the host (model_store's drafter.json), if readable."""
    path = dep.service.drafter_json_path
    proc = remote.run(f"cat {shlex.quote(path)}", timeout=30)
    if proc.return_code != 0:
        return None
    record = json.loads(proc.stdout)
    return int(record["block_size"]) if record.get("source") == "config.json" else None


def systemd_version(remote: Remote) -> int | None:
    """The host's systemd, which the unit is rendered for (as `provision apply` does)."""
    proc = remote.run("systemctl --version", timeout=30)
    words = proc.stdout.split()
    return int(words[1]) if proc.return_code == 0 and len(words) > 1 and words[1].isdigit() else None


def check_applied(remote: Remote, plan: Plan) -> None:
    """The host runs what `provision apply` installs (the unit, its environment, the build's python and the
    parser check): day-2 work on a host never applied stops here, before anything on it changes."""
    needed = [plan.paths.unit, plan.paths.env_file, f"{plan.python_env.venv}/bin/python3", plan.paths.argcheck]
    probe = "; ".join(f"test -e {shlex.quote(path)} || echo {shlex.quote(path)}" for path in needed)
    proc = remote.run(probe, timeout=30)
    missing = proc.stdout.split()
    if proc.return_code != 0 or missing:
        what = ", ".join(missing) or f"the host did not answer ({proc.stderr.strip()[-200:]})"
        raise InputError(
            "--host", plan.host, f"is not provisioned: missing {what}; run `provision apply --host {plan.host}` first"
        )


def check_with_parser(remote: Remote, plan: Plan) -> None:
    python = f"{plan.python_env.venv}/bin/python3"
    words = [python, plan.paths.argcheck, json.dumps(plan.server_args)]
    proc = remote.run(shlex.join(words), timeout=120)
    if proc.return_code == 1:
        verdict = json.loads(proc.stdout.strip().splitlines()[-1])
        raise InputError("--set", "", f"the SGLang build on {plan.host} refuses the new command: {verdict['error']}")
    if proc.return_code != 0:
        raise InputError("", plan.host, f"cannot ask the installed SGLang's parser: {proc.stderr.strip()[-300:]}")


def plan_new(inventory: Inventory, target: str, cli_set: dict[str, Any], cli_text: dict[str, str],
             allow_untrained: bool, console: Console) -> list[tuple[Plan, Remote]]:  # fmt: skip
    """Each host's new plan, its block size judged against the drafter's own config.json where readable."""
    out = []
    # a permission, given as --allow-untrained-depth or as the setting (a sweep config's): applied per host
    # only where the block size needs it, since a setting without effect is refused
    allow_untrained = allow_untrained or str(cli_set.get(UNTRAINED, "")).lower() == "true"
    cli_set = {k: v for k, v in cli_set.items() if k != UNTRAINED}
    for host in inventory.hosts_for(target):
        remote = for_host(inventory, host)
        extra: dict[str, Any] = {}
        version = systemd_version(remote)
        if version is not None and "service.systemd_version" not in cli_set:
            extra["service.systemd_version"] = version
        # the drafter's place only, before its block size is known: the deployment, not yet the plan
        unchecked = {**cli_set, **extra, UNTRAINED: True}
        inventory_side = inventory.hostvars(host, unchecked).deployment()
        trained = trained_block_size(remote, inventory_side)
        claimed = inventory_side.drafter.block_size if inventory_side.drafter else None
        if trained is not None and claimed is not None and trained != claimed:
            console.print(f"{host}: the drafter's config.json says block size {trained} "
                          f"(the inventory says {claimed}); using {trained}")  # fmt: skip
        if trained is not None:
            extra["drafter.block_size"] = trained
        # --allow-untrained-depth is a permission: set only where the block size needs it (else it is inert)
        limit = trained or claimed
        if allow_untrained and limit and inventory_side.serve.speculative and inventory_side.serve.block_size > limit:
            extra[UNTRAINED] = True
        new = inventory.plans(host, {**cli_set, **extra}, cli_text)[0]
        if allow_untrained and new.config.drafter and new.config.serve.block_size > new.config.drafter.block_size:
            size, trained_at = new.config.serve.block_size, new.config.drafter.block_size
            console.print(f"[yellow]warning[/]: {host}: block size {size} asks for depths the drafter "
                          f"never trained on (it was trained at {trained_at})")  # fmt: skip
        out.append((new, remote))
    return out


def watchdog_paths(plan: Plan) -> dict[str, str]:
    """Where the sglang_service role keeps the acceptance watchdog's settings and state on the host."""
    return {"watchdog_settings_path": plan.paths.watchdog_settings, "watchdog_dir": plan.paths.watchdog_dir}


def host_script(remote: Remote, verb: str, job: dict[str, Any], timeout: float | None = None) -> tuple[int, Any]:
    """Run service_switch.py VERB on the host: (exit code, its JSON answer, or None when it gave none)."""
    payload = base64.b64encode(json.dumps(job).encode()).decode()
    proc = remote.run(f"python3 - {verb} {payload}", stdin=SWITCH.read_text(), timeout=timeout)
    try:
        return proc.return_code, json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return proc.return_code, {
            "status": "failed",
            "reason": f"the switch did not report: {proc.stderr.strip()[-500:]}",
        }


def refuse_failed(plan: Plan, remote: Remote) -> None:
    """A config the host's acceptance watchdog rolled back is not applied again without --force."""
    job = {"unit": plan.unit, "env": plan.env_file, "state_dir": plan.paths.serving_state}
    code, answer = host_script(remote, "check", job, timeout=60)
    failed = answer.get("failed") if code == 0 else None
    if failed:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(failed["at"]))
        raise InputError("--set", "", f"{plan.host}: the acceptance watchdog rolled this config back at {when} "
                         f"({failed['reason']}); allowed: another config, or --force to apply it anyway")  # fmt: skip


def switch(plan: Plan, remote: Remote, force: bool = False) -> Outcome:
    svc = plan.config.service
    job = {
        "name": svc.name, "unit": plan.unit, "env": plan.env_file,
        "unit_path": plan.paths.unit, "env_path": plan.paths.env_file,
        "state_dir": plan.paths.serving_state, "url": plan.service_url,
        "api_key_file": plan.config.serve.api_key_file, "start_timeout_s": svc.start_timeout_s,
        "stop_timeout_s": svc.stop_timeout_s, "gpu_release_timeout_s": 120, "journal_lines": 40,
        "config": plan.config.model_dump(mode="json"), "by": f"provision reconfigure, pid {os.getpid()}",
        # a switch that succeeds arms the host's acceptance watchdog for the new config
        "watchdog": plan.config.watchdog.model_dump(mode="json"), **watchdog_paths(plan), "force": force,
    }  # fmt: skip
    code, result = host_script(remote, "switch", job)
    return Outcome(plan.host, code, result)


def reconfigure(inventory: Inventory, target: str, cli_set: dict[str, Any], cli_text: dict[str, str],
                allow_untrained: bool, serial: int | None, console: Console, force: bool = False) -> int:  # fmt: skip
    if not cli_set:
        raise InputError("--set", "", "give at least one KEY=VALUE to change, like serve.ddtree.budget=12")
    hosts = plan_new(inventory, target, cli_set, cli_text, allow_untrained, console)
    for plan, remote in hosts:  # every host is judged before any is touched
        check_applied(remote, plan)
        check_with_parser(remote, plan)
        if not force:
            refuse_failed(plan, remote)
    batch = serial or len(hosts)
    outcomes: list[Outcome] = []
    for start in range(0, len(hosts), batch):
        group = hosts[start : start + batch]
        # a thread per host's Connection, as Fabric's ThreadingGroup does, which runs one command line on all
        # hosts: each host's switch carries its own plan
        with ThreadPoolExecutor(max_workers=len(group)) as pool:
            outcomes += list(pool.map(lambda pair: switch(*pair, force=force), group))
        if any(o.code != 0 for o in outcomes):
            break  # a failed batch stops the roll: the rest keep serving their config
    for outcome in outcomes:
        _report(outcome, console)
    if any(o.code == LOCKED for o in outcomes):
        return ExitCode.BUSY
    if any(o.code == REFUSED for o in outcomes):  # refused before anything changed on that host
        return ExitCode.BAD_INPUT
    return 0 if all(o.code == 0 for o in outcomes) and len(outcomes) == len(hosts) else 1


def _report(outcome: Outcome, console: Console) -> None:
    res = outcome.result
    if res.get("status") == "ok":
        t = res["timings"]
        console.print(f"{outcome.host}: [green]serving the new config[/] (stop {t['stop_s']} s, ready "
                      f"{t['start_to_ready_s']} s after start)")  # fmt: skip
    elif res.get("status") == "refused":
        console.print(f"{outcome.host}: [bold red]refused[/]: the acceptance watchdog rolled this config back "
                      f"({res['failed']['reason']}); --force applies it anyway")  # fmt: skip
    elif res.get("status") == "locked":
        console.print(f"{outcome.host}: [bold red]refused[/]: another reconfigure is running there ({res['holder']})")
    else:
        console.print(f"{outcome.host}: [bold red]the new config failed[/]: {res.get('reason')}")
        for line in res.get("journal", [])[-20:]:
            console.print(f"  | {line}", highlight=False, markup=False)
        if res.get("rolled_back"):
            verdict = "ready again" if res.get("rollback_ready") else f"NOT ready: {res.get('rollback_detail')}"
            console.print(f"{outcome.host}: rolled back to the last good config, {verdict}")


def status(inventory: Inventory, target: str, console: Console) -> int:
    code = 0
    for plan in inventory.plans(target, {}):
        remote = for_host(inventory, plan.host)
        svc = plan.config.service
        job = {"name": svc.name, "state_dir": plan.paths.serving_state, "api_key_file": plan.config.serve.api_key_file,
               "url": plan.service_url, **watchdog_paths(plan)}  # fmt: skip
        rc, st = host_script(remote, "status", job, timeout=60)
        if rc != 0:
            console.print(f"{plan.host}: cannot read the state: {st.get('reason')}")
            code = 1
            continue
        unit = st["unit"]
        console.print(f"[bold]{plan.host}[/] {svc.name}: {unit.get('ActiveState')}/{unit.get('SubState')} since "
                      f"{unit.get('ActiveEnterTimestamp')}, health {st['health']}"
                      f"{' (SGLang stand-in)' if st['standin'] else ''}")  # fmt: skip
        console.print(f"  acceptance length: {st['accept_length']}; GPU memory: {st['gpu_memory']}")
        for label in ("current", "last_good"):
            console.print(f"  {label}: {_summary(st[label])}")
        _report_watchdog(st.get("watchdog"), st.get("watchdog_record") or {}, console)
    return code


def _report_watchdog(state: dict[str, Any] | None, record: dict[str, Any], console: Console) -> None:
    """The acceptance watchdog's phase, its last windows, and the rollbacks it asked for on this host."""
    if state is None:
        console.print("  watchdog: no state yet (not installed, or not started)")
        return
    console.print(f"  watchdog: {state['phase']}; {state['failures']} consecutive failed window(s)", markup=False)
    for w in state["windows"][-5:]:
        at = time.strftime("%H:%M:%S", time.localtime(w["t"]))
        console.print(f"    {at} {w['verdict']}: {w['why']}", markup=False, highlight=False)
    for r in record.get("rollbacks", [])[-3:]:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["at"]))
        console.print(f"  watchdog rollback {at}: {r['status']} ({r['request']['reason']})", markup=False)
    for config, failed in record.get("failed", {}).items():
        console.print(f"  marked failed: {_summary(failed.get('config'))} (config {config}); reconfigure refuses it "
                      "without --force", markup=False)  # fmt: skip


def _summary(config: dict[str, Any] | None) -> str:
    if not config:
        return "unknown (not recorded on the host yet)"
    serve = config["serve"]
    parts = [serve["algorithm"], f"block {serve['block_size']}", f"window {serve['draft_window']}"]
    if serve["algorithm"] == "DDTREE":
        parts += [f"budget {serve['ddtree']['budget']}", f"topk {serve['ddtree']['topk']}"]
    return ", ".join(parts)


def logs(inventory: Inventory, target: str, lines: int, follow: bool) -> int:
    code = 0
    for plan in inventory.plans(target, {}):
        remote = for_host(inventory, plan.host)
        follow_flag = " -f" if follow else ""
        code |= remote.stream(
            f"journalctl -u {shlex.quote(plan.config.service.name)} -n {lines} --no-pager{follow_flag}", follow
        )
    return code
