"""Plain ansible-playbook and `provision apply` resolve through the same models as `provision plan`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from provision.ansible.handoff import APPLY_PLANS_ENV
from tests.conftest import ROOT

BIN = Path(sys.executable).parent
ENV = {
    **os.environ,
    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
}


def ansible_playbook(
    *args: str, callback: str = "default", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ansible-playbook"), *args],
        cwd=ROOT,
        env={
            **ENV,
            "ANSIBLE_STDOUT_CALLBACK": callback,
            "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
            "ANSIBLE_NOCOLOR": "1",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )


def facts_from_minimal(stdout: str) -> dict[str, dict]:
    """dflash_plan per host, from the minimal callback's `HOST | SUCCESS => {json}` lines."""
    decoder, plans, pos = json.JSONDecoder(), {}, 0
    while (pos := stdout.find(" | SUCCESS => ", pos)) != -1:
        host = stdout[stdout.rfind("\n", 0, pos) + 1 : pos]
        result, end = decoder.raw_decode(stdout, pos + len(" | SUCCESS => "))
        if "dflash_plan" in result.get("ansible_facts", {}):
            plans[host] = result["ansible_facts"]["dflash_plan"]
        pos = end
    return plans


@pytest.mark.parametrize("playbook", ["site.yml", "rtx6000.yml", "b300.yml"])
def test_syntax_check(playbook: str) -> None:
    proc = ansible_playbook("--syntax-check", f"playbooks/{playbook}")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_plain_ansible_playbook_sees_the_cli_plan(inventory: Path, plan_json) -> None:
    proc = ansible_playbook("-i", str(inventory), "playbooks/site.yml", "--tags", "plan", callback="minimal")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    facts = facts_from_minimal(proc.stdout)
    assert set(facts) == {"rtx-test", "b300-test"}
    for host, fact in facts.items():
        assert fact == plan_json("--host", host, "--inventory", str(inventory))


def test_plain_ansible_playbook_refuses_bad_input_before_any_change(inventory: Path) -> None:
    (inventory / "group_vars" / "b300.yml").write_text(
        (inventory / "group_vars" / "b300.yml").read_text().replace("  ep: 1\n", "  ep: 3\n")
    )
    proc = ansible_playbook("-i", str(inventory), "playbooks/site.yml", "--tags", "plan")
    assert proc.returncode != 0
    assert (
        "group_vars/b300.yml:" in proc.stdout and "dflash_serve.ep: must be 1 or equal to tp (8), got 3" in proc.stdout
    )
    assert "Show the toolkit" not in proc.stdout.split("deployment of b300")[-1]


def test_apply_check_reports_the_recap(inventory: Path, tmp_path: Path, run) -> None:
    state = tmp_path / "state"
    rc, out, err = run(
        "apply",
        "--host",
        "all",
        "--inventory",
        str(inventory),
        "--check",
        "--diff",
        "--tags",
        "plan",
        "--state-dir",
        str(state),
    )
    assert rc == 0, out + err
    assert "TASK Resolve and validate the deployment through provision's models" in out
    for host in ("rtx-test", "b300-test"):
        assert re.search(
            rf"^{host} : ok=\d+ changed=0 unreachable=0 failed=0 skipped=\d+ rescued=0 ignored=0$", out, re.M
        )
    (run_dir,) = state.iterdir()
    recorded = json.loads((run_dir / "plans" / "b300-test.json").read_text())
    assert recorded["host"] == "b300-test" and recorded["gpu"]["arch"] == "10.3"


def test_apply_passes_set_and_fails_with_the_playbook(inventory: Path, tmp_path: Path, run) -> None:
    # --set reaches the playbook's own resolution
    rc, out, _ = run(
        "apply", "--host", "b300", "--inventory", str(inventory), "--state-dir", str(tmp_path / "a"),
        "--set", "serve.port=31000", "--tags", "plan",
    )  # fmt: skip
    assert rc == 0
    (run_dir,) = (tmp_path / "a").iterdir()
    resolved = [
        event["event_data"]["res"]["ansible_facts"]["dflash_plan"]
        for path in run_dir.glob("artifacts/*/job_events/*.json")
        if (event := json.loads(path.read_text())).get("event") == "runner_on_ok"
        and "dflash_plan" in event["event_data"]["res"].get("ansible_facts", {})
    ]
    assert len(resolved) == 1 and "--port" in resolved[0]["argv"]
    assert resolved[0]["argv"][resolved[0]["argv"].index("--port") + 1] == "31000"
    # an extra var the playbook cannot accept: Ansible fails the host and apply's exit code says so
    rc, out, _ = run(
        "apply", "--host", "b300", "--inventory", str(inventory), "--state-dir", str(tmp_path / "b"),
        "-e", "dflash_set=notamapping", "--tags", "plan",
    )  # fmt: skip
    assert rc != 0
    assert "dflash_set: must be a mapping" in out
    assert "b300-test : ok=1 changed=0 unreachable=0 failed=1" in out


def test_the_play_takes_the_plans_apply_validated_from_the_environment_only(
    inventory: Path, tmp_path: Path, plan_json
) -> None:
    """The play takes a host's plan from the directory the control node's environment names (apply's run record),
    as it is: a plan no inventory resolves to is what the play shows. Empty or unset, the play resolves itself; a
    host that directory has no plan for, or a file that is not that host's plan, is refused by name."""
    plans = tmp_path / "plans"
    plans.mkdir()
    handed = plan_json("--host", "b300-test", "--inventory", str(inventory))
    handed["argv"] = [*handed["argv"], "--handed-over"]
    (plans / "b300-test.json").write_text(json.dumps(handed))
    playbook = ("-i", str(inventory), "playbooks/site.yml", "--tags", "plan")

    proc = ansible_playbook(*playbook, "--limit", "b300-test", callback="minimal", env={APPLY_PLANS_ENV: str(plans)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert facts_from_minimal(proc.stdout) == {"b300-test": handed}
    assert "1 plan(s) as provision apply checked them" in proc.stdout

    proc = ansible_playbook(*playbook, "--limit", "b300-test", callback="minimal", env={APPLY_PLANS_ENV: ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--handed-over" not in facts_from_minimal(proc.stdout)["b300-test"]["argv"]
    assert "1 plan(s) agree across hosts" in proc.stdout

    proc = ansible_playbook(*playbook, "--limit", "rtx-test", env={APPLY_PLANS_ENV: str(plans)})
    assert proc.returncode != 0
    assert f"provision apply planned no host 'rtx-test' for this run (no {plans / 'rtx-test.json'})" in proc.stdout

    (plans / "rtx-test.json").write_text(json.dumps(handed))  # b300-test's plan under rtx-test's name
    proc = ansible_playbook(*playbook, "--limit", "rtx-test", env={APPLY_PLANS_ENV: str(plans)})
    assert proc.returncode != 0
    assert f"{plans / 'rtx-test.json'} is not the plan provision apply recorded for 'rtx-test'" in proc.stdout

    # the run that recorded them has ended (ansible-runner wrote its exit code beside them): refused, never applied
    (tmp_path / "artifacts" / "ident").mkdir(parents=True)
    (tmp_path / "artifacts" / "ident" / "rc").write_text("0")
    proc = ansible_playbook(*playbook, "--limit", "b300-test", env={APPLY_PLANS_ENV: str(plans)})
    assert proc.returncode != 0
    assert f"{APPLY_PLANS_ENV} names the plans of a provision apply run that has ended ({plans})" in proc.stdout


def test_apply_hands_over_its_plans_unless_extra_vars_reach_the_play(inventory: Path, tmp_path: Path, run) -> None:
    """Without -e the play takes the plans apply validated and recorded (the rules across hosts checked by apply);
    an extra var could change what the play resolves, unseen by apply's own resolution, so with one the play
    resolves every plan itself, whatever the environment apply was started in says."""

    def fleet_message(state: Path) -> str:
        (run_dir,) = state.iterdir()
        return next(
            event["event_data"]["res"]["msg"]
            for path in run_dir.glob("artifacts/*/job_events/*.json")
            if (event := json.loads(path.read_text())).get("event") == "runner_on_ok"
            and event["event_data"].get("task_action") == "dflash.provision.fleet"
        )

    target = ("apply", "--host", "all", "--inventory", str(inventory), "--tags", "plan")
    rc, out, _ = run(*target, "--state-dir", str(tmp_path / "a"))
    assert rc == 0, out
    assert fleet_message(tmp_path / "a") == "2 plan(s) as provision apply checked them"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(APPLY_PLANS_ENV, str(tmp_path / "a"))  # never passed on when the play must resolve itself
        rc, out, _ = run(*target, "--state-dir", str(tmp_path / "b"), "-e", "unrelated=1")
    assert rc == 0, out
    assert fleet_message(tmp_path / "b") == "2 plan(s) agree across hosts"


def test_apply_picks_the_host_types_playbook(inventory: Path, tmp_path: Path, run) -> None:
    rc, out, _ = run(
        "apply", "--host", "rtx-test", "--inventory", str(inventory), "--state-dir", str(tmp_path), "--tags", "plan"
    )
    assert rc == 0 and "playbook playbooks/rtx6000.yml" in out and "b300-test :" not in out


def test_apply_keeps_host_keys_checked_under_ansible_runner(tmp_path: Path) -> None:
    """ansible-runner turns ANSIBLE_HOST_KEY_CHECKING off where the environment does not name it; apply passes the
    value Ansible resolves from the shipped ansible.cfg (on), so a host with an unknown or changed key is refused as
    under plain ansible-playbook. Checked in ansible-runner's own prepared environment, in a fresh process."""
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "site.yml").write_text("[]\n")
    code = (
        "import provision.inventory.reader\n"
        "from ansible_runner.config.runner import RunnerConfig\n"
        "from provision.ansible.runner import runner_env\n"
        f"config = RunnerConfig(private_data_dir={str(tmp_path)!r}, playbook='site.yml', envvars=runner_env())\n"
        "config.prepare()\n"
        "print(config.env['ANSIBLE_HOST_KEY_CHECKING'])\n"
    )
    env = {k: v for k, v in ENV.items() if k not in ("ANSIBLE_HOST_KEY_CHECKING", "ANSIBLE_CONFIG")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


@pytest.mark.parametrize(
    "selection",
    [("--skip-tags", "driver"), ("--skip-tags", "cuda,service"), ("--tags", "models"), ("--tags", "plan,tagged")],
)
def test_the_play_looks_first_whatever_roles_the_tags_select(inventory: Path, selection: tuple[str, str]) -> None:
    # the test hosts are unreachable: the first task that reaches one says which step comes first
    proc = ansible_playbook("-i", str(inventory), "playbooks/site.yml", *selection)
    assert proc.returncode != 0
    first = proc.stdout.index("UNREACHABLE!")
    task = proc.stdout[proc.stdout.rindex("TASK [", 0, first) : first]
    assert task.startswith("TASK [Look at the whole host at once"), proc.stdout[-3000:]


def test_the_play_steps_around_the_roles_are_tagged_for_every_selection() -> None:
    # the look, the claim and the record are listed whichever roles run (they are skipped where none does)
    listed = ansible_playbook("playbooks/b300.yml", "--list-tasks", "--skip-tags", "driver,flashinfer").stdout
    for step in ("Look at the whole host at once", "Claim what apply is about to create", "Record what apply created"):
        assert step in listed


def test_the_tag_selection_is_ansibles_own() -> None:
    sys.path.insert(0, str(ROOT / "collections"))
    from ansible_collections.dflash.provision.plugins.filter.tags import selected  # noqa: PLC0415

    roles = ["driver", "cuda", "service"]
    assert selected(roles, ["all"], []) == roles
    assert selected(roles, ["all"], ["driver"]) == ["cuda", "service"]
    assert selected(roles, ["plan"], []) == []
    assert selected(roles, ["plan", "cuda"], ["service"]) == ["cuda"]
    assert selected(roles, ["tagged"], ["cuda"]) == ["driver", "service"]
    assert selected(roles, ["all"], ["all"]) == []


# the roles that end at once on the play's answer (`__<role>_todo`, vars/main.yml)
LOOKING_ROLES = sorted(p.parts[-3] for p in (ROOT / "roles").glob("*/vars/main.yml") if "_todo:" in p.read_text())


def test_a_roles_cheap_check_templates_its_own_comparison_only_where_it_is_used(tmp_path: Path) -> None:
    """Ansible templates every variable a template names, in the branch not taken too: `__<role>_todo` reads the
    play's answer where the play's look gave one, and templates the role's own comparison (`__<role>_differs`,
    up to 0.1 s) only where not (a role run alone, or one that looked again). Here the comparison leaves a mark
    each time it is templated."""
    plays = []
    for role in LOOKING_ROLES:
        # an empty list, as a converged comparison is
        mark = f"{{{{ [lookup('ansible.builtin.pipe', 'echo x >> {tmp_path}/' ~ todo_mark)] | select | list }}}}"
        # the play's answer for the role; the play's answer without it (the role looked again); none (run alone)
        looks = {"answered": {"dflash_look_differs": {role: []}}, "own": {"dflash_look_differs": {}}, "alone": {}}
        plays.append({
            "name": role, "hosts": "localhost", "connection": "local", "gather_facts": False,
            "vars_files": [str(ROOT / "roles" / role / "vars" / "main.yml")],
            "tasks": [{"name": look, "ansible.builtin.debug": {"msg": f"{{{{ __{role}_todo }}}}"},
                       # the driver's own answer is its refusals and its comparison: none refused here
                       "vars": {**given, f"__{role}_differs": mark, f"__{role}_refusals": [],
                                "todo_mark": f"{role}-{look}"}}
                      for look, given in looks.items()],
        })  # fmt: skip
    playbook = tmp_path / "todo.yml"
    playbook.write_text(json.dumps(plays))
    proc = ansible_playbook("-i", "localhost,", str(playbook))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert LOOKING_ROLES, "no role ends on the play's answer"
    for role in LOOKING_ROLES:
        assert not (tmp_path / f"{role}-answered").exists(), f"{role}: the comparison templated beside the answer"
        assert (tmp_path / f"{role}-own").read_text() == "x\n", role
        assert (tmp_path / f"{role}-alone").read_text() == "x\n", role
