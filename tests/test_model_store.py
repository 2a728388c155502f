"""The model_store role on this machine (ansible_connection=local), with the tiny fixture models.

No network: the copy source is the sandbox's tiny models (provision/sandbox/models), and the Hugging Face
download runs against a fake huggingface_hub (the real API's names) that copies the fixtures and records the
token it was given.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provision import paths
from tests.conftest import ROOT

BIN = Path(sys.executable).parent
MODELS = paths.sandbox_models()
RECAP = re.compile(r"^localhost\s*: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
TOKEN = "hf_FAKEtokenFAKEtokenFAKEtoken1234"

FAKE_HUB = """
import json, os, shutil
FIXTURES = {fixtures!r}
LOG = {log!r}

class _Sibling:
    def __init__(self, name, size):
        self.rfilename, self.size = name, size

class _Info:
    def __init__(self, repo):
        root = os.path.join(FIXTURES, repo.split("/")[1])
        self.siblings = [_Sibling(n, os.path.getsize(os.path.join(root, n))) for n in sorted(os.listdir(root))]
        self.sha = "0" * 40

class HfApi:
    def model_info(self, repo_id, revision=None, files_metadata=False):
        return _Info(repo_id)

def snapshot_download(repo_id, revision=None, local_dir=None):
    with open(LOG, "a") as log:
        log.write(json.dumps({{"repo": repo_id, "revision": revision, "token": os.environ.get("HF_TOKEN")}}) + "\\n")
    shutil.copytree(os.path.join(FIXTURES, repo_id.split("/")[1]), local_dir, dirs_exist_ok=True)
    return local_dir
"""


def model(path: Path, source: str = "copy", **extra: object) -> dict:
    spec = {
        "path": str(path), "source": source, "repo": None, "revision": None, "copy_from": None,
        "token_file": None, "min_free_gb": None,
    }  # fmt: skip
    spec.update(extra)
    return spec


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.dest = tmp_path / "models"
        self.config_dir = tmp_path / "etc"
        self.venv = tmp_path / "venv"
        self.hub_log = tmp_path / "hub.log"
        fake = tmp_path / "fakehub" / "huggingface_hub"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text(FAKE_HUB.format(fixtures=str(MODELS), log=str(self.hub_log)))
        (self.venv / "bin").mkdir(parents=True)
        python = self.venv / "bin" / "python3"
        python.write_text(f'#!/bin/sh\nPYTHONPATH={fake.parent} exec {sys.executable} "$@"\n')
        python.chmod(0o755)
        (tmp_path / "hosts.yml").write_text(
            yaml.safe_dump(
                {"all": {"hosts": {"localhost": {"ansible_connection": "local",
                                                 "ansible_python_interpreter": sys.executable}}}}
            )
        )  # fmt: skip
        (tmp_path / "play.yml").write_text(
            "- name: Place the models\n  hosts: localhost\n  gather_facts: false\n  roles: [model_store]\n"
            "  post_tasks:\n    - name: Show the fact\n      ansible.builtin.debug:\n"
            "        msg: 'trained={{ model_store_drafter_trained_block_size }}'\n"
        )

    def copy_plan(self, **drafter_extra: object) -> dict:
        drafter = {"copy_from": str(MODELS / "tiny-drafter"), "block_size": 8, **drafter_extra}
        return {
            "model": model(self.dest / "tiny-target", copy_from=str(MODELS / "tiny-target")),
            "drafter": model(self.dest / "tiny-drafter", **drafter),
        }

    def run(self, config: dict, *args: str) -> tuple[int, str, tuple[int, int, int, int] | None]:
        # the role parameters the playbooks pass from a host's plan
        params = {"model_store_model": config["model"], "model_store_drafter": config["drafter"],
                  "model_store_service_user": "root", "model_store_python": f"{self.venv}/bin/python3",
                  "model_store_drafter_json": f"{self.config_dir}/drafter.json"}  # fmt: skip
        (self.tmp / "plan.json").write_text(json.dumps(params))
        proc = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(self.tmp / "hosts.yml"), "-e", f"@{self.tmp / 'plan.json'}",
             str(self.tmp / "play.yml"), *args],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                 "ANSIBLE_STDOUT_CALLBACK": "default", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
        )  # fmt: skip
        out = proc.stdout + proc.stderr
        found = RECAP.search(out)
        return proc.returncode, out, tuple(int(x) for x in found.groups()) if found else None


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_copy_places_both_models_and_a_second_run_changes_nothing(env: Env) -> None:
    rc, out, recap = env.run(env.copy_plan())
    assert rc == 0, out
    assert recap and recap[1] > 0 and recap[3] == 0, out
    for name in ("tiny-target", "tiny-drafter"):
        assert tree(env.dest / name) == tree(MODELS / name)
        assert all(p.stat().st_mode & 0o777 == 0o644 for p in (env.dest / name).iterdir())
    record = json.loads((env.config_dir / "drafter.json").read_text())
    assert record == {"path": str(env.dest / "tiny-drafter"), "block_size": 8, "source": "config.json"}
    assert "trained=8" in out

    rc, out, recap = env.run(env.copy_plan())
    assert rc == 0, out
    assert recap and recap[1] == 0 and recap[3] == 0, out

    # a shard cut short (an interrupted copy) is found and copied again
    shard = env.dest / "tiny-target" / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    rc, out, recap = env.run(env.copy_plan())
    assert rc == 0, out
    assert recap and recap[1] > 0, out
    assert tree(env.dest / "tiny-target") == tree(MODELS / "tiny-target")


def test_check_mode_on_an_empty_destination_changes_nothing(env: Env) -> None:
    rc, out, recap = env.run(env.copy_plan(), "--check")
    assert rc == 0, out
    assert recap and recap[1] > 0 and recap[3] == 0, out
    assert not env.dest.exists()
    assert not env.config_dir.exists()


def test_present_with_a_missing_shard_fails_naming_it(env: Env) -> None:
    incomplete = env.tmp / "incomplete"
    shutil.copytree(MODELS / "tiny-target", incomplete)
    (incomplete / "model-00002-of-00002.safetensors").unlink()
    before = tree(incomplete)
    rc, out, _ = env.run({"model": model(incomplete, "present"), "drafter": None})
    assert rc != 0
    assert f"model at {incomplete} (source: present) is incomplete" in out
    assert "shard model-00002-of-00002.safetensors is missing" in out
    assert tree(incomplete) == before


def test_a_drafter_trained_with_another_block_size_fails_before_copying(env: Env) -> None:
    drafter = env.tmp / "drafter16"
    shutil.copytree(MODELS / "tiny-drafter", drafter)
    config = json.loads((drafter / "config.json").read_text())
    config["dflash_config"]["block_size"] = 16
    (drafter / "config.json").write_text(json.dumps(config))
    plan = env.copy_plan(copy_from=str(drafter))
    rc, out, _ = env.run(plan)
    assert rc != 0
    assert f"inventory says 8, {drafter}/config.json (on the control node) says 16" in out
    assert "fix drafter.block_size" in out
    assert not env.dest.exists()

    # the same drafter already in place (source present) fails the same way, naming the host's file
    rc, out, _ = env.run({"model": plan["model"], "drafter": model(drafter, "present", block_size=8)})
    assert rc != 0
    assert f"inventory says 8, {drafter}/config.json says 16 (dflash_config.block_size): fix drafter.block_size" in out


def test_a_drafter_config_without_a_block_size_keeps_the_inventorys(env: Env) -> None:
    drafter = env.tmp / "drafter-nobs"
    shutil.copytree(MODELS / "tiny-drafter", drafter)
    config = json.loads((drafter / "config.json").read_text())
    del config["dflash_config"]
    (drafter / "config.json").write_text(json.dumps(config))
    rc, out, _ = env.run({"model": model(MODELS / "tiny-target", "present"),
                          "drafter": model(drafter, "present", block_size=8)})  # fmt: skip
    assert rc == 0, out
    assert "WARNING:" in out and "has neither dflash_config.block_size nor block_size" in out
    record = json.loads((env.config_dir / "drafter.json").read_text())
    assert record == {"path": str(drafter), "block_size": 8, "source": "inventory"}


def test_free_space_preflight_refuses_before_copying(env: Env) -> None:
    plan = env.copy_plan()
    plan["model"]["min_free_gb"] = 10**9
    rc, out, _ = env.run(plan)
    assert rc != 0
    assert "localhost: not enough free space for model at" in out
    assert re.search(r"need 1000000000\.0 GB, \S+ has [\d.]+ GB free", out), out
    assert not env.dest.exists()


def _token_file(env: Env, mode: int) -> Path:
    token = env.tmp / "secrets" / "hf_token"
    token.parent.mkdir()
    token.write_text(TOKEN + "\n")
    token.chmod(mode)
    return token


def _hf_plan(env: Env, token: Path, revision: str | None = "main") -> dict:
    return {
        "model": model(env.dest / "tiny-target", "huggingface", repo="fake-org/tiny-target", revision=revision,
                       token_file=str(token)),
        "drafter": model(env.dest / "tiny-drafter", "huggingface", repo="fake-org/tiny-drafter", revision=revision,
                         token_file=str(token), block_size=8),
    }  # fmt: skip


def test_a_token_file_readable_by_others_is_refused_before_any_download(env: Env) -> None:
    token = _token_file(env, 0o644)
    rc, out, _ = env.run(_hf_plan(env, token), "-vvv")
    assert rc != 0
    assert f"model.token_file {token} on the control node has mode 0644; it must be 0600" in out
    assert TOKEN not in out
    assert not env.hub_log.exists()  # huggingface_hub was never called
    assert not env.dest.exists()


def test_download_gets_the_token_but_never_prints_it(env: Env) -> None:
    token = _token_file(env, 0o600)
    rc, out, recap = env.run(_hf_plan(env, token), "-vvv")
    assert rc == 0, out
    assert TOKEN not in out
    calls = [json.loads(line) for line in env.hub_log.read_text().splitlines()]
    assert calls == [
        {"repo": "fake-org/tiny-target", "revision": "main", "token": TOKEN},
        {"repo": "fake-org/tiny-drafter", "revision": "main", "token": TOKEN},
    ]
    for name in ("tiny-target", "tiny-drafter"):
        placed = tree(env.dest / name)
        assert json.loads(placed.pop(".dflash-model-store.json")) == {"repo": f"fake-org/{name}", "revision": "main"}
        assert placed == tree(MODELS / name)
    assert "trained=8" in out

    rc, out, recap = env.run(_hf_plan(env, token))
    assert rc == 0, out
    assert recap and recap[1] == 0, out
    assert len(env.hub_log.read_text().splitlines()) == 2  # complete and the same revision: no download

    rc, out, recap = env.run(_hf_plan(env, token, revision="v2"))
    assert rc == 0, out
    assert len(env.hub_log.read_text().splitlines()) == 4  # another revision: downloaded again
    assert TOKEN not in out


def test_a_failed_download_says_why_without_the_token(env: Env) -> None:
    token = _token_file(env, 0o600)
    plan = _hf_plan(env, token)
    plan["model"]["repo"] = "fake-org/no-such-model"
    rc, out, _ = env.run(plan)
    assert rc != 0
    assert "localhost: model from fake-org/no-such-model into" in out
    assert "FileNotFoundError" in out
    assert TOKEN not in out


def test_files_the_service_user_cannot_read_are_refused(env: Env) -> None:
    hidden = env.tmp / "private" / "tiny-target"
    shutil.copytree(MODELS / "tiny-target", hidden)
    hidden.parent.chmod(0o700)
    (env.tmp / "nobody.json").write_text(json.dumps({"model_store_service_user": "nobody"}))
    rc, out, _ = env.run({"model": model(hidden, "present"), "drafter": None}, "-e", f"@{env.tmp / 'nobody.json'}")
    assert rc != 0
    assert f"model at {hidden} is not readable by nobody: " in out
    assert f"{hidden.parent}/" in out
