"""The CUDA stack's roles on fresh sandbox hosts: dry run, apply, re-apply, and real compiles per arch.

Needs what test_sandbox.py needs. What the sandbox hosts differ in from production (toolkit and
torch from PyPI wheels, torch's CPU build, SGLang's release build) is in provision/data/sandbox.yml;
the control node downloads every wheel once and ships it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from provision.cli import main
from provision.sandbox import layout, machines
from tests.conftest import ROOT
from tests.test_sandbox import pytestmark  # noqa: F401 - the same requirements

DATA = Path(__file__).resolve().parent / "data"
SITE = Path(sysconfig.get_paths()["purelib"])
CUOBJDUMP = SITE / "nvidia" / "cu13" / "bin" / "cuobjdump"
PTXAS_12_8 = SITE / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
RECAP = re.compile(r"^(\S+) : ok=(\d+) changed=(\d+) unreachable=(\d+) failed=(\d+)", re.M)


def recap(out: str) -> dict[str, tuple[int, int, int, int]]:
    return {m[1]: tuple(int(x) for x in m.groups()[1:]) for m in RECAP.finditer(out)}


def on(host: layout.SandboxHost, script: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*machines.ssh_command(host), script], input=stdin, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def fresh_hosts():
    # fresh hosts: a dry run must find everything still to do
    assert main(["sandbox", "down"]) == 0
    assert main(["sandbox", "up", "--hosts", "rtx6000,b300"]) == 0
    # left up: test_stack_day2.py goes on with these applied hosts and brings them down
    return {h.type: h for h in layout.load_hosts()}


@pytest.fixture(scope="module")
def applied(fresh_hosts, tmp_path_factory):
    state = tmp_path_factory.mktemp("runs")
    return lambda *extra: _apply(state, *extra)


def _apply(state: Path, *extra: str) -> tuple[int, str]:
    proc = subprocess.run(
        [str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "provision"), "apply", "--host", "all",
         "--sandbox", "--state-dir", str(state), *extra],
        capture_output=True, text=True, timeout=1800, env={**os.environ, "COLUMNS": "250"},  # a task name a line
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def test_check_mode_on_fresh_hosts_changes_nothing(fresh_hosts, applied) -> None:
    rc, out = applied("--check")
    assert rc == 0, out
    assert set(recap(out)) == {"rtx6000-sbx", "b300-sbx"}
    for host in fresh_hosts.values():
        proc = on(
            host,
            "test ! -e /usr/local/cuda-13.0 && test ! -e /var/cache/dflash-provision && ! dpkg -s g++"
            " && test ! -e /opt/sglang-dflash && ! getent passwd sglang && test ! -e /opt/dflash-provision",
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_apply_then_reapply_reports_no_change(applied) -> None:
    rc, out = applied()
    assert rc == 0, out
    first = recap(out)
    assert all(failed == 0 and changed > 0 for _, changed, _, failed in first.values()), first
    rc, out = applied()
    assert rc == 0, out
    second = recap(out)
    assert set(second) == {"rtx6000-sbx", "b300-sbx"}
    assert all(changed == 0 and failed == 0 and unreachable == 0 for _, changed, unreachable, failed in second.values())
    assert "driver check skipped: nvidia-smi is not installed" in out


# Every task a settled host's re-apply runs in the deploy play: the one look (the facts in the same call; the
# sandbox inventory names the hosts' systemd, so the unit is not rendered again), the OS specifics, the decision,
# the roles' argument specs at once and the one line that says so; then the host ends, and no role starts.
SETTLED_TASKS = [
    "Look at the whole host at once (read-only), gather its facts, and refuse what apply did not create",
    "Refuse a release the roles do not support",
    "Load what differs between the supported releases",
    "Decide from the look what differs, per role",
    "Check the roles' variables against their argument specs, at once",
    "Say that every role's part is as planned",
    "End the play for the settled host",
]


def deploy_tasks_run(out: str) -> list[str]:
    """The deploy play's tasks that ran on a host (not skipped), as `provision apply` shows them."""
    ran, name, statuses = [], None, []
    play = out[out.index("PLAY Deploy") :]
    for line in [*play[: play.index("PLAY RECAP")].splitlines(), "  TASK"]:
        if line.startswith("  TASK"):
            if name is not None and not (statuses and all(st.startswith("skipped") for st in statuses)):
                ran.append(name)
            name, statuses = line[len("  TASK ") :], []
        elif line.startswith("    ") and name is not None and not line.startswith("      "):
            statuses.append(line.strip())
    return ran


def test_a_settled_host_takes_one_look_and_no_role_starts(fresh_hosts, applied) -> None:
    rc, out = applied("--limit", "b300-sbx")
    assert rc == 0, out
    assert recap(out)["b300-sbx"][1] == 0
    assert deploy_tasks_run(out) == SETTLED_TASKS
    # the driver role's install is off here: what its check found is said in the same line
    assert "settled: every role's part is as planned" in out
    assert "driver check skipped: nvidia-smi is not installed" in out


# the task each role's look again ends with: it runs only where an earlier role's changes reached the role
RELOOK = "Start again from a look that holds"


def test_a_host_whose_systemd_is_not_the_plans_gets_its_own_unit(fresh_hosts, applied, tmp_path) -> None:
    """The plan play reaches no host: it renders the unit for the version the inventory names (here 255, where the
    host runs Debian 12's 252), and the look, which reads the host's systemd in the same call, has it rendered again
    for 252. A dry run of the settled host then finds the unit as planned: the 255 unit (RestartSteps=) would differ."""
    rc, out = applied("--limit", "b300-sbx")
    assert rc == 0, out
    inventory = yaml.safe_load((layout.inventory_dir() / "hosts.yml").read_text())
    dflash_set = {**inventory["all"]["children"]["sandbox"]["vars"]["dflash_set"], "service.systemd_version": 255}
    other = tmp_path / "systemd-255.yml"
    other.write_text(yaml.safe_dump({"all": {"hosts": {"b300-sbx": {"dflash_set": dflash_set}}}}))
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", str(layout.inventory_dir()), "-i", str(other), "--limit", "b300-sbx",
         "--check", "playbooks/b300.yml"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
             "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    rendered = out[out.index("TASK [Render the unit for the host's own systemd]") :]
    assert rendered.split("\n")[1].startswith("ok: [b300-sbx]"), rendered[:500]
    assert re.search(r"^b300-sbx\s+: ok=\d+\s+changed=0 ", out, re.M), out[-3000:]
    assert "settled: every role" in out  # (the yaml callback doubles the quote in role's)


def test_a_drifted_file_no_later_role_reads_is_put_back_without_a_second_look(fresh_hosts, applied) -> None:
    host = fresh_hosts["b300"]
    aot = "/opt/dflash-provision/libexec/triton_aot.py"
    settled = on(host, f"sha1sum {aot}").stdout
    assert on(host, f"echo '# drift' >> {aot}").returncode == 0
    rc, out = applied("--limit", "b300-sbx")
    assert rc == 0, out
    assert recap(out)["b300-sbx"][1] == 1
    assert on(host, f"sha1sum {aot}").stdout == settled
    ran = deploy_tasks_run(out)
    assert "Ship the ahead-of-time compile check" in ran
    # the script lies in a directory later roles check, but none reads the script: the play's look still holds
    assert RELOOK not in ran, ran
    # the driver's part was as the look found it (install off): its report, said once, and the role ends at once
    assert "Say that the install is off, and what the play's look found" in ran, ran
    assert "Refuse the control node, and what the argument spec cannot check" not in ran, ran
    assert out.count("driver check skipped: nvidia-smi is not installed") == 1, out


def test_a_package_removed_from_the_venv_is_installed_again(fresh_hosts, applied) -> None:
    # the look reads what is installed now, not only the stamp of the last install
    host = fresh_hosts["b300"]
    site = "/opt/sglang-dflash/venv/lib/python3*/site-packages"
    gone = on(host, "/opt/sglang-dflash/venv/bin/python3 -m pip uninstall -y -q triton && ls -d " + site + "/triton-*")
    assert gone.returncode != 0, gone.stdout
    rc, out = applied("--limit", "b300-sbx")
    assert rc == 0, out
    assert recap(out)["b300-sbx"][1] >= 1
    # an install into the venv reaches what the roles after python_env look at: the next one looks again
    assert RELOOK in deploy_tasks_run(out)
    assert on(host, "ls -d " + site + "/triton-3.*.dist-info").returncode == 0
    rc, out = applied("--limit", "b300-sbx")
    assert rc == 0, out
    assert recap(out)["b300-sbx"][1] == 0


def nvcc_cubin(host: layout.SandboxHost, sm: str, tmp_path: Path, resolve: str) -> tuple[str, str]:
    """tests/data/add.cu built for `sm` by the host's /usr/local/cuda nvcc: (`readlink -f resolve` on the host,
    the cubin's ELF list by this machine's cuobjdump)."""
    proc = on(
        host,
        f"set -e; cat > /tmp/add.cu; /usr/local/cuda/bin/nvcc -cubin -arch={sm} -o /tmp/add.cubin /tmp/add.cu;"
        f" readlink -f {resolve}; cat /tmp/add.cubin >&2",
        stdin=(DATA / "add.cu").read_bytes(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cubin = tmp_path / "add.cubin"
    cubin.write_bytes(proc.stderr)
    listing = subprocess.run([str(CUOBJDUMP), "--list-elf", str(cubin)], capture_output=True, text=True, check=True)
    return proc.stdout.decode().strip(), listing.stdout


@pytest.mark.parametrize(("host_type", "sm"), [("b300", "sm_103a"), ("rtx6000", "sm_120a")])
def test_the_hosts_toolkit_compiles_for_its_arch(fresh_hosts, applied, tmp_path: Path, host_type: str, sm: str) -> None:
    home, listing = nvcc_cubin(fresh_hosts[host_type], sm, tmp_path, "/usr/local/cuda")
    assert home == "/opt/dflash-provision/toolkits/cuda-13.0/nvidia/cu13"
    assert f".{sm}.cubin" in listing


def test_cuda_12_8_cannot_build_sm_103a(tmp_path: Path) -> None:
    """Why the plan refuses CUDA 12.8 on B300: its ptxas does not know the target (sm_120a it does)."""
    ptx = DATA / "add.ptx"
    ok = subprocess.run(
        [str(PTXAS_12_8), "-arch=sm_120a", "-o", str(tmp_path / "a.cubin"), str(ptx)], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run(
        [str(PTXAS_12_8), "-arch=sm_103a", "-o", str(tmp_path / "b.cubin"), str(ptx)], capture_output=True, text=True
    )
    assert refused.returncode != 0
    assert "Value 'sm_103a' is not defined for option 'gpu-name'" in refused.stderr
    version = subprocess.run([str(PTXAS_12_8), "--version"], capture_output=True, text=True, check=True).stdout
    assert "release 12.8" in version


VENV = "/opt/sglang-dflash/venv"
AOT = "/opt/dflash-provision/libexec/triton_aot.py"


def host_plan(host: str, *extra: str) -> dict:
    proc = subprocess.run(
        [str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "provision"), "plan", "--host", host,
         "--sandbox", "--json", *extra],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(proc.stdout)


@pytest.mark.parametrize(("host_type", "cc"), [("b300", 103), ("rtx6000", 120)])
def test_triton_compiles_for_the_arch_with_the_roles_environment(fresh_hosts, applied, host_type: str, cc: int) -> None:
    host = fresh_hosts[host_type]
    env = {k: v for k, v in host_plan(host.name)["env"].items() if k.startswith("TRITON_")}
    assigns = " ".join(f"{k}={v}" for k, v in env.items())
    proc = on(host, f"{assigns} {VENV}/bin/python3 {AOT} --cc {cc}")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    result = json.loads(proc.stdout.decode().splitlines()[-1])
    assert result["ok"] and result["cubin_bytes"] > 0 and result["triton"] == "3.8.0"
    # the cache the service keeps, owned by its account
    owner = on(host, "stat -c %U:%a /var/cache/sglang-dflash/triton").stdout.decode().strip()
    assert owner == "sglang:750"


def test_sglang_refuses_a_launch_command_its_parser_rejects(applied) -> None:
    """A value the plan cannot judge (extra_args are read with SGLang's grammar, their values are not) reaches
    the build's own parser, which refuses it before the service is touched; a release build claiming the
    DDTree PR's dialect is refused by the plan already."""
    rc, out = applied("--limit", "b300-sbx", "--set", 'serve.extra_args=["--schedule-policy", "bogus"]')
    assert rc != 0, out
    assert "the installed SGLang (sglang==0.5.23, dialect sglang-0.5.23) refuses the launch command" in out
    assert "argument --schedule-policy: invalid choice: 'bogus'" in out
    rc, out = applied(
        "--limit", "b300-sbx", "--set", "sglang.dialect=ddtree-pr29907", "--set", "serve.algorithm=DDTREE"
    )
    assert rc == 2 and "speaks only its own dialect sglang-0.5.23" in out, out[-2000:]


def exposure(host: layout.SandboxHost) -> float:
    out = on(host, "systemd-analyze security sglang-dflash.service --no-pager").stdout.decode()
    found = re.search(r"Overall exposure level for sglang-dflash.service: ([0-9.]+)", out)
    assert found, out[-2000:]
    return float(found[1])


def http_code(host: layout.SandboxHost, path: str, key: str | None = None) -> str:
    auth = f"-H 'Authorization: Bearer {key}'" if key else ""
    return on(host, f"curl -s -o /dev/null -w %{{http_code}} {auth} http://127.0.0.1:30000{path}").stdout.decode()


@pytest.mark.parametrize("host_type", ["b300", "rtx6000"])
def test_service_serves_behind_the_standin_hardened(fresh_hosts, applied, host_type: str) -> None:
    host = fresh_hosts[host_type]
    unit = "sglang-dflash"
    pid = f"$(systemctl show -p MainPID --value {unit})"
    script = f"systemctl is-active {unit}; systemctl is-enabled {unit}; ps -o user= -p {pid}"
    state = on(host, script).stdout.decode().split()
    assert state == ["active", "enabled", "sglang"]
    assert exposure(host) <= 2.5
    # the unit is the plan's, rendered for the host's own systemd (252 here: no RestartSteps=, which it
    # would log as an unknown key)
    version = int(on(host, "systemctl --version").stdout.decode().split()[1])
    plan = host_plan(host.name, "--set", f"service.systemd_version={version}")
    assert on(host, "cat /etc/systemd/system/sglang-dflash.service").stdout.decode() == plan["unit"]
    assert "SGLang stand-in" in plan["unit"] and "\nRestartSteps=" not in plan["unit"] and version < 254
    assert "Unknown key" not in on(host, "journalctl -b --no-pager").stdout.decode()  # systemd logs it as itself
    key = on(
        host, "stat -c %a:%U /etc/sglang-dflash/api_key /etc/sglang-dflash/secrets.env; cat /etc/sglang-dflash/api_key"
    )
    mode_key, mode_secrets, value = key.stdout.decode().split()
    assert mode_key == mode_secrets == "600:root" and len(value) == 40
    assert http_code(host, "/health_generate") == "200"
    assert http_code(host, "/v1/models") == "401"
    assert http_code(host, "/v1/models", value) == "200"
    assert http_code(host, "/metrics") == "200"
    # with speculative decoding on, the server reports its acceptance (the stand-in's figure, not a GPU's)
    info = on(host, f"curl -s -H 'Authorization: Bearer {value}' http://127.0.0.1:30000/get_server_info").stdout
    args = json.loads(info)
    assert args["standin"] is True and args["speculative_algorithm"] == "DFLASH"


def test_reapply_keeps_the_service_running_and_the_key_out_of_the_output(fresh_hosts, applied) -> None:
    host = fresh_hosts["b300"]
    pid = on(host, "systemctl show -p MainPID --value sglang-dflash").stdout.decode().strip()
    rc, out = applied("--limit", "b300-sbx")
    assert rc == 0, out
    assert recap(out)["b300-sbx"][1] == 0
    assert on(host, "systemctl show -p MainPID --value sglang-dflash").stdout.decode().strip() == pid
    key = on(host, "cat /etc/sglang-dflash/api_key").stdout.decode().strip()
    assert key not in out


def test_reapply_follows_a_rotated_key_and_starts_a_stopped_service(fresh_hosts, applied) -> None:
    host = fresh_hosts["rtx6000"]
    old = on(host, "cat /etc/sglang-dflash/api_key").stdout.decode().strip()
    new = secrets.token_hex(20)
    on(host, f"umask 077; printf '%s\\n' {new} > /etc/sglang-dflash/api_key; systemctl stop sglang-dflash")
    rc, out = applied("--limit", "rtx6000-sbx")
    assert rc == 0, out
    assert recap(out)["rtx6000-sbx"][1] >= 1
    assert "sglang-dflash is ready at" in out
    assert on(host, "cat /etc/sglang-dflash/secrets.env").stdout.decode() == f"SGLANG_DFLASH_API_KEY={new}\n"
    assert http_code(host, "/v1/models", new) == "200"
    assert http_code(host, "/v1/models", old) == "401"
    assert new not in out
    # settled now: the probe alone decides, nothing is restarted or waited for
    rc, out = applied("--limit", "rtx6000-sbx")
    assert rc == 0, out
    assert recap(out)["rtx6000-sbx"][1] == 0
    assert "is ready at" not in out


def test_a_restart_apply_asks_for_is_never_refused_by_the_units_start_limit(fresh_hosts, applied) -> None:
    # StartLimitBurst=5 in StartLimitIntervalSec=600 bounds a crash loop; systemd counts deliberate starts too,
    # so five restarts spend the budget, and the restart a drifted env file asks for must still happen
    host = fresh_hosts["b300"]
    restarts = "for i in 1 2 3 4 5 6; do systemctl restart sglang-dflash; done"
    spent = on(host, f"{restarts}; systemctl is-active sglang-dflash")
    assert b"failed" in spent.stdout or spent.returncode != 0, spent.stdout  # the limit is real on this host
    on(host, "echo '# drift' >> /etc/sglang-dflash/sglang-dflash.env")
    rc, out = applied("--limit", "b300-sbx")
    assert rc == 0, out
    assert "sglang-dflash is ready at" in out
    assert on(host, "systemctl is-active sglang-dflash").stdout.decode().strip() == "active"


def test_verify_passes_with_the_gpu_checks_skipped(applied, tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "provision"), "verify", "--host", "all",
         "--sandbox", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    records = json.loads((tmp_path / "verify.json").read_text())
    by = {(r["host"], r["check"]): r for r in records}
    assert {h for h, _ in by} == {"rtx6000-sbx", "b300-sbx"}
    for host in ("rtx6000-sbx", "b300-sbx"):
        for check in ("gpus_match_the_profile", "triton_runs_on_every_gpu", "flashinfer_builds_and_runs_on_every_gpu"):
            assert by[host, check]["outcome"] == "skipped"
            assert by[host, check]["reason"] == f"no GPU on {host}: nvidia-smi is not installed"
        for check in (
            "nvcc_compiles_for_the_arch",
            "triton_compiles_for_the_arch",
            "health_generate_answers_200",
            "a_completion_returns_tokens",
            "a_request_without_the_key_is_refused",
            "listens_only_on_the_configured_address",
            "speculative_decoding_accepts_more_than_one_token",
        ):
            assert by[host, check]["outcome"] == "passed", by[host, check]
    assert "passed (stand-in)" in proc.stdout
    assert (tmp_path / "verify.xml").read_text().startswith("<?xml")


def test_triton_3_5_needs_the_toolkit_ptxas_for_sm_103a(fresh_hosts, applied) -> None:
    """Triton 3.5's bundled ptxas (CUDA 12.8) refuses sm_103a; with the override it compiles. Runs last: it
    leaves Triton 3.5.1 in the b300 host's venv."""
    rc, out = applied("--limit", "b300-sbx", "--set", "triton.version=3.5.1")
    assert rc == 0, out
    assert "Triton 3.5.1 bundled ptxas: refused sm_103a" in out
    assert "Value 'sm_103a' is not defined for option 'gpu-name'" in out
    assert "with the toolkit ptxas (TRITON_PTXAS_PATH, TRITON_PTXAS_BLACKWELL_PATH): compiled sm_103a" in out
