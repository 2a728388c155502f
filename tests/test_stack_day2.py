"""Day 2 on applied sandbox hosts: reconfigure (and its rollbacks, lock, block size guard), status, logs.

Runs after test_stack.py, on the hosts it applied (or applies them itself when run alone). The hosts
have no GPU: the unit runs the SGLang stand-in (provision/sandbox/sglang_double.py), whose failure modes
(SGLANG_STANDIN_FAIL=startup|crash) are set through --set serve.env, like any other config.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.cli import main
from provision.sandbox import layout
from tests.test_sandbox import pytestmark  # noqa: F401 - the same requirements
from tests.test_stack import on, recap

PROVISION = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "provision")
HOST = "b300-sbx"
LOCK = "/var/lib/dflash-provision/serving/reconfigure.lock"


def provision(*args: str, timeout: int = 600) -> tuple[int, str]:
    proc = subprocess.run([PROVISION, *args], capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def host() -> layout.SandboxHost:
    assert main(["sandbox", "up", "--hosts", "rtx6000,b300"]) == 0
    rc, out = provision("apply", "--host", "all", "--sandbox", timeout=1800)
    assert rc == 0, out[-3000:]
    yield next(h for h in layout.load_hosts() if h.name == HOST)
    main(["sandbox", "down"])


def server_info(host: layout.SandboxHost) -> dict:
    key = on(host, "cat /etc/sglang-dflash/api_key").stdout.decode().strip()
    out = on(host, f"curl -s -H 'Authorization: Bearer {key}' http://127.0.0.1:30000/get_server_info").stdout
    return json.loads(out)


def healthy(host: layout.SandboxHost) -> bool:
    code = on(host, "curl -s -o /dev/null -w %{http_code} http://127.0.0.1:30000/health_generate").stdout
    return code.decode() == "200"


# Drift: what an operator's chmod, chown or edit does to the files apply manages, and that one apply
# undoes all of it. It lives here, first of day 2, because the fixture above leaves both hosts applied
# and settled with the inventory's config (test_stack.py applied them; a fresh full apply costs
# minutes), and before the reconfigures below move the host off that config.
LIBEXEC = "/opt/dflash-provision/libexec"
MANAGED_FILES = {  # content broken too; "owner:group:mode" as apply leaves it
    "/etc/systemd/system/sglang-dflash.service": "root:root:644",
    "/etc/sglang-dflash/sglang-dflash.env": "root:root:644",
    "/etc/sglang-dflash/sglang-dflash.build.json": "root:root:644",
    "/etc/sglang-dflash/drafter.json": "root:root:644",
    "/var/lib/dflash-provision/serving/current.json": "root:root:600",
    f"{LIBEXEC}/sglang_standin.py": "root:root:644",
    f"{LIBEXEC}/sglang_argcheck.py": "root:root:644",
    f"{LIBEXEC}/triton_aot.py": "root:root:644",
    f"{LIBEXEC}/flashinfer_build.py": "root:root:644",
}
SECRET_FILES = {  # owner and mode broken only: apply must fix them without reading the key
    "/etc/sglang-dflash/secrets.env": "root:root:600",
    "/etc/sglang-dflash/api_key": "root:root:600",
}
MANAGED_DIRS = {
    "/etc/sglang-dflash": "root:root:755",
    "/var/lib/dflash-provision/serving": "root:root:700",
    "/var/cache/sglang-dflash/triton": "sglang:sglang:750",
    "/var/cache/sglang-dflash/flashinfer": "sglang:sglang:750",
    LIBEXEC: "root:root:755",
}


def snapshot(host: layout.SandboxHost) -> dict[str, str]:
    """Path to "owner:group:mode" (and the content's SHA-256 for files) of every managed path."""
    script = "".join(
        f'echo "{p} $(stat -c %U:%G:%a {p}) $(sha256sum < {p} | cut -c1-64)";' for p in [*MANAGED_FILES, *SECRET_FILES]
    ) + "".join(f'echo "{d} $(stat -c %U:%G:%a {d})";' for d in MANAGED_DIRS)
    proc = on(host, script)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return dict(line.split(" ", 1) for line in proc.stdout.decode().splitlines())


def outcomes(out: str, task: str, host: str) -> list[str]:
    """What `provision apply` printed for host under each run of the task named so ("ok", "skipped", ...)."""
    found, inside = [], False
    for line in out.splitlines():
        if line.startswith("  TASK "):
            inside = line == f"  TASK {task}"
        elif inside and line.endswith(f": {host}"):
            found.append(line.strip().split(":")[0])
    return found


def main_pid(host: layout.SandboxHost) -> str:
    return on(host, "systemctl show -p MainPID --value sglang-dflash").stdout.decode().strip()


def test_one_apply_undoes_drift_in_content_mode_and_owner_of_every_managed_path(host) -> None:
    settled = snapshot(host)
    for path, state in {**MANAGED_FILES, **SECRET_FILES, **MANAGED_DIRS}.items():
        assert settled[path].split(" ")[0] == state, (path, settled[path])
    key = on(host, "cat /etc/sglang-dflash/api_key").stdout.decode().strip()
    pid = main_pid(host)
    broken = on(
        host,
        "set -e;"
        + "".join(f"printf '\\n# drift\\n' >> {p}; chmod 0666 {p}; chown nobody:nogroup {p};" for p in MANAGED_FILES)
        + "".join(f"chmod 0644 {p}; chown nobody:nogroup {p};" for p in SECRET_FILES)
        + "".join(f"chmod 0777 {d}; chown nobody:nogroup {d};" for d in MANAGED_DIRS),
    )
    assert broken.returncode == 0, broken.stderr
    drifted = snapshot(host)
    assert all(drifted[p] != settled[p] for p in settled), drifted

    # a dry run sees it all and changes nothing
    rc, out = provision("apply", "--host", "all", "--sandbox", "--check", timeout=900)
    assert rc == 0, out[-3000:]
    assert recap(out)["b300-sbx"][1] > 0 and recap(out)["rtx6000-sbx"][1] == 0, recap(out)
    assert snapshot(host) == drifted

    rc, out = provision("apply", "--host", "all", "--sandbox", timeout=900)
    assert rc == 0, out[-3000:]
    assert recap(out)["b300-sbx"][1] > 0 and recap(out)["rtx6000-sbx"][1] == 0, recap(out)
    assert snapshot(host) == settled  # content, owner and mode of each, exactly as before the drift
    assert key not in out
    assert "WARNING: /etc/sglang-dflash/api_key was nobody:nogroup:0644 (owner:group:mode)" in out
    # the unit's content changed: the service was restarted and is ready again, with the same key
    assert main_pid(host) != pid and healthy(host)
    assert on(host, "cat /etc/sglang-dflash/api_key").stdout.decode().strip() == key

    # owner and mode alone (content intact): fixed in place, no restart, and the key is never read
    # (the probe said secrets.env carries it already)
    pid = main_pid(host)
    paths = " ".join([*MANAGED_FILES, *SECRET_FILES])
    assert on(host, f"chmod 0640 {paths} && chown :sglang {paths}").returncode == 0
    rc, out = provision("apply", "--host", "all", "--sandbox", timeout=900)
    assert rc == 0, out[-3000:]
    assert recap(out)["b300-sbx"][1] > 0, recap(out)
    assert snapshot(host) == settled
    assert outcomes(out, "Read the API key", "b300-sbx") == ["skipped"]
    assert outcomes(out, "Write the root-only environment file with the key", "b300-sbx") == ["skipped"]
    assert outcomes(out, "Make the root-only environment file root-only again", "b300-sbx") != ["skipped"]
    assert "Read the API key the probe needs" not in out and main_pid(host) == pid

    rc, out = provision("apply", "--host", "all", "--sandbox", timeout=900)
    assert rc == 0, out[-3000:]
    assert all(changed == 0 for _, changed, _, _ in recap(out).values()), recap(out)


def test_the_wheel_works_from_outside_the_checkout(host, tmp_path: Path) -> None:
    """`pip install` of the built wheel (not editable) into a fresh venv, then plan, sandbox up, apply and verify
    from an unrelated directory: the wheel carries the playbooks, roles, collection, host scripts and the
    stand-in, and its apply finds the hosts the checkout applied settled (changed=0)."""
    root, elsewhere, venv = Path(__file__).resolve().parent.parent, tmp_path / "elsewhere", tmp_path / "venv"
    elsewhere.mkdir()

    def run(*argv: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=elsewhere)

    built = run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(root))
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = (tmp_path / "dist").glob("dflash_provision-*.whl")
    assert run(sys.executable, "-m", "venv", str(venv)).returncode == 0
    installed = run(str(venv / "bin" / "pip"), "install", "-q", str(wheel))
    assert installed.returncode == 0, installed.stderr[-2000:]
    where = run(str(venv / "bin" / "python"), "-c", "from provision import paths; print(paths.data_dir())")
    assert where.stdout.strip() == str(next(venv.glob("lib/python3*/site-packages")) / "provision" / "_data")
    cli = str(venv / "bin" / "provision")
    plan = run(cli, "plan", "--host", HOST, "--sandbox", "--json")
    assert plan.returncode == 0 and json.loads(plan.stdout)["host"] == HOST, plan.stderr
    up = run(cli, "sandbox", "up", "--hosts", "rtx6000,b300")
    assert up.returncode == 0, up.stderr
    for run_number in (1, 2):
        applied = run(cli, "apply", "--host", "all", "--sandbox", "--state-dir", str(tmp_path / "runs"), timeout=1800)
        assert applied.returncode == 0, (applied.stdout + applied.stderr)[-3000:]
        tasks = {line[len("  TASK ") :] for line in applied.stdout.splitlines() if line.startswith("  TASK ")}
        changed = {t for t in tasks for h in ("b300-sbx", "rtx6000-sbx") if "changed" in outcomes(applied.stdout, t, h)}
        # the first run only records the config anew: its models are the wheel's copy (model.copy_from), the
        # same files; nothing is reinstalled, rewritten or restarted, and the next run is a no-op
        assert changed == ({"Record the config serving now"} if run_number == 1 else set()), changed
    verified = run(cli, "verify", "--host", "all", "--sandbox", "--out", str(tmp_path / "verify"), timeout=1800)
    assert verified.returncode == 0, (verified.stdout + verified.stderr)[-3000:]


@pytest.mark.parametrize(
    ("fail", "timeout", "why"),
    [("startup", 10, "not ready within 10 s (last /health_generate status 503)"),
     # a deadline far off: the crash ends the wait, not the deadline
     ("crash", 1800, "the server exited during start")],
)  # fmt: skip
def test_apply_says_why_the_server_did_not_become_ready(host, fail: str, timeout: int, why: str) -> None:
    rc, out = provision("apply", "--host", HOST, "--sandbox", "--set", f"serve.env.SGLANG_STANDIN_FAIL={fail}",
                        "--set", f"service.start_timeout_s={timeout}")  # fmt: skip
    assert rc != 0, out[-3000:]
    assert f"sglang-dflash did not become ready on /health_generate: {why}" in out, out[-3000:]
    assert f"SGLANG_STANDIN_FAIL={fail}" in out  # the journal lines of the failed start
    rc, out = provision("apply", "--host", HOST, "--sandbox")
    assert rc == 0, out[-3000:]
    assert healthy(host)


@contextlib.contextmanager
def every_start_refused(host: layout.SandboxHost) -> Iterator[None]:
    """An admin's drop-in that makes every start fail, so that systemctl itself answers with an error."""
    dropin = "/etc/systemd/system/sglang-dflash.service.d"
    assert on(host, f"mkdir -p {dropin} && printf '[Service]\\nExecStartPre=/bin/false\\n' > {dropin}/zz-test.conf"
                    " && systemctl daemon-reload").returncode == 0  # fmt: skip
    try:
        yield
    finally:
        assert on(host, f"rm -rf {dropin} && systemctl daemon-reload").returncode == 0


def test_apply_says_when_systemd_refuses_the_restart(host) -> None:
    with every_start_refused(host):
        rc, out = provision("apply", "--host", HOST, "--sandbox", "--set", "serve.env.SGLANG_STANDIN_LOAD_S=2")
        assert rc != 0, out[-3000:]
        assert "did not become ready on /health_generate: systemctl restart failed: Job for sglang-dflash" in out
    rc, out = provision("apply", "--host", HOST, "--sandbox")
    assert rc == 0, out[-3000:]
    assert healthy(host)


def test_a_stopped_and_disabled_service_is_enabled_started_and_waited_for(host) -> None:
    # the service's state is part of what apply converges: stopped and disabled by hand, one apply brings it back,
    # in one round trip (service_switch.py up); a start systemd refuses fails with systemctl's own words
    assert on(host, "systemctl disable --now sglang-dflash").returncode == 0
    # a dry run shows the start and leaves the service as it is
    rc, out = provision("apply", "--host", HOST, "--sandbox", "--check")
    assert rc == 0, out[-3000:]
    assert outcomes(out, "Enable and start the service", HOST) == ["changed"]
    state = on(host, "systemctl is-enabled sglang-dflash; systemctl is-active sglang-dflash").stdout.decode().split()
    assert state == ["disabled", "inactive"]
    with every_start_refused(host):
        rc, out = provision("apply", "--host", HOST, "--sandbox")
        assert rc != 0, out[-3000:]
        assert "did not become ready on /health_generate: systemctl start failed: Job for sglang-dflash" in out
    rc, out = provision("apply", "--host", HOST, "--sandbox")
    assert rc == 0, out[-3000:]
    assert outcomes(out, "Enable and start the service, and wait until it is ready", HOST) == ["changed"]
    assert "sglang-dflash is ready at http://127.0.0.1:30000" in out
    state = on(host, "systemctl is-enabled sglang-dflash; systemctl is-active sglang-dflash").stdout.decode().split()
    assert state == ["enabled", "active"] and healthy(host)
    rc, out = provision("apply", "--host", HOST, "--sandbox")
    assert rc == 0 and recap(out)[HOST][1] == 0, out[-3000:]


def test_reconfigure_switches_and_the_new_args_show(host) -> None:
    rc, out = provision("reconfigure", "--host", HOST, "--sandbox", "--set", "serve.draft_window=1024")
    assert rc == 0, out
    assert "serving the new config" in out
    assert server_info(host)["speculative_draft_window_size"] == 1024


@pytest.mark.parametrize(
    ("fail", "why"), [("startup", "not ready within 10 s"), ("crash", "the server exited during start")]
)
def test_a_broken_config_rolls_back_to_the_last_good_one(host, fail: str, why: str) -> None:
    rc, out = provision(
        "reconfigure", "--host", HOST, "--sandbox", "--set", "serve.draft_window=512",
        "--set", f"serve.env.SGLANG_STANDIN_FAIL={fail}", "--set", "service.start_timeout_s=10",
    )  # fmt: skip
    assert rc == 1, out
    assert why in out and "rolled back to the last good config, ready again" in out
    assert f"SGLANG_STANDIN_FAIL={fail}" in out  # the journal lines of the failed start
    assert healthy(host)
    assert server_info(host)["speculative_draft_window_size"] == 1024  # the old config serves


def test_a_second_reconfigure_while_one_runs_is_refused(host) -> None:
    slow = subprocess.Popen(
        [PROVISION, "reconfigure", "--host", HOST, "--sandbox", "--set", "serve.env.SGLANG_STANDIN_LOAD_S=8"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while on(host, f"flock -n {LOCK} true").returncode == 0:  # until the first one holds the lock
            assert time.monotonic() < deadline and slow.poll() is None, slow.stdout.read() if slow.stdout else ""
            time.sleep(0.2)
        rc, out = provision("reconfigure", "--host", HOST, "--sandbox", "--set", "serve.draft_window=2048")
        assert rc == 3, out  # ExitCode.BUSY
        assert "refused: another reconfigure is running there" in out
    finally:
        first_out = slow.communicate(timeout=300)[0]
    assert slow.returncode == 0, first_out


def test_block_size_above_the_drafters_training_is_refused(host) -> None:
    """The seed's "block size 16 with a higher budget to match" on a block-8 drafter (its config.json says 8)."""
    rc, out = provision("reconfigure", "--host", HOST, "--sandbox", "--set", "serve.block_size=16",
                        "--set", "serve.draft_window=2048")  # fmt: skip
    assert rc == 2, out
    assert "16 is above the drafter's trained block size 8" in out
    assert healthy(host)
    rc, out = provision("reconfigure", "--host", HOST, "--sandbox", "--set", "serve.block_size=16",
                        "--set", "serve.draft_window=2048", "--allow-untrained-depth")  # fmt: skip
    assert rc == 0, out
    assert "asks for depths the drafter never trained on" in out
    assert server_info(host)["speculative_num_draft_tokens"] == 16


def test_status_and_logs(host) -> None:
    rc, out = provision("status", "--host", HOST, "--sandbox")
    assert rc == 0, out
    assert "active/running" in out and "(SGLang stand-in)" in out
    assert "current: DFLASH, block 16, window 2048" in out
    assert "last_good: DFLASH, block 8" in out
    assert "GPU memory: skipped: no GPU on this host" in out
    rc, out = provision("logs", "--host", HOST, "--sandbox", "-n", "20")
    assert rc == 0 and "standin: ready" in out


def test_a_sweep_killed_in_the_middle_resumes_without_losing_or_repeating_a_cell(host, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    start = server_info(host)["speculative_num_draft_tokens"]
    args = [PROVISION, "sweep", "--host", HOST, "--sandbox", "--matrix", "sweeps/quick.yml", "--out", str(out)]
    root = Path(__file__).resolve().parent.parent
    first = subprocess.Popen(args, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 300
    while not (results.exists() and results.read_text().count("\n") >= 2):
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read() if first.stdout else ""
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the sweep (its tunnel is a thread of it), mid-config
    first.wait()
    # whole lines only: a line torn by the kill is dropped (and cut off) when the sweep resumes
    before = [json.loads(line) for line in results.read_bytes().split(b"\n")[:-1]]
    rc, log = provision(*args[1:], "--resume", timeout=900)
    assert rc in (0, 1), log  # 1: a cell of the stand-in failed; the records say which
    records = [json.loads(line) for line in results.read_text().splitlines()]
    keys = [(r["config"], r["cell"]) for r in records]
    assert len(keys) == len(set(keys)), keys  # none repeated
    assert records[: len(before)] == before  # none lost or rewritten
    cells = {"c1-in60-out32", "c4-in256-out32", "coding"}
    assert set(keys) == {(c, cell) for c in ("bs8-w2048", "bs6-w2048") for cell in cells}
    assert "done before (resumed)" in log or keys[: len(before)] == [(r["config"], r["cell"]) for r in before]
    table = (out / "report.md").read_text()
    assert "| config |" in table and "bs6-w2048" in table
    assert (out / "report.csv").exists() and (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cells = [r for r in records if r["cell"] != "coding" and r["status"] == "ok"]
    assert cells and all(r["accept_length"] > 1 for r in cells)
    # SGLang's bench_serving drove every cell (on the host, its torchvision a placeholder: no CPU build here)
    for r in cells:
        result = r["result"]
        assert (result["source"], result["tool_version"]) == ("bench_serving", "0.5.23"), result["source"]
        assert "sglang.bench_serving" not in result["command"] and " - run --placeholder " in result["command"]
        assert "--dataset-name random-ids" in result["command"] and result["command"].endswith("bench_driver.py")
        assert result["server_info"]["standin"] is True and result["placeholders"]
        # the run's own requests, not the server's figure since boot
        assert result["accept_source"].startswith("this run's requests (bench_serving's own")
        assert result["accept_length"] == r["accept_length"] and result["verify_steps"] > 0
        assert result["server_accept_length"] is not None
    assert "## Recommendation" in table and "provision reconfigure --host b300-sbx --set serve.block_size=" in table
    assert server_info(host)["speculative_num_draft_tokens"] == start  # left on the config it started with
