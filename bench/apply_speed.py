"""Apply speed on sandbox hosts, as ratios measured side by side in one run (root; brings hosts up and down).

  no-op re-apply / floor : `provision apply`, and plain ansible-playbook, on an applied host vs
                           bench/floor.yml (gather the same facts, ping)
  drifted re-apply / floor: plain ansible-playbook on the same host after one managed file was changed
                           (each of DRIFTS in turn: its content edited), and the file checked back as it was;
                           where the correction restarts the server, also apply's share: the re-apply less
                           the server's own start (restart to ready), as the role's readiness wait reports it
  fleet 3 / fleet 1      : applying to 3 fresh b300 hosts vs 1 fresh one, each with cold control-side
                           caches (the wheels are downloaded and the FlashInfer modules built once per
                           run, for the whole fleet); --fleet-rounds N alternates the two N times and
                           prints each round and the medians (one pair varies by a third between runs here)

Usage: .venv/bin/python bench/apply_speed.py [--repeat N] [--fleet-rounds N] [--skip-warm] [--noop-only]
                                             [--mitogen] [--profile DIR]

--noop-only measures the no-op re-apply alone, on the b300 sandbox host: it keeps one already up, applies
once to settle it (a full apply on a fresh host) and leaves it up, so a before/after comparison of a role
change can run on the same host (`provision sandbox down` when done).

--profile DIR writes where a no-op's and a drifted re-apply's seconds go, per task, as ansible.posix's
profile_tasks callback prints them (DIR/noop-profile.txt, DIR/drift-profile.txt); ansible.posix comes from
the `ansible` package's wheel (pip download, once, into ~/.cache/dflash-provision). It also counts the round
trips to the host per task (every ssh or sftp process Ansible starts, as -vvv logs it) of the floor, a no-op
and each drift's re-apply (DIR/round-trips.txt) and prints their totals.

--mitogen runs the applies (not the floor) under mitogen's strategy (`pip install mitogen` first): a
measured try, not the shipped configuration. PROVISION_SANDBOX_ID picks the sandbox, as for `provision sandbox`.
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from provision.sandbox import layout

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PROVISION = str(BIN / "provision")
ENV = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}


def run_timed(*cmd: str, env: dict[str, str] = ENV) -> tuple[float, str]:
    """(seconds, stdout) of a command that must succeed."""
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def timed(*cmd: str, env: dict[str, str] = ENV) -> float:
    return run_timed(*cmd, env=env)[0]


# what the role's readiness wait reports: the server's own start, from the restart to its first 200
READY = re.compile(r"is ready at \S+ \(after ([0-9.]+) s\)")


# One managed file per place in the play: early (its role's change makes the roles after it look again) and
# last (the service's environment: a restart and a readiness wait).
DRIFTS = (
    "/opt/dflash-provision/libexec/triton_aot.py",
    "/etc/sglang-dflash/sglang-dflash.env",
)


def on_host(host: str, script: str) -> str:
    proc = subprocess.run(
        [PROVISION, "sandbox", "exec", host, "--", "sh", "-c", script], env=ENV, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"failed on {host}: {script}\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def sha1_on(host: str, path: str) -> str:
    return on_host(host, f"sha1sum {path}").split()[0]


def profile_env() -> dict[str, str]:
    """ansible.posix's profile_tasks callback, from the `ansible` package's wheel (downloaded once)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dflash-provision" / "ansible-posix"
    if not (cache / "ansible_collections" / "ansible" / "posix").is_dir():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, "ansible>=12,<13"], check=True
            )
            with zipfile.ZipFile(next(Path(tmp).glob("ansible-*.whl"))) as wheel:
                posix = [name for name in wheel.namelist() if name.startswith("ansible_collections/ansible/posix/")]
                wheel.extractall(cache, posix)
    return {
        **ENV,
        "ANSIBLE_COLLECTIONS_PATH": f"{cache}:{ROOT / 'collections'}",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",
        "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all",
        "PROFILE_TASKS_SORT_ORDER": "none",
    }


def profiled(out: Path, *cmd: str) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, env=profile_env(), capture_output=True, text=True)
    out.write_text(proc.stdout + proc.stderr)


# -vvv logs every ssh and sftp process the connection starts ("SSH: EXEC ssh ..." / "SSH: EXEC sftp ..."):
# one round trip each, over the connection's shared master
HEADER = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(.*)\]")
SSH_EXEC = re.compile(r"^<[^>]+> SSH: EXEC ")


def round_trips(*cmd: str) -> list[tuple[str, int]]:
    """The round trips to the host of each task that made any, in order, from one run with -vvv."""
    counts: list[tuple[str, int]] = []
    for line in run_timed(*cmd, "-vvv")[1].splitlines():
        if header := HEADER.match(line):
            counts.append((header.group(1), 0))
        elif SSH_EXEC.match(line) and counts:
            counts[-1] = (counts[-1][0], counts[-1][1] + 1)
    return [(task, n) for task, n in counts if n]


def fresh(hosts: str) -> None:
    timed(PROVISION, "sandbox", "down")
    timed(PROVISION, "sandbox", "up", "--hosts", hosts)


def busy_cpu_s() -> float:
    """The machine's busy CPU seconds so far (all cores: the hosts, the control node, the apt proxy)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def apply_cold(state: Path, target: str) -> float:
    """A first apply with empty control-side caches: every wheel downloaded, every FlashInfer module built."""
    with tempfile.TemporaryDirectory(prefix="control-cache-") as cache:
        return timed(
            PROVISION, "apply", "--host", target, "--sandbox", "--state-dir", str(state),
            "-e", f"cuda_toolkit_wheelhouse={cache}/cuda", "-e", f"python_env_wheelhouse={cache}/wheels",
            "-e", f"flashinfer_control_cache={cache}/flashinfer",
        )  # fmt: skip


def mitogen_env() -> dict[str, str]:
    """The environment that runs ansible-playbook under mitogen's linear strategy."""
    import ansible_mitogen  # noqa: PLC0415 - optional: only with --mitogen

    plugins = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return {**ENV, "ANSIBLE_STRATEGY_PLUGINS": str(plugins), "ANSIBLE_STRATEGY": "mitogen_linear"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fleet-rounds", type=int, default=1, help="fleet of 1 and of 3, alternated N times")
    parser.add_argument("--skip-warm", action="store_true", help="the apt proxy's cache is warm already")
    parser.add_argument("--noop-only", action="store_true", help="only the no-op re-apply; leaves the host up")
    parser.add_argument("--mitogen", action="store_true", help="the applies under mitogen's strategy (not the floor)")
    parser.add_argument("--profile", type=Path, help="profile_tasks' per-task seconds of a no-op and a drift, here")
    args = parser.parse_args()
    # provision's modules and the collection's plugins with their bytecode, as an installed wheel has them (pip
    # compiles at install): a shell with PYTHONDONTWRITEBYTECODE=1 would otherwise have every apply compile
    # them again (about 0.08 s), a cost the floor's Ansible, compiled in site-packages, never pays
    for tree in ("provision", "collections"):
        compileall.compile_dir(ROOT / tree, quiet=1)
    apply_env = mitogen_env() if args.mitogen else ENV
    state = Path(tempfile.mkdtemp(prefix="bench-runs-"))
    inventory = str(layout.inventory_dir())  # this sandbox's (PROVISION_SANDBOX_ID)

    if args.noop_only:
        timed(PROVISION, "sandbox", "up", "--hosts", "b300:1")  # keeps a running one
        settle = timed(PROVISION, "apply", "--host", "b300-sbx", "--sandbox", "--state-dir", str(state))
        print(f"settling apply {settle:.1f} s", flush=True)
    elif not args.skip_warm:
        fresh("b300:1")
        apply_cold(state, "b300")  # warm the apt proxy's cache so both fleet runs see the same mirror
    fleet: dict[int, list[float]] = {1: [], 3: []}
    for round_ in range(0 if args.noop_only else args.fleet_rounds):
        for count in (1, 3):
            fresh(f"b300:{count}")
            cpu = busy_cpu_s()
            fleet[count].append(apply_cold(state, "b300"))
            print(f"round {round_ + 1}, fleet of {count}: first apply {fleet[count][-1]:.1f} s,"
                  f" the machine's busy CPU {busy_cpu_s() - cpu:.0f} s", flush=True)  # fmt: skip

    noop, plain, floor = [], [], []
    drifted: dict[str, list[float]] = {path: [] for path in DRIFTS}
    server_start: dict[str, list[float]] = {path: [] for path in DRIFTS}
    playbook = [str(BIN / "ansible-playbook"), "-i", inventory, "--limit", "b300-sbx"]
    for _ in range(args.repeat):
        apply = [PROVISION, "apply", "--host", "b300-sbx", "--sandbox", "--state-dir", str(state)]
        noop.append(timed(*apply, env=apply_env))
        plain.append(timed(*playbook, "playbooks/b300.yml", env=apply_env))
        floor.append(timed(*playbook, "bench/floor.yml"))
        for path in DRIFTS:
            settled = sha1_on("b300-sbx", path)
            on_host("b300-sbx", f"echo '# drift' >> {path}")
            seconds, out = run_timed(*playbook, "playbooks/b300.yml", env=apply_env)
            drifted[path].append(seconds)
            server_start[path].append(sum(float(m) for m in READY.findall(out)))
            if sha1_on("b300-sbx", path) != settled:
                sys.exit(f"the re-apply left {path} drifted")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        profiled(args.profile / "noop-profile.txt", *playbook, "playbooks/b300.yml")
        on_host("b300-sbx", f"echo '# drift' >> {DRIFTS[0]}")
        profiled(args.profile / "drift-profile.txt", *playbook, "playbooks/b300.yml")
        runs = {"floor": round_trips(*playbook, "bench/floor.yml")}
        runs["no-op"] = round_trips(*playbook, "playbooks/b300.yml")
        for path in DRIFTS:
            on_host("b300-sbx", f"echo '# drift' >> {path}")
            runs[f"{path} drifted"] = round_trips(*playbook, "playbooks/b300.yml")
        report = {run: f"{run}: {sum(n for _, n in tasks)} round trip(s)" for run, tasks in runs.items()}
        lines = [line for run, tasks in runs.items() for line in (report[run], *(f"  {n}  {t}" for t, n in tasks))]
        (args.profile / "round-trips.txt").write_text("\n".join(lines) + "\n")
        print("round trips to the host (ssh and sftp processes, -vvv):", "; ".join(report.values()))
    if not args.noop_only:
        timed(PROVISION, "sandbox", "down")
    n, p, f = statistics.median(noop), statistics.median(plain), statistics.median(floor)
    print(
        f"no-op re-apply (provision apply) {n:.2f} s vs floor {f:.2f} s (medians of {args.repeat}): ratio {n / f:.2f}"
    )
    print(f"no-op re-apply (ansible-playbook playbooks/b300.yml) {p:.2f} s vs floor {f:.2f} s: ratio {p / f:.2f}")
    print("  (aim <= 2; provision apply also validates the plans itself before it starts Ansible)")
    for path, times in drifted.items():
        d = statistics.median(times)
        print(f"drifted re-apply ({path} edited, corrected) {d:.2f} s vs floor {f:.2f} s: ratio {d / f:.2f} (aim <= 3)")
        if any(server_start[path]):
            # the correction restarts the server: its own start (the readiness wait's report) is not apply's
            own = statistics.median(t - w for t, w in zip(times, server_start[path], strict=True))
            w = statistics.median(server_start[path])
            print(f"  of which the server's own start (restart to ready) {w:.2f} s; apply's share {own:.2f} s:"
                  f" ratio {own / f:.2f}")  # fmt: skip
    if fleet[1]:
        one, three = statistics.median(fleet[1]), statistics.median(fleet[3])
        rounds = ", ".join(f"{b / a:.2f}" for a, b in zip(fleet[1], fleet[3], strict=True))
        print(f"fleet 3 vs 1 (medians of {len(fleet[1])}): {three:.1f} s vs {one:.1f} s: ratio {three / one:.2f}"
              f" (aim <= 1.4); each round's ratio {rounds}")  # fmt: skip


if __name__ == "__main__":
    main()
