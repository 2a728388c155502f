"""The seccomp harness (the unit's syscall sandbox without systemd) and the GPU smoke workload's reporting.

CPU only: the parsing is checked on literal and rendered units, and the filter is really loaded on this machine
(x86-64, libseccomp) around small Python programs that make a refused call.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "provision" / "verify" / "seccomp_harness.py"
SMOKE = ROOT / "provision" / "verify" / "gpu_smoke.py"
GROUPS = ROOT / "provision" / "data" / "syscall_groups.json"
BEFORE = ROOT / "docs" / "h200" / "unit-before.service"
AFTER = ROOT / "docs" / "h200" / "unit-after.service"
REMOVED = "@privileged @mount @swap @reboot @module @raw-io @debug @cpu-emulation @obsolete"


def _load(path: Path) -> ModuleType:
    # loaded by path, as the hosts run them: they are scripts, not modules of `provision`
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


harness = _load(HARNESS)


@pytest.fixture(scope="module")
def groups() -> dict[str, set[str]]:
    return harness.load_groups(GROUPS)[0]


def allowed(unit: str, groups: dict[str, set[str]]) -> set[str]:
    sb = harness.parse_unit(unit, groups)
    assert sb.allow_list and not sb.unknown, sb.unknown
    return sb.filter


def test_groups_are_systemd_252s_own_expansion(groups: dict[str, set[str]]) -> None:
    data = json.loads(GROUPS.read_text())
    assert data["systemd_version"].startswith("252 (") and data["source"] == "systemd-analyze syscall-filter"
    assert not any(n.startswith("@") for names in groups.values() for n in names), "nested groups left unexpanded"
    # the figures the H200 finding rests on: 358 names, and pidfd_getfd only in @debug
    assert len(allowed("[Service]\nSystemCallFilter=@system-service\nSystemCallFilter=~" + REMOVED, groups)) == 358
    assert "pidfd_getfd" in groups["@debug"] and "pidfd_getfd" not in groups["@system-service"]
    assert {"execve", "futex", "mmap"} <= groups["@system-service"]


def test_the_old_unit_refuses_pidfd_getfd_and_the_new_one_allows_only_that_more(groups: dict[str, set[str]]) -> None:
    before, after = allowed(BEFORE.read_text(), groups), allowed(AFTER.read_text(), groups)
    assert "pidfd_getfd" not in before
    assert after - before == {"pidfd_getfd"} and before <= after
    assert not {"reboot", "ptrace", "mount", "init_module", "swapon"} & after
    assert harness.parse_unit(BEFORE.read_text(), groups).errno_name is None
    assert harness.parse_unit(AFTER.read_text(), groups).errno_name == "EPERM"


def test_systemd_line_semantics(groups: dict[str, set[str]]) -> None:
    # a ~ line after an allow list removes; a later plain line adds back, whatever group it came from
    sb = harness.parse_unit(
        "[Service]\nSystemCallFilter=@basic-io\nSystemCallFilter=~read\nSystemCallFilter=read", groups
    )
    assert sb.allow_list and "read" in sb.filter and groups["@default"] <= sb.filter
    sb = harness.parse_unit("[Service]\nSystemCallFilter=@basic-io\nSystemCallFilter=~read write", groups)
    assert not {"read", "write"} & sb.filter
    # a first ~ line makes a deny list; @default is not added to it
    sb = harness.parse_unit("[Service]\nSystemCallFilter=~@reboot\nSystemCallFilter=kexec_load", groups)
    assert not sb.allow_list and sb.filter == groups["@reboot"] - {"kexec_load"}
    # an empty assignment resets the list and its mode; lines of another section are not read
    sb = harness.parse_unit("[Service]\nSystemCallFilter=~@reboot\nSystemCallFilter=\nSystemCallFilter=read", groups)
    assert sb.allow_list and sb.filter == groups["@default"] | {"read"}
    assert not harness.parse_unit("[Unit]\nSystemCallFilter=read\n", groups).has_filter
    sb = harness.parse_unit("[Service]\nSystemCallFilter=@no-such-group nosuchcall\n", groups)
    assert sb.unknown == ["@no-such-group", "nosuchcall"]
    fam = harness.parse_unit(
        "[Service]\nRestrictAddressFamilies=AF_UNIX AF_INET\nRestrictAddressFamilies=~AF_INET", groups
    )
    assert fam.families_allow and fam.families == {"AF_UNIX"}
    none = harness.parse_unit("[Service]\nRestrictAddressFamilies=none\n", groups)
    assert none.families_allow and not none.families


def test_the_rendered_unit_is_the_one_proven_on_the_h200(plan_json: Callable[..., dict]) -> None:
    """docs/h200/unit-after.service is what the H200 run used: it must stay the unit the role renders."""
    groups = harness.load_groups(GROUPS)[0]
    keys = ("allow_list", "filter", "errno_name", "archs", "families_allow", "families", "no_new_privs")
    rendered = harness.parse_unit(plan_json("--host", "b300")["unit"], groups)
    proven = harness.parse_unit(AFTER.read_text(), groups)
    assert {k: getattr(rendered, k) for k in keys} == {k: getattr(proven, k) for k in keys}
    assert rendered.caps_bounding == set() and not rendered.unknown


def test_print_lists_the_allow_list() -> None:
    out = subprocess.run([sys.executable, str(HARNESS), str(AFTER), "--print"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    names = out.stdout.split()
    assert "pidfd_getfd" in names and "reboot" not in names and names == sorted(names) and len(names) == 359


# --- the filter really loaded ------------------------------------------------------------------------------

needs_seccomp = pytest.mark.skipif(
    platform.machine() != "x86_64" or not ctypes.util.find_library("seccomp"),
    reason="the programs below use x86-64 syscall numbers and need libseccomp.so.2",
)

# x86-64 numbers, called through libc's syscall(): no glibc wrapper version matters
PROBE = """
import ctypes, errno, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    rc = libc.syscall(nr, *args)
    return "ok" if rc >= 0 else errno.errorcode[ctypes.get_errno()]
res = {"pidfd_getfd": call(438, -1, 0, 0), "reboot": call(169, 0, 0, 0, 0)}
for fam in ("AF_INET", "AF_PACKET"):
    try:
        socket.socket(getattr(socket, fam), socket.SOCK_DGRAM).close(); res[fam] = "ok"
    except OSError as exc:
        res[fam] = errno.errorcode[exc.errno]
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
res["Seccomp"], res["NoNewPrivs"] = status["Seccomp"].strip(), status["NoNewPrivs"].strip()
print(__import__("json").dumps(res))
"""


def run_under(unit: Path, *cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HARNESS), str(unit), "--", *cmd], capture_output=True, text=True, timeout=120, env=env
    )


@needs_seccomp
def test_new_unit_refuses_with_eperm_and_lets_pidfd_getfd_reach_the_kernel() -> None:
    proc = run_under(AFTER, sys.executable, "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    # EBADF: the call reached the kernel (fd -1); reboot is refused by the filter, not by a missing capability
    assert res["pidfd_getfd"] == "EBADF"
    assert res["reboot"] == "EPERM"
    assert res["AF_INET"] == "ok" and res["AF_PACKET"] == "EAFNOSUPPORT"
    assert res["Seccomp"] == "2" and res["NoNewPrivs"] == "1"
    assert "mode allow-list, " in proc.stderr and "refused calls: errno EPERM" in proc.stderr


@needs_seccomp
def test_old_unit_kills_the_process_with_sigsys_on_pidfd_getfd() -> None:
    proc = run_under(BEFORE, sys.executable, "-c", PROBE)
    assert proc.returncode == -signal.SIGSYS, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "refused calls: kill-process" in proc.stderr


@needs_seccomp
def test_old_unit_with_eperm_fails_the_call_instead(tmp_path: Path) -> None:
    unit = tmp_path / "eperm.service"
    unit.write_text(BEFORE.read_text() + "SystemCallErrorNumber=EPERM\n")
    proc = run_under(unit, sys.executable, "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["pidfd_getfd"] == "EPERM"


@needs_seccomp
def test_a_deny_list_refuses_only_what_it_lists(tmp_path: Path) -> None:
    unit = tmp_path / "deny.service"
    unit.write_text("[Service]\nSystemCallFilter=~@debug\nSystemCallErrorNumber=EPERM\n")
    proc = run_under(unit, sys.executable, "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["pidfd_getfd"] == "EPERM" and res["AF_PACKET"] != "EAFNOSUPPORT"
    assert res["NoNewPrivs"] == "0" or os.geteuid() != 0  # NoNewPrivileges= unset: not set by the harness


# --- the smoke workload's reporting, with a planted torch ----------------------------------------------------

FAKE_TORCH = """
import ctypes, os
__version__ = "0+planted"
class version:
    cuda = None
class cuda:
    @staticmethod
    def device_count():
        return 1
def Generator():
    # the first thing the matmul check does: a call the old unit kills for
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(438, -1, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
"""


def planted_env(tmp_path: Path, torch_init: str) -> dict[str, str]:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(torch_init)
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_smoke_without_torch_exits_3_with_the_reason(tmp_path: Path) -> None:
    env = planted_env(tmp_path, "raise ImportError('planted: no torch here')\n")
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, str(SMOKE), "--json-out", str(out)], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 3, proc.stderr
    report = json.loads(proc.stdout)
    assert report["skipped"] == "no torch: ImportError: planted: no torch here" and report["checks"] == {}
    assert json.loads(out.read_text()) == report


@needs_seccomp
def test_smoke_reports_each_check_and_names_the_signal(tmp_path: Path) -> None:
    env = planted_env(tmp_path, FAKE_TORCH)
    proc = run_under(BEFORE, sys.executable, str(SMOKE), "--timeout", "60", env=env)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    checks = report["checks"]
    assert report["gpus"] == 1 and report["ok"] is False and set(checks) == {
        "matmul", "triton", "ipc", "ipc_legacy", "nccl",
    }  # fmt: skip
    # the killed check is named with its signal; the others still ran and failed on their own
    assert checks["matmul"]["status"] == "killed" and checks["matmul"]["signal"] == "SIGSYS"
    assert checks["triton"]["status"] == "failed" and "triton" in checks["triton"]["detail"]
    assert all(c["status"] == "failed" for n, c in checks.items() if n != "matmul")
    # under the new unit the same call fails in the program, which reports it
    proc = run_under(AFTER, sys.executable, str(SMOKE), "--only", "matmul", env=env)
    matmul = json.loads(proc.stdout)["checks"]["matmul"]
    assert matmul["status"] == "failed" and "Bad file descriptor" in matmul["detail"]
