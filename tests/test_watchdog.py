"""The acceptance watchdog on sandbox hosts, with the SGLang stand-in: it rolls a collapsed config back by itself.

Two applied b300 hosts with short windows (host_vars in the sandbox inventory: warm-up 4 s, windows of 2 s, at least
20 verify calls, 3 failures). A collapse is SGLang's own hook, SGLANG_SIMULATE_ACC_LEN, set through
`provision reconfigure --set serve.env...`; load is a bounded request loop run on the host against its own port.
The judgement's unit tests are in tests/test_watchdog_judgement.py. Needs what test_sandbox.py needs.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from provision.cli import main
from provision.sandbox import layout, machines
from tests.conftest import ROOT
from tests.test_sandbox import pytestmark  # noqa: F401 - the same requirements
from tests.test_stack import on

A, B = "b300-sbx", "b300-sbx2"
WD = {"enabled": True, "initial_delay_s": 4, "interval_s": 2, "min_verify_calls": 20, "baseline_windows": 2,
      "failure_fraction": 0.5, "failure_floor": 1.5, "failure_limit": 3}  # fmt: skip
# the longest a collapse may serve once armed: the watchdog sees it ready within a window, then the warm-up (its
# first sample is taken when the warm-up ends) and failure_limit windows
BOUND = WD["initial_delay_s"] + (WD["failure_limit"] + 1) * WD["interval_s"]
STATE = "/var/lib/private/sglang-dflash-watchdog/state.json"
RECORD = "/var/lib/dflash-provision/serving/watchdog.json"
COLLAPSE = "serve.env.SGLANG_SIMULATE_ACC_LEN=1"
# a bounded request loop on the host, against its own port (the server listens on loopback only)
LOAD = """# dflash-watchdog-load
import json, sys, time, urllib.request
key = open("/etc/sglang-dflash/api_key").read().strip()
end = time.time() + float(sys.argv[1])
while time.time() < end:
    body = json.dumps({"messages": [{"role": "user", "content": "load %f" % time.time()}], "max_tokens": 64})
    req = urllib.request.Request("http://127.0.0.1:30000/v1/chat/completions", body.encode(),
                                 {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=10).read()
    except Exception:
        time.sleep(0.2)
"""


def provision(*args: str, timeout: int = 900) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "provision", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def hosts() -> Iterator[dict[str, layout.SandboxHost]]:
    assert main(["sandbox", "up", "--hosts", "b300:2"]) == 0  # keeps running hosts
    host_vars = layout.inventory_dir() / "host_vars"
    host_vars.mkdir(exist_ok=True)
    for name in (A, B):
        (host_vars / f"{name}.yml").write_text(yaml.safe_dump({"dflash_watchdog": WD}))
    rc, out = provision("apply", "--host", "b300", "--sandbox", timeout=3600)
    assert rc == 0, out[-3000:]
    found = {h.name: h for h in layout.load_hosts()}
    yield found
    main(["sandbox", "down"])


def state(host: layout.SandboxHost) -> dict:
    out = on(host, f"cat {STATE}").stdout
    return json.loads(out) if out else {}


def record(host: layout.SandboxHost) -> dict:
    out = on(host, f"cat {RECORD} 2>/dev/null").stdout
    return json.loads(out) if out else {"failed": {}, "rollbacks": []}


def env_file(host: layout.SandboxHost) -> str:
    return on(host, "cat /etc/sglang-dflash/sglang-dflash.env").stdout.decode()


def healthy(host: layout.SandboxHost) -> bool:
    return on(host, "curl -s -o /dev/null -w %{http_code} http://127.0.0.1:30000/health").stdout == b"200"


@contextmanager
def load(*on_hosts: layout.SandboxHost, seconds: float = 120) -> Iterator[None]:
    """A bounded request loop on each host for the block's duration (and never longer than `seconds`)."""
    procs = [subprocess.Popen([*machines.ssh_command(h), f"python3 -c {shlex.quote(LOAD)} {seconds}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for h in on_hosts]  # fmt: skip
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        for h in on_hosts:
            on(h, "pkill -f 'dflash-watchdog-loa[d]' || true")  # the bracket: never the shell running pkill


def wait_for(predicate, timeout: float, step: float = 0.5):  # noqa: ANN001, ANN201 - a test helper
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(step)
    return predicate()


def watching(host: layout.SandboxHost, passed: int = 2) -> bool:
    """The watchdog judges the config serving now and its last `passed` windows passed."""
    st = state(host)
    windows = [w for w in st.get("windows", []) if w["config_id"] == st.get("config_id")]
    return len(windows) >= passed and all(w["verdict"] == "passed" for w in windows[-passed:])


def reconfigure(host: str, *sets: str, force: bool = False) -> tuple[int, str]:
    args = [a for s in sets for a in ("--set", s)]
    return provision("reconfigure", "--host", host, "--sandbox", *args, *(["--force"] if force else []))


def test_installed_hardened_and_judging(hosts) -> None:
    a = hosts[A]
    out = on(a, "systemctl is-active sglang-dflash-watchdog sglang-dflash-rollback.path").stdout.split()
    assert out == [b"active", b"active"]
    user = on(a, "systemctl show -p User -p DynamicUser --value sglang-dflash-watchdog").stdout.split()
    assert b"yes" in user
    exposure = on(a, "systemd-analyze security sglang-dflash-watchdog.service | tail -1").stdout.decode()
    assert float(exposure.split(".service: ")[1].split()[0]) <= 2.5, exposure  # "...service: 1.2 OK :-)"
    with load(a):
        assert wait_for(lambda: watching(a, passed=3), timeout=BOUND + 20), state(a)


def test_a_collapse_is_rolled_back_by_the_watchdog_alone_and_only_on_that_host(hosts, tmp_path: Path) -> None:
    a, b = hosts[A], hosts[B]
    with load(a, b, seconds=300):
        assert wait_for(lambda: watching(a) and watching(b), timeout=BOUND + 20), (state(a), state(b))
        healthy_env = env_file(a)
        rc, out = reconfigure(A, COLLAPSE)
        assert rc == 0, out
        switched_at = time.time()
        assert "SGLANG_SIMULATE_ACC_LEN" in env_file(a)

        # restarted in the middle of the analysis: it resumes from its state and asks once
        assert wait_for(lambda: state(a).get("failures", 0) >= 1, timeout=BOUND), state(a)
        failures = state(a)["failures"]
        assert on(a, "systemctl restart sglang-dflash-watchdog").returncode == 0

        rolled = wait_for(lambda: [r for r in record(a)["rollbacks"] if r["status"] == "rolled back"],
                          timeout=BOUND + 30)  # fmt: skip
        assert rolled, (state(a), record(a))
        st = state(a)
        request = rolled[0]["request"]
        # within the warm-up + failure_limit windows (+ one window to see it ready)
        assert request["at"] - switched_at <= BOUND, (request, switched_at)
        assert "3 consecutive failed windows" in request["reason"] and "below the floor" in request["reason"]
        failed_windows = [w for w in st["windows"] if w["verdict"] == "failed" and w["t"] > switched_at]
        assert [w["failures"] for w in failed_windows][:3] == [1, 2, 3]
        assert failed_windows[failures - 1]["failures"] == failures  # counted on across the restart

        # the old config serves again, and the record says why
        assert wait_for(lambda: healthy(a), timeout=60)
        assert env_file(a) == healthy_env
        assert list(record(a)["failed"].values())[0]["reason"] == request["reason"]
        # it holds: more windows, another watchdog restart, still one rollback
        assert on(a, "systemctl restart sglang-dflash-watchdog").returncode == 0
        time.sleep(BOUND)
        assert len([r for r in record(a)["rollbacks"] if r["status"] == "rolled back"]) == 1
        # the other host kept serving its config, every window passed, nothing rolled back
        b_windows = [w for w in state(b)["windows"] if w["t"] > switched_at]  # the state keeps the last 60
        assert len(b_windows) >= 10 and {w["verdict"] for w in b_windows} == {"passed"}, b_windows
        assert record(b)["rollbacks"] == []
        assert "SGLANG_SIMULATE_ACC_LEN" not in env_file(b)
    if os.environ.get("WATCHDOG_PLOT_DATA"):
        Path(os.environ["WATCHDOG_PLOT_DATA"]).write_text(
            json.dumps({"switched_at": switched_at, "settings": WD, "state": state(a), "record": record(a)})
        )

    rc, out = provision("status", "--host", A, "--sandbox")
    assert rc == 0, out
    assert "watchdog rollback" in out and "rolled back" in out and "marked failed" in out

    # the failed config is never applied again without --force: one line, exit 2, nothing changed
    rc, out = reconfigure(A, COLLAPSE)
    assert rc == 2 and out.count("\n") == 1 and "acceptance watchdog rolled this config back" in out, out
    assert env_file(a) == healthy_env


def test_a_second_collapse_after_the_rollback_holds(hosts) -> None:
    """The last good config collapses too (it was only healthy, never judged): no loop, the watchdog reports."""
    a = hosts[A]
    # C1: collapsed but unwatched; C2: collapsed and watched; the rollback restores C1, which collapses too
    rc, out = reconfigure(A, "serve.env.SGLANG_SIMULATE_ACC_LEN=1.1", "watchdog.enabled=false")
    assert rc == 0, out
    before = len(record(a)["rollbacks"])
    with load(a, seconds=300):
        rc, out = reconfigure(A, "serve.env.SGLANG_SIMULATE_ACC_LEN=1.2")
        assert rc == 0, out
        assert wait_for(lambda: len(record(a)["rollbacks"]) > before, timeout=BOUND + 30), state(a)
        assert 'SGLANG_SIMULATE_ACC_LEN="1.1"' in env_file(a)  # the env file quotes every value
        # C1 reaches failure_limit too: the watchdog holds and says so ("holding: <reason>; one rollback was made")
        assert wait_for(lambda: state(a)["phase"].startswith("holding: "), timeout=BOUND + 30), state(a)
        time.sleep(3 * WD["interval_s"])
    assert len(record(a)["rollbacks"]) == before + 1
    assert 'SGLANG_SIMULATE_ACC_LEN="1.1"' in env_file(a)  # the env file quotes every value


def test_no_traffic_or_no_metrics_gives_no_verdict(hosts) -> None:
    b = hosts[B]
    rc, out = reconfigure(B, COLLAPSE)
    assert rc == 0, out
    time.sleep(BOUND + 3 * WD["interval_s"])  # idle: every window has too few verify calls
    st = state(b)
    assert st["windows"][-1]["verdict"] == "inconclusive" and "verify calls" in st["windows"][-1]["why"]
    assert record(b)["rollbacks"] == [] and "SGLANG_SIMULATE_ACC_LEN" in env_file(b)

    # /metrics gone (the server without --enable-metrics): inconclusive under load too
    rc, out = reconfigure(B, COLLAPSE, "serve.metrics=false")
    assert rc == 0, out
    with load(b, seconds=120):
        time.sleep(BOUND + 3 * WD["interval_s"])
    st = state(b)
    assert st["windows"][-1]["why"] == "/metrics unreachable", st["windows"][-3:]
    assert record(b)["rollbacks"] == [] and "SGLANG_SIMULATE_ACC_LEN" in env_file(b)
