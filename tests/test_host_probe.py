"""The one look at a host (dflash.provision.host_probe) run as Ansible runs a module, on temporary trees of
this machine, and the reads and the filter the roles decide with. tests/test_stack.py proves the look on
sandbox hosts: a settled host takes it once and every role ends at once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import COLLECTIONS, run_module

sys.path.insert(0, str(COLLECTIONS))
from ansible_collections.dflash.provision.plugins.filter.files import reaches  # noqa: E402
from ansible_collections.dflash.provision.plugins.filter.stamps import install_stamp, unmet  # noqa: E402
from ansible_collections.dflash.provision.plugins.module_utils import host, probe_venv  # noqa: E402

MODULE = "ansible_collections/dflash/provision/plugins/modules/host_probe.py"


def probe(tmp_path: Path, checks: dict) -> dict:
    return run_module(MODULE, {"checks": checks}, tmp_path)


def venv_tree(root: Path) -> Path:
    site = root / "lib" / "python3.11" / "site-packages"
    for dist in ("torch-2.13.0+cpu", "flashinfer_python-0.7.2", "Foo.Bar-1.0"):
        (site / f"{dist}.dist-info").mkdir(parents=True)
    (root / ".dflash").mkdir()
    (root / ".dflash" / "torch-triton").write_text(install_stamp(["torch==2.13.0+cpu"], True))
    return root


def test_one_call_answers_every_check_under_its_name(tmp_path: Path) -> None:
    venv = venv_tree(tmp_path / "venv")
    script = tmp_path / "script.py"
    script.write_text("print('x')\n")
    script.chmod(0o640)
    found = probe(
        tmp_path,
        {
            "python_env": {"probe": "venv", "args": {"venv": str(venv), "packages": ["dpkg", "no-such-package-here"]}},
            "triton": {"probe": "venv", "args": {"venv": str(venv), "files": [str(script), str(tmp_path / "gone")]}},
        },
    )
    assert found["changed"] is False and set(found["found"]) == {"python_env", "triton"}
    env = found["found"]["python_env"]
    # what is installed now, by PEP 503 name; the stamp as the last install left it
    assert env["installed"] == {"torch": "2.13.0+cpu", "flashinfer-python": "0.7.2", "foo-bar": "1.0"}
    assert env["stamps"] == {"torch-triton": install_stamp(["torch==2.13.0+cpu"], True)}
    assert env["missing_packages"] == ["no-such-package-here"]
    triton = found["found"]["triton"]
    assert triton["file_state"][str(script)].endswith(":0640") and triton["file_state"][str(tmp_path / "gone")] == ""
    assert triton["file_sha1"][str(tmp_path / "gone")] == "" and len(triton["file_sha1"][str(script)]) == 40


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (
            {"probe": "nvml", "args": {}},
            "check x: probe must be one of cuda, driver, models, ownership, venv, got 'nvml'",
        ),
        ({"probe": "cuda", "args": {"hom": "/x"}}, "check x (cuda): missing required arguments: home"),
        ({"probe": "venv", "args": {"venv": "/v", "key_env": {"key_file": "/k"}}}, "check x (venv): missing required"),
    ],
)
def test_a_check_it_cannot_take_fails_naming_it(tmp_path: Path, check: dict, message: str) -> None:
    found = probe(tmp_path, {"x": check})
    assert found.get("failed") is True and found["msg"].startswith(message), found


def test_the_ownership_guard_fails_the_look_before_any_role_is_read(tmp_path: Path) -> None:
    taken = tmp_path / "etc-sglang"
    taken.mkdir()
    found = probe(
        tmp_path,
        {
            "triton": {"probe": "venv", "args": {"venv": str(tmp_path / "venv")}},
            "ownership": {
                "probe": "ownership",
                "args": {
                    "manifest": str(tmp_path / "owned.json"),
                    "paths": [{"path": str(taken), "field": "service.config_dir"}],
                },
            },
        },
    )  # fmt: skip
    assert found.get("failed") is True
    assert (
        f"{taken} (service.config_dir) exists (directory" in found["msg"] and "add it to service.adopt" in found["msg"]
    )


class FakeModule:
    """What the reads ask of AnsibleModule: run_command, answered from a table, and counted."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers, self.calls = answers, []

    def run_command(self, args: list[str]) -> tuple[int, str, str]:
        self.calls.append(args)
        return self.answers[args[0]]


def test_units_are_read_in_one_systemctl_call_in_the_order_asked() -> None:
    out = (
        "Id=sglang-dflash.service\nActiveState=active\nUnitFileState=enabled\n\n"
        "Id=sglang-dflash-watchdog.service\nActiveState=failed\nUnitFileState=enabled\n\n"
        "Id=nothing.service\nActiveState=inactive\nUnitFileState=\n"
    )
    module = FakeModule({"systemctl": (0, out, "")})
    states = probe_venv._unit_states(module, ["sglang-dflash", "sglang-dflash-watchdog.service", "nothing.service"])
    assert states == {"sglang-dflash": "active:enabled", "sglang-dflash-watchdog.service": "failed:enabled",
                      "nothing.service": ""}  # fmt: skip
    assert len(module.calls) == 1


def test_packages_are_read_in_one_dpkg_query_call_and_not_again() -> None:
    host._DPKG.clear()
    out = "g++|install ok installed|4:12.2.0-3\npython3-venv|deinstall ok config-files|3.11.2-1\n"
    module = FakeModule({"dpkg-query": (1, out, "dpkg-query: no packages found matching cuda-keyring\n")})
    assert host.missing(module, ["g++", "python3-venv", "cuda-keyring"]) == ["python3-venv", "cuda-keyring"]
    assert host.dpkg_versions(module, ["g++"]) == {"g++": "4:12.2.0-3"}
    assert len(module.calls) == 1
    host._DPKG.clear()


def test_unmet_reads_the_installed_set_against_the_requirements() -> None:
    installed = {"torch": "2.13.0+cpu", "triton": "3.7.0", "flashinfer-python": "0.7.2"}
    reqs = ["torch==2.13.0+cpu", "triton==3.8.0", "flashinfer_python==0.7.2", "sglang==0.5.23", "numpy>=2"]
    assert unmet(reqs, installed) == ["triton==3.8.0", "sglang==0.5.23", "numpy>=2"]
    assert unmet(["not a requirement ("], installed) == ["not a requirement ("]


LATER_CHECKS = {
    "triton": {"probe": "venv", "args": {"venv": "/opt/v", "files": ["/opt/l/aot.py"], "dirs": ["/c", "/opt/l"]}},
    "sglang": {"probe": "venv", "args": {"venv": "/opt/v", "files": ["/opt/l/argcheck.py"], "dirs": ["/opt/l"]}},
    "sglang_service": {
        "probe": "venv",
        "args": {"venv": "/opt/v", "units": ["sglang-dflash"], "files": ["/etc/s/s.env"], "dirs": ["/etc/s"],
                 "key_env": {"key_file": "/etc/k", "env_file": "/etc/s/secrets.env", "var": "K"}},
    },
}  # fmt: skip
ORDER = ["triton", "sglang", "sglang_service"]


@pytest.mark.parametrize(
    ("writes", "role", "reached"),
    [
        (["/opt/l/aot.py"], "triton", False),  # a file no later role reads, in a directory they check
        (["/opt/l"], "triton", True),  # that directory itself: its owner, group or mode
        (["/opt/v"], "triton", True),  # the venv (a stamp, an install): the later venv checks read it
        (["/opt/v/.dflash/triton-proof"], "triton", True),  # a file in the venv they read
        (["/etc/s/secrets.env"], "sglang", True),  # a path inside a later check's argument mapping
        (["/"], "sglang", True),  # anything: packages, the driver, units
        (["/"], "sglang_service", False),  # the last role: nobody after it
        (["/opt/l/aot.py"], "sglang", False),  # what only an earlier role reads
        (["/opt/l/argcheck.py"], "triton", True),
        ([], "triton", False),
        (["/opt/l/aot.py"], "model_store", True),  # a role outside the play's order: every other check counts
    ],
)
def test_a_write_reaches_what_a_later_role_looks_at(writes: list[str], role: str, reached: bool) -> None:
    assert reaches(writes, LATER_CHECKS, ORDER, role) is reached


@given(
    st.lists(st.sampled_from(["/", "/opt", "/opt/l", "/opt/l/aot.py", "/opt/v/x", "/etc/s", "/c/d", "/x"]), max_size=4),
    st.sampled_from(["/opt/l", "/opt/v/x", "/etc/s/s.env", "/x"]),
)
def test_more_writes_never_reach_less(writes: list[str], extra: str) -> None:
    if reaches(writes, LATER_CHECKS, ORDER, "triton"):
        assert reaches([*writes, extra], LATER_CHECKS, ORDER, "triton")


def test_the_look_gathers_the_facts_setup_gathers(tmp_path: Path) -> None:
    """host_probe_facts (host_probe's action with gather_subset): the same facts as ansible.builtin.setup, from
    setup's own collectors, in the look's call."""
    subset = ["min", "systemd"]
    setup = run_module("-m ansible.modules.setup", {"gather_subset": subset}, tmp_path)["ansible_facts"]
    facts_module = MODULE.replace("host_probe", "host_probe_facts")
    found = run_module(facts_module, {"checks": {}, "gather_subset": subset}, tmp_path)
    assert found["found"] == {} and set(found["ansible_facts"]) == set(setup)
    for key in ("ansible_distribution", "ansible_distribution_version", "ansible_kernel", "ansible_architecture"):
        assert found["ansible_facts"][key] == setup[key], key
    assert found["ansible_facts"].get("ansible_systemd") == setup.get("ansible_systemd")
    # the roles' own looks after a change gather none: host_probe itself ships without setup's collectors
    assert "ansible_facts" not in probe(tmp_path, {})
    assert "ansible.module_utils.facts" not in (COLLECTIONS / MODULE).read_text()


def test_checks_name_what_depends_on_the_host_by_what_they_find(tmp_path: Path) -> None:
    """The play's look names its checks before it has read the host's release, arch or kernel: NVIDIA's lists
    are found by pattern (the role compares the one it plans), the kernel headers by the kernel running here."""
    lists = tmp_path / "sources.list.d"
    lists.mkdir()
    for name in ("cuda-debian12-x86_64.list", "cuda.sources", "other.list"):
        (lists / name).write_text("deb x\n")
    found = probe(
        tmp_path,
        {
            "cuda_toolkit": {
                "probe": "cuda",
                "args": {"home": str(tmp_path / "cuda"), "lists_dir": str(lists), "lists_pattern": "cuda-*.list"},
            },
            "nvidia_driver": {"probe": "driver", "args": {"packages": ["dpkg"], "kernel_headers": True}},
        },
    )["found"]
    assert found["cuda_toolkit"]["lists"] == [str(lists / "cuda-debian12-x86_64.list")]
    assert set(found["nvidia_driver"]["packages"]) == {"dpkg", f"linux-headers-{os.uname().release}"}
