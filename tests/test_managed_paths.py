"""What apply may own: the model's rules on managed paths (no sandbox), and the ownership guard's module run
on a temporary tree. tests/test_ownership.py proves the guard on a fresh sandbox host."""

from __future__ import annotations

import json
import pwd
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_bad_input import assert_refused

sys.path.insert(0, str(ROOT / "collections"))
from ansible_collections.dflash.provision.plugins.module_utils import ownership  # noqa: E402

ROOTS_LIST = "/opt, /srv, /var/cache, /var/lib, /etc, /usr/local, /models"
OUTSIDE = "is not below a directory of its own in service.managed_roots"
APART = "apply would change one through the other"
COPY = ["model.source=copy", "model.copy_from=/src"]
SRV = ["service.venv=/srv/llm/venv", "service.config_dir=/srv/llm/etc", "triton.cache_dir=/srv/llm/cache/triton",
       "flashinfer.workspace_base=/srv/llm/cache/flashinfer", "serve.api_key_file=/srv/llm/etc/key"]  # fmt: skip

REFUSED = [
    # below the host's own directories, or a root itself
    (["service.config_dir=/etc"], ["service.config_dir", f"/etc {OUTSIDE} ({ROOTS_LIST})"]),
    (["flashinfer.workspace_base=/var/cache"], ["flashinfer.workspace_base", OUTSIDE]),
    (["service.venv=/usr/lib/systemd/system/venv"], ["service.venv", OUTSIDE]),
    (["triton.cache_dir=/root/.ssh/triton"], ["triton.cache_dir", OUTSIDE]),
    (["serve.api_key_file=/etc/passwd"], ["serve.api_key_file", OUTSIDE]),
    (["serve.api_key_file=/root/.ssh/authorized_keys"], ["serve.api_key_file", OUTSIDE]),
    ([*COPY, "model.path=/var/lib"], ["model.path", OUTSIDE]),
    (["service.launcher=standin", "service.standin_path=/usr/bin/python3"], ["service.standin_path", OUTSIDE]),
    (["cuda.method=pip", "cuda.home=/usr"], ["cuda.home", OUTSIDE]),
    # one on another
    (["service.venv=/var/lib/sglang-dflash"], ["service.venv", "the same path as the unit's StateDirectory"]),
    (["service.venv=/var/lib/sglang-dflash/venv"], ["service.venv", "inside the unit's StateDirectory", APART]),
    (["service.name=llm", "triton.cache_dir=/var/lib/llm/triton"], ["triton.cache_dir", "StateDirectory /var/lib/llm"]),
    (["triton.cache_dir=/opt/sglang-dflash/venv/triton"], ["triton.cache_dir", "inside service.venv"]),
    (["flashinfer.workspace_base=/var/cache/sglang-dflash/triton"], ["flashinfer.workspace_base", "same path"]),
    (["triton.cache_dir=/var/cache/sglang-dflash/flashinfer/t"], ["triton.cache_dir", "inside flashinfer"]),
    (
        ["cuda.method=preinstalled", "cuda.home=/opt/cuda", "triton.cache_dir=/opt/cuda/triton"],
        ["triton.cache_dir", "inside cuda.home /opt/cuda"],
    ),  # fmt: skip
    (["serve.api_key_file=/etc/sglang-dflash/secrets.env"], ["serve.api_key_file", "config directory's secrets.env"]),
    (["serve.api_key_file=/etc/sglang-dflash/sglang-dflash.env"], ["serve.api_key_file", "sglang-dflash.env"]),
    (["serve.api_key_file=/var/cache/sglang-dflash/triton/key"], ["serve.api_key_file", "inside triton.cache_dir"]),
    (["service.config_dir=/opt/sglang-dflash/venv/etc"], ["service.config_dir", "inside service.venv"]),
    (["model.path=/etc/sglang-dflash/model"], ["model.path", "inside service.config_dir"]),
    (["drafter.path=/models/Kimi-K2.6"], ["drafter.path", "model.path /models/Kimi-K2.6 is the same path as drafter"]),
    # one name
    (["service.name=sglang-dflash.service"], ["service.name", "without .service", "'sglang-dflash'"]),
    (["service.name=ssh.service"], ["service.name", "without .service"]),
    # the roots, per site
    (['service.managed_roots=["/srv"]'], ["--set service.managed_roots", "/opt/sglang-dflash/venv", "(/srv)"]),
    (["service.managed_roots=[]"], ["service.managed_roots", "at least 1"]),
    (['service.managed_roots=["srv"]'], ["service.managed_roots", "absolute path"]),
    (['service.managed_roots=["/srv", "/srv"]'], ["service.managed_roots", "/srv is given twice"]),
    # adoption names what apply manages
    (['service.adopt=["/etc"]'], ["service.adopt", "/etc is neither a path apply manages", "/etc/sglang-dflash"]),
    (['service.adopt=["root"]'], ["service.adopt", "root is neither", "sglang"]),
    (['service.adopt=["/var/lib/dpkg"]'], ["service.adopt", "/var/lib/dpkg is neither"]),
]

ACCEPTED = [
    [],
    ["serve.api_key_file=/etc/sglang-dflash/api_key"],  # a file in the config directory
    ["cuda.method=preinstalled", "cuda.home=/usr"],  # a preinstalled toolkit is the host's own
    ["model.path=/mnt/nvme/kimi"],  # source present: only read
    ['service.managed_roots=["/srv"]', *SRV],
    ['service.managed_roots=["/data"]', *(s.replace("/srv/", "/data/") for s in SRV)],
    ['service.adopt=["/etc/sglang-dflash", "/opt/sglang-dflash", "sglang"]'],
    ["service.name=llm", "service.venv=/var/lib/llm-venv"],
]


@pytest.mark.parametrize(("sets", "expected"), REFUSED, ids=[" ".join(s)[:70] for s, _ in REFUSED])
def test_managed_path_refused(run, sets: list[str], expected: list[str]) -> None:
    argv = ["plan", "--host", "b300"]
    for item in sets:
        argv += ["--set", item]
    assert_refused(*run(*argv), expected)


@pytest.mark.parametrize("sets", ACCEPTED, ids=[" ".join(s)[:70] or "defaults" for s in ACCEPTED])
def test_managed_path_accepted(run, sets: list[str]) -> None:
    argv = ["plan", "--host", "b300"]
    for item in sets:
        argv += ["--set", item]
    rc, _, err = run(*argv)
    assert rc == 0, err


def test_plan_carries_the_managed_paths(plan_json) -> None:
    plan = plan_json("--host", "b300", "--set", "cuda.method=pip", "--set", "service.launcher=standin")
    paths = {p["path"]: p for p in plan["managed_paths"]}
    assert paths["/opt/sglang-dflash/venv"]["own_dir"] == "/opt/sglang-dflash"
    assert paths["/var/cache/sglang-dflash/triton"] == {
        "path": "/var/cache/sglang-dflash/triton", "type": "directory", "owner": "sglang", "mode": "0750",
        "field": "triton.cache_dir", "own_dir": "/var/cache/sglang-dflash",
    }  # fmt: skip
    assert paths["/etc/sglang-dflash/api_key"]["mode"] == "0600"
    assert paths["/etc/systemd/system/sglang-dflash.service"]["own_dir"] is None
    assert paths["/var/lib/sglang-dflash"]["owner"] == "sglang"
    assert paths["/usr/local/cuda-13.0"]["type"] == "link"  # the pip toolkit's link, at the planned home
    assert "/opt/dflash-provision/libexec/sglang_standin.py" in paths
    assert "/models/Kimi-K2.6" not in paths  # source present: the user's own files, only read


def test_h200_inventory_plans(run) -> None:
    rc, out, err = run("plan", "--host", "all", "--inventory", str(ROOT / "inventories" / "h200"))
    assert rc == 0, err


# -- the guard's module, on a temporary tree


def guard(paths=(), adopt=(), user=None, unit=None, manifest=None):
    params = {"paths": list(paths), "adopt": list(adopt), "user": user, "unit": unit}
    return ownership.check(params, manifest or {"paths": {}, "accounts": {}})


def entry(path: Path, own: Path | None = None, kind: str = "directory") -> dict:
    return {"path": str(path), "type": kind, "field": "service.venv", "own_dir": str(own) if own else None}


def test_guard_claims_what_is_absent(tmp_path: Path) -> None:
    refused, absent, _ = guard([entry(tmp_path / "own" / "venv", tmp_path / "own")])
    assert refused == []
    assert absent == [{"path": str(tmp_path / "own"), "type": "directory"},
                      {"path": str(tmp_path / "own" / "venv"), "type": "directory"}]  # fmt: skip


def test_guard_reports_what_an_earlier_run_claimed_until_it_is_recorded(tmp_path: Path) -> None:
    (tmp_path / "venv").mkdir()
    claimed = {"paths": {str(tmp_path / "venv"): {"type": "directory", "owner": ownership.CLAIMED}}, "accounts": {}}
    refused, absent, _ = guard([entry(tmp_path / "venv")], manifest=claimed)
    assert (refused, absent) == ([], [{"path": str(tmp_path / "venv"), "type": "directory"}])
    params = {"paths": absent, "user": None}
    assert ownership.record(params, claimed) is True
    assert claimed["paths"][str(tmp_path / "venv")]["owner"] != ownership.CLAIMED
    assert guard([entry(tmp_path / "venv")], manifest=claimed)[:2] == ([], [])


def test_guard_refuses_an_existing_path_and_own_dir(tmp_path: Path) -> None:
    (tmp_path / "cron.daily").mkdir()
    (tmp_path / "etc").mkdir()
    refused, _, _ = guard([entry(tmp_path / "cron.daily" / "x", tmp_path / "cron.daily"), entry(tmp_path / "etc")])
    assert len(refused) == 2
    assert f"would be created in {tmp_path}/cron.daily, which exists (directory" in refused[0]
    assert f"{tmp_path}/etc (service.venv) exists (directory" in refused[1]
    assert "service.adopt" in refused[1]


def test_guard_accepts_its_own_and_the_adopted(tmp_path: Path) -> None:
    (tmp_path / "own" / "venv").mkdir(parents=True)
    (tmp_path / "etc").mkdir()
    paths = [entry(tmp_path / "own" / "venv", tmp_path / "own"), entry(tmp_path / "etc")]
    # inside a directory apply created: its own too
    manifest = {"paths": {str(tmp_path / "own"): {"type": "directory"}}, "accounts": {}}
    refused, absent, _ = guard(paths, adopt=[str(tmp_path / "etc")], manifest=manifest)
    assert (refused, absent) == ([], [])


def test_guard_refuses_a_unit_of_that_name_anywhere(tmp_path: Path, monkeypatch) -> None:
    vendor = tmp_path / "lib"
    (vendor / "ssh.service.d").mkdir(parents=True)
    monkeypatch.setattr(ownership, "UNIT_DIRS", (str(tmp_path / "etc"), str(vendor)))
    refused, _, _ = guard(unit="ssh.service")
    assert refused == [f"ssh.service (service.name): {vendor}/ssh.service.d exists and apply did not create it: "
                       "a unit of that name is another's; choose another service.name"]  # fmt: skip
    # the unit apply created keeps an administrator's drop-in
    mine = {"paths": {"/etc/systemd/system/ssh.service": {}}, "accounts": {}}
    assert guard(unit="ssh.service", manifest=mine)[0] == []


def system_nologin_account() -> str:
    limit = ownership.sys_uid_max()
    return next(e.pw_name for e in pwd.getpwall() if 0 < e.pw_uid <= limit and e.pw_shell.endswith("/nologin"))


def test_guard_uses_an_existing_account_only_adopted_and_a_system_one() -> None:
    assert guard(user="no-such-account-here")[2] is True
    name = system_nologin_account()
    (why,) = guard(user=name)[0]
    assert f"the account {name} (service.user) exists and apply did not create it: add {name} to service.adopt" in why
    assert guard(user=name, adopt=[name])[0] == []
    assert guard(user=name, manifest={"paths": {}, "accounts": {name: {"uid": 1}}})[0] == []
    # claimed by a run and made since (by python_env), not recorded yet: still to record, never refused
    assert guard(user=name, manifest={"paths": {}, "accounts": {name: {"uid": None}}})[::2] == ([], True)
    # root (uid 0, a login shell) never, adopted or not
    (why,) = guard(user="root", adopt=["root"])[0]
    assert "uid 0" in why and "choose a service.user that does not exist" in why


def test_sys_uid_max_follows_login_defs(tmp_path: Path) -> None:
    defs = tmp_path / "login.defs"
    defs.write_text("# comment\nUID_MIN 2000\n")
    assert ownership.sys_uid_max(str(defs)) == 1999
    defs.write_text("UID_MIN 2000\nSYS_UID_MAX   499\n")
    assert ownership.sys_uid_max(str(defs)) == 499
    assert ownership.sys_uid_max(str(tmp_path / "none")) == 999


def test_record_writes_the_manifest_atomically(tmp_path: Path) -> None:
    made = tmp_path / "made"
    made.mkdir()
    manifest_path = tmp_path / "state" / "owned.json"
    paths = [{"path": str(made), "type": "directory"}, {"path": str(tmp_path / "later"), "type": "file"}]
    params = {"paths": paths, "user": None}
    manifest = ownership.read_manifest(str(manifest_path))
    assert ownership.record(params, manifest) is True
    ownership.write_manifest(str(manifest_path), manifest)
    saved = json.loads(manifest_path.read_text())
    assert saved["paths"][str(made)]["type"] == "directory"
    assert saved["paths"][str(tmp_path / "later")] == {"type": "file", "owner": "(claimed, not created yet)"}
    assert [p.name for p in manifest_path.parent.iterdir()] == ["owned.json"]  # no temporary file left
    # a second record of the same is no change
    assert ownership.record(params, ownership.read_manifest(str(manifest_path))) is False
