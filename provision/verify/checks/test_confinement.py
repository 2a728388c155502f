"""The service's sandbox, proven on the host: work run inside a transient unit that carries the installed
unit's user, environment and every hardening property (read from the unit file itself, so the check and
the service cannot drift apart).

- On GPU hosts: the GPU smoke workload (provision/verify/gpu_smoke.py: matmul on every GPU, a Triton JIT
  kernel, CUDA IPC with expandable segments, NCCL all-reduce over all GPUs) must pass inside it.
- On every host with systemd: the transient unit really is confined: seccomp and no_new_privs in
  /proc/self/status, a filtered call fails with EPERM (not SIGSYS), pidfd_getfd is allowed, and a device
  outside the allow list cannot be opened, while the same probe outside the unit can do all of that.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

VERIFY = Path(__file__).resolve().parent.parent
WORK_DIR = "/run/dflash-verify"
# What belongs to running the server, not to its sandbox: left to systemd-run's own defaults.
NOT_SANDBOX = {
    "Type", "ExecStart", "Restart", "RestartSec", "RestartSteps", "RestartMaxDelaySec", "TimeoutStartSec",
    "TimeoutStopSec", "KillSignal", "KillMode",
}  # fmt: skip
# A character device no allow list names, made under WORK_DIR for the probe (/dev/net/tun's numbers:
# any user may open it, so only the device policy can refuse it).
FOREIGN_DEVICE = (10, 200)

PROBE = r"""
import ctypes, json, os, platform, sys
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": (310, 434, 438), "aarch64": (270, 434, 438)}[platform.machine()]
def call(nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *args)
    return result, os.strerror(ctypes.get_errno()) if result < 0 else None
class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
src, dst = ctypes.create_string_buffer(b"dflash!!"), ctypes.create_string_buffer(8)
local, remote = Iovec(ctypes.addressof(dst), 8), Iovec(ctypes.addressof(src), 8)
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
out = {"seccomp": status["Seccomp"].strip(), "no_new_privs": status["NoNewPrivs"].strip()}
# reading our own memory: any process may, unless @debug is filtered
out["process_vm_readv"] = call(NR[0], ctypes.c_long(os.getpid()), ctypes.byref(local), ctypes.c_ulong(1),
                               ctypes.byref(remote), ctypes.c_ulong(1), ctypes.c_ulong(0))[1] or "ok"
pidfd, err = call(NR[1], ctypes.c_long(os.getpid()), ctypes.c_uint(0))
out["pidfd_getfd"] = err or call(NR[2], ctypes.c_int(pidfd), ctypes.c_int(0), ctypes.c_uint(0))[1] or "ok"
try:
    os.close(os.open(sys.argv[1], os.O_RDWR))
    out["device"] = "ok"
except OSError as exc:
    out["device"] = exc.strerror
print(json.dumps(out))
"""


def sandbox_properties(unit_text: str) -> list[str]:
    """The [Service] section's assignments, in order, as systemd-run -p takes them. Transient properties
    get no specifier expansion, so the unit's %% goes back to %."""
    props, section = [], ""
    for raw in unit_text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        key, _, value = line.partition("=")
        if section == "[Service]" and key not in NOT_SANDBOX:
            props.append(f"{key}={value.replace('%%', '%')}")
    return props


@pytest.fixture
def confined(host: Any, plan: dict[str, Any]) -> Any:
    """Run a command in a transient unit with the installed unit's sandbox: (rc, stdout, stderr)."""
    if not host.exists("systemd-run") or host.run("test -d /run/systemd/system").rc != 0:
        pytest.skip(f"no systemd on {host.backend.get_hostname()}: the service is not deployed there")
    name = plan["config"]["service"]["name"]
    unit = host.file(f"/etc/systemd/system/{name}.service")
    if not unit.exists:
        pytest.skip(f"{name}.service is not installed on {host.backend.get_hostname()}")
    props = [a for p in sandbox_properties(unit.content_string) for a in ("-p", p)]
    host.run_expect([0], f"install -d -m 0755 {WORK_DIR}")

    def run(argv: list[str], timeout_s: int = 1800) -> Any:
        base = ["timeout", str(timeout_s), "systemd-run", "--wait", "--pipe", "--collect", "--quiet", *props, "--"]
        return host.run(shlex.join([*base, *argv]) + " </dev/null")

    return run


def _ship(host: Any, source: Path) -> str:
    target = f"{WORK_DIR}/{source.name}"
    host.run_expect(
        [0], f"cat > {target} <<'DFLASH_VERIFY_EOF'\n{source.read_text()}DFLASH_VERIFY_EOF\nchmod 0644 {target}"
    )
    return target


def test_the_service_sandbox_is_really_applied(host: Any, plan: dict[str, Any], confined: Any) -> None:
    major, minor = FOREIGN_DEVICE
    device = f"{WORK_DIR}/foreign-device"
    host.run_expect([0], f"rm -f {device} && mknod -m 0666 {device} c {major} {minor}")
    python = f"{plan['python_env']['venv']}/bin/python3"
    inside = confined([python, "-c", PROBE, device])
    assert inside.rc == 0, inside.stderr[-2000:]
    got = json.loads(inside.stdout.strip().splitlines()[-1])
    user = plan["config"]["service"]["user"]
    outside = host.run(shlex.join(["runuser", "-u", user, "--", python, "-c", PROBE, device]))
    assert outside.rc == 0, outside.stderr[-2000:]
    free = json.loads(outside.stdout.strip().splitlines()[-1])
    # the probe can tell: outside the unit, as the same user, everything is allowed
    assert free["process_vm_readv"] == "ok" and free["device"] == "ok", free
    assert got["seccomp"] == "2" and got["no_new_privs"] == "1", got
    assert got["process_vm_readv"] == "Operation not permitted", got  # SystemCallErrorNumber=EPERM, not SIGSYS
    assert got["pidfd_getfd"] == "ok", got  # CUDA IPC with expandable segments needs it
    assert got["device"] == "Operation not permitted", got  # DevicePolicy=closed


def test_gpu_work_survives_the_service_sandbox(host: Any, plan: dict[str, Any], gpus: None, confined: Any) -> None:
    script = _ship(host, VERIFY / "gpu_smoke.py")
    proc = confined([f"{plan['python_env']['venv']}/bin/python3", script])
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # the host has GPUs (the gpus fixture): none inside the sandbox is the device policy failing the server
    assert proc.rc != 3, f"the GPUs are not reachable inside the service's sandbox: {report}"
    failed = {name: check for name, check in report["checks"].items() if not check["ok"]}
    assert proc.rc == 0 and not failed, failed or proc.stderr[-2000:]
