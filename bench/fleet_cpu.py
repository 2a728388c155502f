"""Where a cold fleet apply's CPU goes, per host and per task (root; brings sandbox hosts up and down).

Each sandbox host runs in a cgroup of its own; its cgroup v2 `cpu.stat` counts the CPU of everything in the
host (the modules, pip, apt, the server). This samples every host's count 4 times a second during a cold
apply (bench/apply_speed.py's `apply_cold`) and charges each task the CPU its host used while the task ran
(ansible-runner's events give each task's start and end per host). It prints the run's wall time, the
machine's busy CPU, each host's, and the rest (the control node, the apt proxy), then the tasks by CPU, then
the tasks by the cores they left idle (from the first host's start to the last host's end): where the
machine waited, work could overlap.

Usage: .venv/bin/python bench/fleet_cpu.py [COUNT ...]   (default: 1 3; PROVISION_SANDBOX_ID picks the sandbox)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from bisect import bisect_left
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from apply_speed import apply_cold, busy_cpu_s, fresh

from provision.sandbox import layout

RESULTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped")
STARTS = ("playbook_on_task_start", "playbook_on_handler_task_start")
# the key of the machine's own busy CPU among the hosts' samples
MACHINE = "(the machine)"


def host_cpu_s(cgroup: str) -> float:
    stat = Path("/sys/fs/cgroup/unified", cgroup, "cpu.stat").read_text()
    return int(stat.split("usage_usec ", 1)[1].split()[0]) / 1e6


def sample(hosts: list[layout.SandboxHost], into: list[tuple[float, dict[str, float]]], stop: threading.Event) -> None:
    while not stop.wait(0.25):
        into.append((time.time(), {MACHINE: busy_cpu_s()} | {h.name: host_cpu_s(h.cgroup) for h in hosts}))


def cpu_at(samples: list[tuple[float, dict[str, float]]], when: float, host: str) -> float:
    """The host's CPU seconds at a moment, between the two samples around it."""
    times = [t for t, _ in samples]
    i = min(max(bisect_left(times, when), 1), len(samples) - 1)
    (t0, a), (t1, b) = samples[i - 1], samples[i]
    share = min(max((when - t0) / (t1 - t0), 0.0), 1.0)
    return a[host] + share * (b[host] - a[host])


def main() -> None:
    for count in [int(c) for c in sys.argv[1:]] or [1, 3]:
        fresh(f"b300:{count}")
        hosts = layout.load_hosts()
        samples: list[tuple[float, dict[str, float]]] = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(hosts, samples, stop))
        state = Path(tempfile.mkdtemp(prefix="fleet-cpu-"))
        busy = busy_cpu_s()
        sampler.start()
        wall = apply_cold(state, "b300")
        stop.set()
        sampler.join()
        busy = busy_cpu_s() - busy
        used = {h.name: samples[-1][1][h.name] - samples[0][1][h.name] for h in hosts}
        print(f"{count} host(s): wall {wall:.1f} s, the machine's busy CPU {busy:.1f} s; hosts "
              + ", ".join(f"{name} {s:.1f} s" for name, s in used.items())
              + f"; the rest (control node, apt proxy) {busy - sum(used.values()):.1f} s")  # fmt: skip
        per_task: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        spans: dict[tuple[str, str, int, str], tuple[float, float]] = {}
        for events_dir in state.glob("*/artifacts/*/job_events"):
            events = sorted((json.loads(p.read_text()) for p in events_dir.glob("*.json")), key=lambda e: e["counter"])
            runs: dict[str, int] = defaultdict(int)  # a handler notified twice runs twice under one task id
            for event in events:
                data = event.get("event_data", {})
                if event["event"] in STARTS:
                    runs[data["task_uuid"]] += 1
                if event["event"] in RESULTS and data.get("host") in used and data.get("start") and data.get("end"):
                    start, end = (datetime.fromisoformat(data[k]).timestamp() for k in ("start", "end"))
                    per_task[data["task"]][data["host"]] += cpu_at(samples, end, data["host"]) - cpu_at(
                        samples, start, data["host"]
                    )
                    # by the task's own run: tasks of one name in several roles are apart in time
                    key = (
                        str(events_dir),
                        data["task_uuid"],
                        runs[data["task_uuid"]],
                        f"{data.get('role', '')}: {data['task']}",
                    )
                    first, last = spans.get(key, (start, end))
                    spans[key] = (min(first, start), max(last, end))
        for task, by_host in sorted(per_task.items(), key=lambda kv: -sum(kv[1].values()))[:25]:
            cells = " ".join(f"{by_host.get(name, 0):5.1f}" for name in used)
            print(f"  {sum(by_host.values()):6.1f} s | {cells} | {task}")
        cores = os.cpu_count() or 1
        idle = {
            key: (cores * (end - start) - cpu_at(samples, end, MACHINE) + cpu_at(samples, start, MACHINE), end - start)
            for key, (start, end) in spans.items()
        }
        print(f"  idle core-seconds by task ({cores} cores; of {cores * wall - busy:.1f} s in all):")
        for (*_, task), (lost, span) in sorted(idle.items(), key=lambda kv: -kv[1][0])[:20]:
            print(f"  {lost:6.1f} s idle over {span:6.1f} s | {task}")


if __name__ == "__main__":
    main()
