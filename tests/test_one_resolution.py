"""Plan equals play, differentially: for generated inventories (groups and children, group_vars and host_vars as
files and as directories, dotted names, templates, merge keys, dflash_set at several levels, ansible_host in
host_vars for multi-node addresses), `provision plan --json` equals what the play's `dflash.provision.resolve`
computes inside `ansible-playbook --check`, host by host."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from provision.cli import main
from tests.conftest import ROOT
from tests.test_ansible import ansible_playbook, facts_from_minimal

NAMES = st.sampled_from(["n1", "n2.example.invalid", "gpu-a", "b300-07.lab.invalid", "r_9"])
SERVED = st.sampled_from(["kimi", "{{ 'k' ~ 'imi' }}", "{{ inventory_hostname }}", "{{ group_names | join('-') }}",
                          "100%", "$HOME", "{{ site_suffix }}"])  # fmt: skip
PORTS = st.sampled_from([30000, 30001, "{{ 30000 + 7 }}"])
SET_VALUES = st.sampled_from([("serve.port", 31000), ("serve.ddtree.budget", 12), ("serve.draft_window", None),
                              ("model.served_name", "no"), ("serve.env.NCCL_DEBUG", "INFO")])  # fmt: skip


@st.composite
def inventories(draw: st.DrawFn) -> dict:
    """A description of an inventory: hosts per type, an extra child group, and where each variable lives."""
    names = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    types = {name: draw(st.sampled_from(["rtx6000", "b300"])) for name in names}
    return {
        "types": types,
        "extra_group": draw(st.booleans()),  # a child group of the type with its own group_vars
        "as_dir": draw(st.booleans()),  # group_vars/b300/ and host_vars/NAME/ as directories of files
        "merge": draw(st.booleans()),  # dflash_serve built with a YAML merge key that overrides one value
        "served": draw(SERVED),
        "port": draw(PORTS),
        "group_set": draw(st.lists(SET_VALUES, max_size=2, unique_by=lambda kv: kv[0])),
        "host_set": draw(st.lists(SET_VALUES, max_size=2, unique_by=lambda kv: kv[0])),
        "host_addr": draw(st.booleans()),  # ansible_host in host_vars/
        "multinode": draw(st.booleans()),
    }


def _write(path: Path, data: dict, merge_into: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(data, sort_keys=False)
    if merge_into:  # a merge key with an override, as a hand-written file would have it
        text = f"_serve_base: &base\n  port: 29999\n  block_size: 8\n{merge_into}:\n  <<: *base\n  port: 30005\n" + text
    path.write_text(text)


def build(desc: dict, inv: Path) -> None:
    shutil.copytree(ROOT / "inventory" / "group_vars", inv / "group_vars")
    by_type: dict[str, dict] = {"rtx6000": {"hosts": {}}, "b300": {"hosts": {}}}
    for name, kind in desc["types"].items():
        by_type[kind]["hosts"][name] = None
    if desc["extra_group"]:
        by_type["b300"]["children"] = {"b300_site": {"hosts": dict(by_type["b300"]["hosts"])}}
    hosts = {"all": {"vars": {"ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_connection": "ssh",
                              "site_suffix": "site-{{ 1 + 1 }}"},
                     "children": by_type}}  # fmt: skip
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    group_extra = {"dflash_set": {"model.served_name": desc["served"], **dict(desc["group_set"])}}
    if desc["extra_group"]:
        _write(inv / "group_vars" / "b300_site.yml", {"dflash_set": {"serve.port": desc["port"]}})
    target = inv / "group_vars" / "b300"
    if desc["as_dir"]:
        target.mkdir()
        (inv / "group_vars" / "b300.yml").rename(target / "main.yml")
        _write(target / "extra.yml", group_extra, merge_into=None)
    else:
        with (inv / "group_vars" / "b300.yml").open("a") as f:
            f.write(yaml.safe_dump(group_extra, sort_keys=False))
    if desc["merge"]:
        rtx = inv / "group_vars" / "rtx6000.yml"
        data = yaml.safe_load(rtx.read_text())
        serve = data.pop("dflash_serve")
        serve.pop("port", None)
        serve.pop("block_size", None)
        _write(rtx, data, merge_into=None)
        text = rtx.read_text()
        base = "_serve_base: &base\n  port: 29999\n  block_size: 8\n"
        body = "dflash_serve:\n  <<: *base\n  port: 30005\n" + "".join(
            f"  {line}\n" for line in yaml.safe_dump(serve, sort_keys=False).splitlines()
        )
        rtx.write_text(base + body + text)
    b300_hosts = [n for n, k in desc["types"].items() if k == "b300"]
    for i, name in enumerate(desc["types"]):
        host_vars: dict = {}
        if desc["host_addr"]:
            host_vars["ansible_host"] = f"127.0.0.{10 + i}"
        if desc["host_set"]:
            host_vars["dflash_set"] = dict(desc["host_set"])
        if desc["multinode"] and len(b300_hosts) > 1 and name in b300_hosts:
            host_vars["dflash_multinode"] = {"nodes": b300_hosts[:2]} if name in b300_hosts[:2] else None
            if host_vars["dflash_multinode"] is None:
                del host_vars["dflash_multinode"]
        if not host_vars:
            continue
        path = inv / "host_vars" / name / "vars.yml" if desc["as_dir"] else inv / "host_vars" / f"{name}.yml"
        _write(path, host_vars)


def cli_plans(inv: Path) -> tuple[int, dict[str, dict], str]:
    out_io, err_io = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out_io), contextlib.redirect_stderr(err_io):
        rc = main(["plan", "--json", "--host", "all", "--inventory", str(inv)])
    out, err = out_io.getvalue(), err_io.getvalue()
    if rc != 0:
        return rc, {}, err
    data = json.loads(out)
    return rc, (data["hosts"] if "hosts" in data else {data["host"]: data}), err


@settings(max_examples=int(os.environ.get("ONE_RESOLUTION_EXAMPLES", "8")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(desc=inventories())
@example(desc={"types": {"n2.example.invalid": "b300", "gpu-a": "b300"}, "extra_group": True, "as_dir": True,
               "merge": True, "served": "{{ 'k' ~ 'imi' }}", "port": "{{ 30000 + 7 }}",
               "group_set": [("model.served_name", "no")], "host_set": [("serve.port", 31000)],
               "host_addr": True, "multinode": True})  # fmt: skip
@example(desc={"types": {"b300-07.lab.invalid": "b300", "r_9": "rtx6000"}, "extra_group": False, "as_dir": False,
               "merge": True, "served": "{{ inventory_hostname }}", "port": 30000, "group_set": [],
               "host_set": [("serve.draft_window", None)], "host_addr": False, "multinode": False})  # fmt: skip
def test_plan_equals_the_play(desc: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "inventory"
        build(desc, inv)
        rc, plans, err = cli_plans(inv)
        proc = ansible_playbook("-i", str(inv), "playbooks/site.yml", "--tags", "plan", "--check",
                                callback="minimal")  # fmt: skip
        facts = facts_from_minimal(proc.stdout)
        if rc != 0:  # refused by plan: the play must not resolve a plan for every host either
            assert rc == 2 and "Traceback" not in err, err
            assert proc.returncode != 0, f"plan refused ({err.strip()}) but the play resolved {sorted(facts)}"
            return
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert set(facts) == set(plans)
        for host, plan in plans.items():
            assert facts[host] == plan, host


def test_an_ansible_cfg_of_the_user_changes_neither_plan_nor_apply(inventory: Path, tmp_path: Path) -> None:
    """plan resolves under the shipped ansible.cfg, as apply's ansible-playbook does: one in the working directory,
    in ~/.ansible.cfg or named by $ANSIBLE_CONFIG changes nothing (hash_behaviour=merge would merge a host's
    dflash_set into its group's)."""
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "b300-test.yml").write_text("dflash_set: {serve.port: 31001}\n")
    with (inventory / "group_vars" / "b300.yml").open("a") as f:
        f.write("dflash_set: {serve.ddtree.budget: 12}\n")
    cfg = "[defaults]\nhash_behaviour = merge\n"
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    (cwd / "ansible.cfg").write_text(cfg)
    (home / ".ansible.cfg").write_text(cfg)
    argv = [sys.executable, "-m", "provision", "plan", "--json", "--host", "b300-test", "--inventory", str(inventory)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    plain = subprocess.run(argv, capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert plain.returncode == 0, plain.stderr
    for extra, where in (({}, cwd), ({"HOME": str(home)}, tmp_path), ({"ANSIBLE_CONFIG": str(cwd / "ansible.cfg")},
                                                                     tmp_path)):  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT), **extra},
                              cwd=where)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == json.loads(plain.stdout)
    plan = json.loads(plain.stdout)["config"]
    assert plan["serve"]["port"] == 31001 and plan["serve"]["ddtree"]["budget"] == 8  # replace, not merge


# ---- the cases the review found, one by one


@pytest.mark.parametrize("text", ["030000", "8:20:00", "0x7530", "3_0000", "0b1000", "0o7530", "+30000", "30000.0"])
def test_set_numbers_are_read_by_yaml_1_2_not_converted(inventory: Path, run, text: str) -> None:
    """YAML 1.1 would read these as 12288, 30000, 30000, 30000, 8: none is a plain decimal integer."""
    rc, out, err = run("plan", "--host", "b300-test", "--inventory", str(inventory), "--set", f"serve.port={text}")
    assert rc == 2 and out == "" and f"--set serve.port={text}: serve.port:" in err and "integer" in err, err


@pytest.mark.parametrize("text", ["no", "yes", "on", "off", "True", "y"])
def test_set_booleans_are_true_or_false_only(inventory: Path, run, text: str) -> None:
    rc, _, err = run("plan", "--host", "b300-test", "--inventory", str(inventory), "--set", f"serve.metrics={text}")
    assert rc == 2 and "serve.metrics" in err and "boolean" in err, err


def test_dflash_set_values_are_read_once_by_yaml(inventory: Path, run, plan_json) -> None:
    """A dflash_set value is typed by the inventory's YAML: "no" stays text, "030000" is no number."""
    with (inventory / "group_vars" / "b300.yml").open("a") as f:
        f.write('dflash_set:\n  model.served_name: "no"\n  serve.ddtree.budget: 012\n')
    plan = plan_json("--host", "b300-test", "--inventory", str(inventory))
    assert plan["config"]["model"]["served_name"] == "no"
    assert plan["config"]["serve"]["ddtree"]["budget"] == 10  # Ansible's YAML 1.1, as the play reads it too
    with (inventory / "group_vars" / "b300.yml").open("a") as f:
        f.write('  serve.port: "030000"\n')
    rc, _, err = run("plan", "--host", "b300-test", "--inventory", str(inventory))
    assert rc == 2 and "b300.yml:" in err and "dflash_set[serve.port]" in err and "integer" in err, err


def test_group_vars_templates_are_rendered_as_the_play_renders_them(inventory: Path, plan_json) -> None:
    with (inventory / "group_vars" / "b300.yml").open("a") as f:
        f.write("dflash_set:\n  model.served_name: \"{{ 'kimi-' ~ inventory_hostname }}\"\n")
    plan = plan_json("--host", "b300-test", "--inventory", str(inventory))
    assert plan["config"]["model"]["served_name"] == "kimi-b300-test"


def test_multinode_addresses_come_from_host_vars(inventory: Path, plan_json) -> None:
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["b300"]["hosts"]["b300-two"] = None
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "b300-test.yml").write_text("ansible_host: \"{{ '10.77.0.' ~ 5 }}\"\n")
    with (inventory / "group_vars" / "b300.yml").open("a") as f:
        f.write("dflash_multinode: {nodes: [b300-test, b300-two]}\n")
    plan = plan_json("--host", "b300-two", "--inventory", str(inventory))
    assert plan["multinode"]["dist_init_addr"] == "10.77.0.5:50000"


def test_a_merge_key_override_is_yaml_not_a_duplicate(inventory: Path, run, plan_json) -> None:
    gv = inventory / "group_vars" / "rtx6000.yml"
    data = yaml.safe_load(gv.read_text())
    gpu = data.pop("dflash_gpu")
    text = "_gpu: &gpu\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in gpu.items())
    gv.write_text(text + "dflash_gpu:\n  <<: *gpu\n  memory_gb: 48\n" + yaml.safe_dump(data))
    assert plan_json("--host", "rtx-test", "--inventory", str(inventory))["gpu"]["memory_gb"] == 48
    gv.write_text(gv.read_text().replace("  memory_gb: 48\n", "  memory_gb: 48\n  memory_gb: 40\n"))
    rc, _, err = run("plan", "--host", "rtx-test", "--inventory", str(inventory))
    assert rc == 2 and "rtx6000.yml:" in err and "memory_gb: given twice" in err, err


def test_apply_hands_set_text_to_the_play_as_data_and_records_what_the_play_resolved(
    inventory: Path, tmp_path: Path, run, plan_json
) -> None:
    """`--set` text is never templated by the play (plan shows it as text), and the run record is the plan the
    play resolved."""
    sets = ("--set", "model.served_name={{ 7 * 7 }}", "--set", "serve.port=31000")
    shown = plan_json("--host", "b300-test", "--inventory", str(inventory), *sets)
    state = tmp_path / "state"
    rc, out, _ = run("apply", "--host", "b300-test", "--inventory", str(inventory), "--state-dir", str(state),
                     *sets, "--tags", "plan")  # fmt: skip
    assert rc == 0, out
    (run_dir,) = state.iterdir()
    resolved = [
        event["event_data"]["res"]["ansible_facts"]["dflash_plan"]
        for path in run_dir.glob("artifacts/*/job_events/*.json")
        if (event := json.loads(path.read_text())).get("event") == "runner_on_ok"
        and "dflash_plan" in event["event_data"]["res"].get("ansible_facts", {})
    ]
    assert resolved == [shown]
    assert shown["config"]["model"]["served_name"] == "{{ 7 * 7 }}"
    assert json.loads((run_dir / "plans" / "b300-test.json").read_text()) == shown


def test_the_rules_across_hosts_hold_for_plain_ansible_playbook_too(inventory: Path, run) -> None:
    """planning.check_fleet, which `provision plan` applies, runs in the play (dflash.provision.fleet): a host in
    two host types and a multi-node instance across host types stop plain ansible-playbook as well."""
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["rtx6000"]["hosts"]["b300-test"] = None
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    rc, _, err = run("plan", "--host", "all", "--inventory", str(inventory))
    assert rc == 2 and "host b300-test is in host types b300 and rtx6000" in err, err
    proc = ansible_playbook("-i", str(inventory), "playbooks/site.yml", "--tags", "plan", "--check")
    assert proc.returncode != 0 and "host b300-test is in host types b300 and rtx6000" in proc.stdout, proc.stdout


def test_a_multinode_instance_across_host_types_stops_the_play(inventory: Path, run) -> None:
    (inventory / "host_vars").mkdir()
    for host in ("rtx-test", "b300-test"):
        (inventory / "host_vars" / f"{host}.yml").write_text("dflash_multinode: {nodes: [rtx-test, b300-test]}\n")
    rc, _, err = run("plan", "--host", "all", "--inventory", str(inventory))
    assert rc == 2 and ("one instance spans one host type" in err or "differ" in err), err
    proc = ansible_playbook("-i", str(inventory), "playbooks/site.yml", "--tags", "plan", "--check")
    assert proc.returncode != 0 and ("one instance spans one host type" in proc.stdout or "differ" in proc.stdout)


def test_only_the_tools_own_playbooks_may_define_other_dflash_variables() -> None:
    """Where the deploy play resolves again, its own vars (dflash_differs, ...) are among the variables: the tool's
    playbooks define them. The same unknown name anywhere else, group_vars beside the playbooks included, is refused
    as the inventory's typo, never accepted and ignored."""
    from ansible._internal._datatag._tags import Origin

    from provision import paths
    from provision.errors import InputError
    from provision.planning.resolve import HostVars

    def names_checked(path: Path) -> None:
        raw = {"dflash_differs": Origin(path=str(path), line_num=3).tag("x")}
        HostVars("h", raw, lambda value: value, "inventory (host h)", inventory_dir="/nowhere").data()

    names_checked(paths.playbooks() / "deploy.yml")
    for elsewhere in (paths.playbooks() / "group_vars" / "all.yml", Path("/etc/ansible/group_vars/all.yml")):
        with pytest.raises(InputError, match="dflash_differs: unknown variable"):
            names_checked(elsewhere)


def test_the_roles_get_the_plans_values_as_facts_and_every_one_is_a_role_parameter(inventory: Path, plan_json) -> None:
    """The resolve step sets each role's parameters as the host's facts, read off the plan (role_vars): every name
    is a parameter of a role the deploy play runs (none a role would never read), every required parameter of
    those roles is among them, and the play sets exactly what role_vars gives for the plan `provision plan`
    prints."""
    from provision import paths
    from provision.ansible.role_vars import role_vars

    play = yaml.safe_load((paths.playbooks() / "deploy.yml").read_text())
    roles = [entry["role"] for entry in play[1]["roles"]]
    options: dict[str, dict] = {}
    required: set[str] = set()
    for role in roles:
        spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
        role_options = spec["argument_specs"]["main"]["options"]
        options |= role_options
        required |= {name for name, option in role_options.items() if option.get("required")}
    plan = plan_json("--host", "b300-test", "--inventory", str(inventory))
    params = role_vars(plan, str(paths.standin()))
    assert set(params) <= set(options), set(params) - set(options)
    assert required <= set(params), required - set(params)
    assert params["sglang_service_unit"] == plan["unit"] and params["python_env_venv"] == plan["python_env"]["venv"]
    assert params["model_store_python"] == plan["config"]["service"]["venv"] + "/bin/python3"

    proc = ansible_playbook("-i", str(inventory), "playbooks/b300.yml", "--tags", "plan", "--check",
                            callback="minimal")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    marker, decoder, pos, facts = "b300-test | SUCCESS => ", json.JSONDecoder(), 0, {}
    while "dflash_plan" not in facts and (pos := proc.stdout.find(marker, pos)) != -1:
        pos += len(marker)
        facts = decoder.raw_decode(proc.stdout, pos)[0].get("ansible_facts", {})
    assert facts.get("dflash_plan") == plan
    assert {name: facts.get(name) for name in params} == params
