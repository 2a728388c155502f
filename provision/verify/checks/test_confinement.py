"""The service's sandbox, proven on the host: work run inside a transient unit that carries the installed
unit's user, environment and every hardening property (read from the unit file itself, so the check and
the service cannot drift apart).

- On GPU hosts: the GPU smoke workload (provision/verify/gpu_smoke.py: matmul on every GPU, a Triton JIT
  kernel, CUDA IPC with expandable segments, NCCL all-reduce over all GPUs) must pass inside it.
- On every host with systemd: the transient unit really is confined: seccomp and no_new_privs in
  /proc/self/status, a filtered call (fchown) fails with EPERM (not SIGSYS), pidfd_getfd is allowed, and a device
  outside the allow list cannot be opened, while the same probe outside the unit can do all of that. Where the
  host's systemd cannot enforce a device policy at all (a container without a writable devices controller), the
  device check is skipped with that reason, never passed.
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
# A character device no allow list names, for the probe: /dev/net/tun's numbers (any user may open it, so
# only the device policy can refuse it), made in /dev (other file systems may be mounted nodev).
FOREIGN_DEVICE = (10, 200)
FOREIGN_PATH = "/dev/dflash-verify-foreign"

PROBE = r"""
import ctypes, json, os, platform, sys
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": (434, 438), "aarch64": (434, 438)}[platform.machine()]
def call(nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *args)
    return result, os.strerror(ctypes.get_errno()) if result < 0 else None
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
out = {"seccomp": status["Seccomp"].strip(), "filters": int(status.get("Seccomp_filters", "0")),
       "no_new_privs": status["NoNewPrivs"].strip()}
# fchown to "no change" on a pipe we own: any process may, unless @privileged (@chown) is filtered
read_end, _ = os.pipe()
try:
    os.fchown(read_end, -1, -1)
    out["fchown"] = "ok"
except OSError as exc:
    out["fchown"] = exc.strerror
pidfd, err = call(NR[0], ctypes.c_long(os.getpid()), ctypes.c_uint(0))
out["pidfd_getfd"] = err or call(NR[1], ctypes.c_int(pidfd), ctypes.c_int(0), ctypes.c_uint(0))[1] or "ok"
# cgroup v1's devices controller, if the host has one: "/" means the unit got no devices cgroup of its own
out["devices_cgroup"] = next((line.rsplit(":", 1)[1].strip() for line in open("/proc/self/cgroup")
                              if line.split(":")[1] == "devices"), None)
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
    unit = host.file(plan["paths"]["unit"])
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


def _probe(host: Any, plan: dict[str, Any], confined: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The probe inside the transient unit and, as the same user, outside it."""
    major, minor = FOREIGN_DEVICE
    host.run_expect([0], f"rm -f {FOREIGN_PATH} && mknod -m 0666 {FOREIGN_PATH} c {major} {minor}")
    python = f"{plan['python_env']['venv']}/bin/python3"
    try:
        inside = confined([python, "-c", PROBE, FOREIGN_PATH])
        user = plan["config"]["service"]["user"]
        outside = host.run(shlex.join(["runuser", "-u", user, "--", python, "-c", PROBE, FOREIGN_PATH]))
    finally:
        host.run(f"rm -f {FOREIGN_PATH}")
    assert inside.rc == 0 and outside.rc == 0, inside.stderr[-2000:] + outside.stderr[-2000:]
    return json.loads(inside.stdout.strip().splitlines()[-1]), json.loads(outside.stdout.strip().splitlines()[-1])


def assert_filtered(inside: dict[str, Any], outside: dict[str, Any]) -> None:
    """What the unit's syscall sandbox adds to what the host (a container, maybe) imposes on the same user."""
    # the probe can tell: outside the unit the same user may fchown its own pipe
    assert outside["fchown"] == "ok", outside
    assert inside["no_new_privs"] == "1" and outside["no_new_privs"] == "0", (inside, outside)
    assert inside["seccomp"] == "2" and inside["filters"] > outside["filters"], (inside, outside)
    assert inside["fchown"] == "Operation not permitted", inside  # SystemCallErrorNumber=EPERM, no SIGSYS
    # CUDA IPC with expandable segments needs it: the unit refuses nothing here the host allows
    assert inside["pidfd_getfd"] == outside["pidfd_getfd"], (inside, outside)


def device_policy_unenforceable(inside: dict[str, Any]) -> str | None:
    """Why this host's systemd cannot apply DevicePolicy= at all, if it cannot (a container whose cgroup v1
    devices controller is read-only leaves every unit in the root devices cgroup)."""
    if inside["devices_cgroup"] == "/":
        return "the unit has no devices cgroup of its own (cgroup v1 devices controller not writable, a container)"
    return None


def test_the_service_sandbox_filters_system_calls(host: Any, plan: dict[str, Any], confined: Any) -> None:
    assert_filtered(*_probe(host, plan, confined))


def test_the_service_sandbox_refuses_other_devices(host: Any, plan: dict[str, Any], confined: Any) -> None:
    inside, outside = _probe(host, plan, confined)
    assert outside["device"] == "ok", outside  # the device policy is the only thing that can refuse it
    why = device_policy_unenforceable(inside)
    if why:
        pytest.skip(f"DevicePolicy= cannot be enforced on {host.backend.get_hostname()}: {why}")
    assert inside["device"] == "Operation not permitted", inside  # DevicePolicy=closed


def test_gpu_work_survives_the_service_sandbox(host: Any, plan: dict[str, Any], gpus: None, confined: Any) -> None:
    script = _ship(host, VERIFY / "gpu_smoke.py")
    proc = confined([f"{plan['python_env']['venv']}/bin/python3", script])
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # the host has GPUs (the gpus fixture): none inside the sandbox is the device policy failing the server
    assert proc.rc != 3, f"the GPUs are not reachable inside the service's sandbox: {report}"
    failed = {name: check for name, check in report["checks"].items() if not check["ok"]}
    assert proc.rc == 0 and not failed, failed or proc.stderr[-2000:]
