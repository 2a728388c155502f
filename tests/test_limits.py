"""Issue 16, class 5: the system's own limits (line, argument, path), the systemd each directive needs,
conflicts with what the plan pins, credentials in URLs, settings without effect, overlapping keys, blame,
and messages in the user's words."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import types
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from packaging.requirements import Requirement
from pydantic import BaseModel, ValidationError

from provision.model.deployment import Deployment, RuleError, SglangBuild
from provision.model.translate import first_error, unwrap
from provision.planning.planner import sglang_requirement
from provision.planning.render import LONG_LINE_MAX, MAX_ARG_STRLEN, directive_table, needs
from tests.test_bad_input import assert_refused

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "provision" / "planning" / "templates" / "sglang-dflash.service.j2"


def refused(run, *sets: str, host: str = "rtx6000") -> tuple[int, str, str]:
    argv = ["plan", "--host", host]
    for item in sets:
        argv += ["--set", item]
    return run(*argv)


# --- systemd: one table of the version each directive appeared in -------------------------------------------


def test_every_directive_the_template_can_render_has_a_table_entry() -> None:
    # every directive line of the template, in every branch of it
    names = {m[1] for m in re.finditer(r"^([A-Za-z]+)=", TEMPLATE.read_text(), re.M)}
    since = directive_table().since()
    assert names and not names - set(since), names - set(since)
    assert set(directive_table().essential) <= names  # no stale entry in the essential list


def test_a_directive_value_needs_the_version_it_appeared_in() -> None:
    assert needs("Type=exec") == ("Type=exec", 240)
    assert needs("ProtectSystem=strict") == ("ProtectSystem=strict", 232)
    assert needs("SystemCallFilter=~@privileged @swap") == ("SystemCallFilter=@swap", 233)
    assert needs("ProtectProc=invisible") == ("ProtectProc", 247)
    with pytest.raises(LookupError, match="systemd_directives.yml"):
        needs("MemoryDenyWriteExecute=yes")


def test_directives_a_systemd_lacks_are_omitted_with_a_comment(plan_json) -> None:
    unit = plan_json("--host", "rtx6000", "--set", "service.systemd_version=244")["unit"]
    for name, since in (("ProtectClock", 245), ("ProtectProc", 247), ("RestartSteps", 254)):
        assert f"\n{name}=" not in unit
        assert f"# systemd 244 has no {name}= (systemd {since}): omitted" in unit
    assert "\nProtectKernelLogs=yes" in unit and "\nProtectHostname=yes" in unit  # 244 and 242 have them
    newest = plan_json("--host", "rtx6000", "--set", "service.systemd_version=255")["unit"]
    assert "): omitted" not in newest and "\nRestartSteps=5" in newest


def test_a_systemd_without_an_essential_directive_is_refused(run) -> None:
    assert_refused(
        *refused(run, "service.systemd_version=239"),
        ["--set service.systemd_version=239", "has no Type=exec (systemd 240)", "allowed: 240 or newer"],
    )


def _verify(tmp_path: Path, unit: str, venv: str) -> subprocess.CompletedProcess[str]:
    """systemd-analyze verify on a root of its own: the host's unit tree (for the targets the unit orders
    after) and the venv's python (verify checks ExecStart='s program exists)."""
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    python = root / venv.lstrip("/") / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    path = root / "etc/systemd/system/sglang-dflash.service"
    path.parent.mkdir(parents=True)
    path.write_text(unit)
    argv = ["systemd-analyze", "verify", "--man=no", f"--root={root}", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _systemd_analyze() -> int | None:
    if shutil.which("systemd-analyze") is None or not Path("/usr/lib/systemd/system/sysinit.target").exists():
        return None
    out = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True, check=False).stdout
    return int(out.split()[1])


@pytest.mark.skipif(_systemd_analyze() is None, reason="no systemd-analyze and unit tree on this machine")
@pytest.mark.parametrize("sets", [[], ["service.rdma=true", "service.launcher=standin"]])
def test_the_unit_for_this_systemd_passes_its_own_verify(plan_json, tmp_path: Path, sets: list[str]) -> None:
    version = _systemd_analyze()
    argv = ["--host", "rtx6000", "--set", f"service.systemd_version={version}"]
    for item in sets:
        argv += ["--set", item]
    plan = plan_json(*argv)
    done = _verify(tmp_path, plan["unit"], plan["config"]["service"]["venv"])
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


@pytest.mark.skipif(_systemd_analyze() not in range(230, 254), reason="needs a systemd older than RestartSteps=")
def test_verify_sees_what_the_table_omits(plan_json, tmp_path: Path) -> None:
    """The control: a unit rendered for a newer systemd makes this one's verify complain, so the pass above
    is the table's doing."""
    plan = plan_json("--host", "rtx6000", "--set", "service.systemd_version=255")
    done = _verify(tmp_path, plan["unit"], plan["config"]["service"]["venv"])
    assert "Unknown key 'RestartSteps'" in done.stderr


# --- the system's own limits ---------------------------------------------------------------------------------


def test_a_unit_line_of_a_mebibyte_is_refused_naming_the_field(run) -> None:
    words = ["--x" + str(i) + "=" + "a" * 60_000 for i in range(20)]  # each word within MAX_ARG_STRLEN
    assert_refused(
        *refused(run, "serve.extra_args=" + json.dumps(words)),
        ["serve.extra_args", "line of", "in the unit", f"{LONG_LINE_MAX} bytes (LONG_LINE_MAX)"],
    )


def test_an_argument_over_the_kernels_limit_is_refused(run) -> None:
    word = "--x=" + "a" * MAX_ARG_STRLEN
    assert_refused(*refused(run, "serve.extra_args=" + json.dumps([word])), ["serve.extra_args", "MAX_ARG_STRLEN"])


def test_an_environment_value_over_the_kernels_limit_is_refused(run) -> None:
    assert_refused(
        *refused(run, "serve.env.MY_FLAG=" + "x" * MAX_ARG_STRLEN),
        ["serve.env.MY_FLAG", "environment string of", "MAX_ARG_STRLEN"],
    )


def test_a_long_environment_value_within_the_limits_is_rendered(plan_json) -> None:
    plan = plan_json("--host", "rtx6000", "--set", "serve.env.MY_FLAG=" + "x" * 100_000)
    assert plan["env"]["MY_FLAG"] == "x" * 100_000


def test_a_path_component_over_name_max_is_refused(run) -> None:
    assert_refused(
        *refused(run, "model.path=/models/" + "k" * 256), ["model.path", "component of 256 bytes", "NAME_MAX"]
    )
    # bytes, not characters: 128 two-byte characters are 256 bytes
    assert_refused(*refused(run, "model.path=/models/" + "é" * 128), ["model.path", "256 bytes"])


def test_a_path_at_name_max_is_fine(plan_json) -> None:
    plan = plan_json("--host", "rtx6000", "--set", "model.path=/models/" + "k" * 255)
    assert plan["config"]["model"]["path"].endswith("k" * 255)


def test_a_path_over_path_max_is_refused(run) -> None:
    long = "/var/cache/x" + "/" + "/".join(["d" * 200] * 21)  # 4233 bytes
    assert_refused(*refused(run, f"triton.cache_dir={long}"), ["triton.cache_dir", "PATH_MAX", "4095"])


def test_a_path_the_unit_builds_from_a_field_is_held_to_path_max(run) -> None:
    venv = "/opt/v/" + "/".join(["d" * 200] * 20)  # within PATH_MAX; venv/bin/python3 is not
    venv += "/" + "e" * (4090 - len(venv) - 1)
    assert len(venv) == 4090  # venv/bin/python3 is 4102
    assert_refused(*refused(run, f"service.venv={venv}"), ["service.venv", "PATH_MAX"])


# --- conflicts with the plan's own pins ----------------------------------------------------------------------

REPINS = [
    ("torch==2.5.0", "set python_env.torch instead"),
    ("Torch>=2", "set python_env.torch instead"),
    ("triton", "set triton.version instead"),
    ("sglang[all]>=0.4", "set sglang.git_ref instead"),  # the rtx6000 build is a git one
    ("FlashInfer_Python==0.2.0", "sglang.base_release (FlashInfer follows"),
    ("flashinfer", "FlashInfer follows the SGLang release's pin"),
]


@pytest.mark.parametrize(("requirement", "expected"), REPINS, ids=[r for r, _ in REPINS])
def test_a_package_the_plan_pins_cannot_be_given_again(run, requirement: str, expected: str) -> None:
    assert_refused(
        *refused(run, "python_env.extra_requirements=" + json.dumps([requirement])),
        ["python_env.extra_requirements", "which the plan pins itself", expected],
    )


def test_other_requirements_are_kept(plan_json) -> None:
    plan = plan_json("--host", "rtx6000", "--set", 'python_env.extra_requirements=["numpy>=2", "torchvision"]')
    assert plan["python_env"]["requirements"][-2:] == ["numpy>=2", "torchvision"]


def test_cuda_wheels_are_pinned_under_the_pip_method(run) -> None:
    assert_refused(
        *refused(run, "cuda.method=pip", "python_env.extra_requirements=" + json.dumps(["CUDA_Toolkit[nvcc]"])),
        ["python_env.extra_requirements", "set cuda.version instead"],
    )


@pytest.mark.parametrize("arch_list", ["9.0a", "12.0f 10.0a", "12.1f"])
def test_an_arch_list_for_another_gpu_is_refused(run, arch_list: str) -> None:
    assert_refused(
        *refused(run, f"flashinfer.arch_list={arch_list}"),
        ["flashinfer.arch_list", "is not this host's GPU", "compute capability 12.0"],
    )


def test_an_arch_list_for_this_gpu_is_kept_and_a_repeat_refused(plan_json, run) -> None:
    assert plan_json("--host", "rtx6000", "--set", "flashinfer.arch_list=12.0a")["flashinfer"]["arch_list"] == "12.0a"
    assert_refused(*refused(run, "flashinfer.arch_list=12.0f 12.0f"), ["flashinfer.arch_list", "twice"])


# --- a wheel's path as a file: URL ---------------------------------------------------------------------------

WHEEL = {"source": "wheel", "dialect": "ddtree-pr29907", "base_release": "0.5.23"}


@pytest.mark.parametrize("name", ["a b", "a#b", "a?b", "a%20b", "a%b", "é 漢"])
def test_a_wheel_path_becomes_the_file_url_of_that_path(plan_json, name: str) -> None:
    path = f"/wheels/{name}/sglang-0.5.23-py3-none-any.whl"
    plan = plan_json("--host", "rtx6000", "--set", "sglang.source=wheel", "--set", f"sglang.wheel={path}")
    url = Requirement(plan["sglang"]["requirement"]).url
    assert url is not None and url2pathname(urlsplit(url).path) == path
    assert not urlsplit(url).fragment and not urlsplit(url).query


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(alphabet=" #?%&;@=+~'\"$é漢/\\azAZ09.-_", min_size=1, max_size=12), min_size=1, max_size=4))
def test_any_wheel_path_round_trips_through_its_url(parts: list[str]) -> None:
    path = "/" + "/".join(parts) + "/sglang-0.5.23-py3-none-any.whl"
    try:
        build = SglangBuild(**WHEEL, wheel=path)
    except (ValueError, RuleError):
        assume(False)
        return
    requirement = Requirement(sglang_requirement(types.SimpleNamespace(sglang=build)))  # type: ignore[arg-type]
    parts_ = urlsplit(requirement.url or "")
    assert requirement.name == "sglang" and parts_.scheme == "file" and not parts_.fragment and not parts_.query
    assert url2pathname(parts_.path) == path  # what pip's url_to_path gives back


# --- credentials and secret names ----------------------------------------------------------------------------

CREDENTIALS = [
    "python_env.index_url=https://user:s3cret@pypi.internal/simple",
    "python_env.index_url=https://ghp_token@pypi.internal/simple",
    "python_env.torch_index_url=https://u:p@download.pytorch.org/whl/cu130",
    "sglang.git_url=https://user:s3cret@github.com/sgl-project/sglang.git",
    "sglang.git_url=ssh://git:s3cret@github.com/sgl-project/sglang.git",
]


@pytest.mark.parametrize("item", CREDENTIALS)
def test_credentials_in_a_url_are_refused(run, item: str) -> None:
    rc, out, err = refused(run, item)
    assert_refused(rc, out, err, [item.split("=", 1)[0], "must not carry credentials", "~/.netrc"])
    message = err.split(": ", 3)[-1]  # what follows the option as typed
    assert "s3cret" not in message and "ghp_token" not in message


def test_an_ssh_user_is_no_credential(plan_json) -> None:
    plan = plan_json("--host", "rtx6000", "--set", "sglang.git_url=ssh://git@github.com/sgl-project/sglang.git")
    assert plan["sglang"]["git_url"] == "ssh://git@github.com/sgl-project/sglang.git"


@pytest.mark.parametrize(
    "name", ["AWS_SECRET_ACCESS_KEY", "GOOGLE_APPLICATION_CREDENTIALS", "HFTOKEN", "HUB_AUTH", "OPENAI_API_KEY",
             "SSH_PASSPHRASE", "DB_PASSWD", "MY_SECRETS", "ACCESS_KEY"],
)  # fmt: skip
def test_secret_names_are_refused_by_component(run, name: str) -> None:
    assert_refused(*refused(run, f"serve.env.{name}=x"), [f"serve.env.{name}", "looks like a secret"])


@pytest.mark.parametrize("name", ["TOKENIZERS_PARALLELISM", "MONKEY_PATCH", "KEYBOARD", "NCCL_DEBUG", "AUTHOR"])
def test_names_that_only_contain_the_letters_are_kept(plan_json, name: str) -> None:
    assert plan_json("--host", "rtx6000", "--set", f"serve.env.{name}=1")["env"][name] == "1"


# --- settings without effect ---------------------------------------------------------------------------------

INERT = [
    (["model.min_free_gb=100"], ["--set model.min_free_gb=100", "has no effect", "present"]),
    (["drafter.min_free_gb=10"], ["drafter.min_free_gb", "has no effect", "nothing is fetched"]),
    (["serve.allow_untrained_depth=true"], ["serve.allow_untrained_depth", "has no effect", "not above"]),
    (["serve.block_size=4", "serve.allow_untrained_depth=true"], ["serve.allow_untrained_depth", "no effect"]),
    (["sglang.version=0.5.23"], ["--set sglang.version=0.5.23", "has no effect", "base_release names"]),
    (["service.standin_path=/opt/x/standin.py"], ["service.standin_path", "has no effect", "not standin"]),
]


@pytest.mark.parametrize(("sets", "expected"), INERT, ids=[" ".join(s) for s, _ in INERT])
def test_a_set_without_effect_is_refused(run, sets: list[str], expected: list[str]) -> None:
    assert_refused(*refused(run, *sets), expected)


def test_settings_with_effect_are_kept(plan_json) -> None:
    plan_json("--host", "rtx6000", "--set", "serve.block_size=16", "--set", "serve.allow_untrained_depth=true")
    plan_json("--host", "rtx6000", "--set", "model.source=huggingface", "--set", "model.repo=o/n",
              "--set", "model.min_free_gb=100")  # fmt: skip
    plan_json("--host", "rtx6000", "--set", "service.launcher=standin", "--set", "service.standin_path=/opt/x/s.py")


def _config(plan_json) -> dict[str, Any]:
    return plan_json("--host", "rtx6000")["config"]


def test_rdma_is_inert_in_a_multinode_instance(plan_json) -> None:
    data = _config(plan_json)
    data["multinode"] = {"nodes": ["a", "b"]}
    data["service"] = {**data["service"], "rdma": False}
    inert = dict(Deployment.model_validate(data).inert())
    assert "multi-node instance always opens the RDMA devices" in inert["service.rdma"]


# --- overlapping keys, blame ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sets",
    [["serve.ddtree.budget=3", 'serve.ddtree={"topk": 2}'], ['serve.ddtree={"topk": 2}', "serve.ddtree.budget=3"]],
)
def test_a_key_and_a_key_below_it_are_refused_naming_both(run, sets: list[str]) -> None:
    assert_refused(*refused(run, *sets), ["--set", "serve.ddtree.budget", "below serve.ddtree"])


def test_a_key_given_twice_is_refused(run) -> None:
    assert_refused(*refused(run, "serve.port=30001", "serve.port=30002"), ["serve.port", "given twice"])


def test_overlapping_keys_in_dflash_set_are_refused(inventory: Path, run) -> None:
    path = inventory / "group_vars" / "rtx6000.yml"
    path.write_text(path.read_text() + "\ndflash_set:\n  serve.ddtree.budget: 3\n  serve.ddtree: {topk: 2}\n")
    rc, out, err = run("plan", "--host", "rtx6000", "--inventory", str(inventory))
    assert_refused(rc, out, err, ["group_vars/rtx6000.yml", "serve.ddtree.budget", "below serve.ddtree"])


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["sglang.source=wheel"], ["--set sglang.source=wheel", "sglang.wheel is required"]),
        (["model.source=copy"], ["--set model.source=copy", "model.copy_from is required"]),
        (["serve.algorithm=DFLASH", "drafter=null"], ["--set drafter=null", "needs a drafter"]),
    ],
)
def test_a_rule_is_blamed_on_the_set_that_asks_not_the_default(run, sets: list[str], expected: list[str]) -> None:
    rc, out, err = refused(run, *sets)
    assert_refused(rc, out, err, expected)
    assert "(the default)" not in err


def test_dflash_set_is_blamed_for_a_related_field(inventory: Path, run) -> None:
    path = inventory / "group_vars" / "rtx6000.yml"
    path.write_text(path.read_text() + "\ndflash_set:\n  sglang.source: wheel\n")
    rc, out, err = run("plan", "--host", "rtx6000", "--inventory", str(inventory))
    assert_refused(rc, out, err, ["group_vars/rtx6000.yml", "dflash_set[sglang.source]", "sglang.wheel is required"])
    assert "(the default)" not in err


def test_dflash_set_of_a_section_names_the_field_below_it(inventory: Path, run) -> None:
    path = inventory / "group_vars" / "rtx6000.yml"
    path.write_text(path.read_text() + "\ndflash_set:\n  serve: {port: [1]}\n")
    rc, out, err = run("plan", "--host", "rtx6000", "--inventory", str(inventory))
    assert_refused(rc, out, err, ["dflash_set[serve].port", "valid integer"])


# --- messages in the user's words ----------------------------------------------------------------------------

# what only pydantic, Ansible or Python would say: a validator's name, a union member, a class or its path
INTERNALS = re.compile(r"function-|\[|Tagged|lambda|<class|\b(provision|pydantic|ansible)\.\w|instance of")
WRONG: list[Any] = [{"a": 1}, [1], 5, True, 1.5, "text", None]


def _paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        out.append(prefix + name)
        sub = [t for t in unwrap(info.annotation) if isinstance(t, type) and issubclass(t, BaseModel)]
        if sub:
            out += _paths(sub[0], f"{prefix}{name}.")
    return out


def _set(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(data))
    node = out
    *parents, leaf = path.split(".")
    for step in parents:
        node[step] = node.get(step) or {}
        node = node[step]
    node[leaf] = value
    return out


def test_every_field_given_a_wrong_type_reads_in_the_users_words(plan_json) -> None:
    base, seen = _config(plan_json), 0
    for path in _paths(Deployment):
        for value in WRONG:
            try:
                Deployment.model_validate(_set(base, path, value))
            except ValidationError as err:
                field, message = first_error(err, Deployment)
                seen += 1
                assert not INTERNALS.search(field), (path, value, field)
                assert not INTERNALS.search(message), (path, value, message)
            except RuleError:
                pass
    assert seen > 200


def test_wrong_types_from_the_inventory_name_no_ansible_type(inventory: Path, run) -> None:
    path = inventory / "group_vars" / "rtx6000.yml"
    data = yaml.safe_load(path.read_text())
    data["dflash_serve"]["host"] = {"a": 1}
    data["dflash_serve"]["ddtree"] = "deep"
    path.write_text(yaml.safe_dump(data))
    rc, out, err = run("plan", "--host", "rtx6000", "--inventory", str(inventory))
    assert rc == 2 and not INTERNALS.search(err.split(": ", 2)[-1]), err
    assert "must be a mapping, got a string" in err or "must be a valid string" in err
