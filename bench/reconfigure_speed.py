"""Reconfigure overhead and readiness lag on a sandbox host, measured side by side in one run (root).

The host runs the SGLang stand-in, whose own load time is known: it reports when its process
started and when it turned ready (standin_started_at, standin_ready_at in /get_server_info).

  downtime overhead : from the stop to the detected readiness, minus the server's own start
                      (process start to ready): the stop, the drain, the GPU-memory wait, systemd
                      and the readiness polling (the new unit is installed before the stop)
  total overhead    : the whole reconfigure (models, the build's own parser on the host, ssh) minus
                      the server's own start
  readiness lag     : detected ready - turned ready (same host clock)

Usage: .venv/bin/python bench/reconfigure_speed.py [--repeat N] [--load-s S]
"""

from __future__ import annotations

import argparse
import statistics
import time

from rich.console import Console

from provision.cli import main as cli
from provision.inventory.reader import Inventory
from provision.remote.reconfigure import check_with_parser, plan_new, switch
from provision.sandbox import manage

HOST = "b300-sbx"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--load-s", type=float, default=2.0)
    args = parser.parse_args()
    assert cli(["sandbox", "up", "--hosts", "b300"]) == 0
    assert cli(["apply", "--host", HOST, "--sandbox"]) == 0
    inventory = Inventory(manage.inventory_dir())
    console = Console(quiet=True)
    downtime, total, lag, own = [], [], [], []
    for i in range(args.repeat):
        sets = {"serve.draft_window": 1024 + 512 * (i % 2), "serve.env.SGLANG_STANDIN_LOAD_S": str(args.load_s)}
        start = time.monotonic()
        [(plan, remote)] = plan_new(inventory, HOST, sets, {}, False, console)
        check_with_parser(remote, plan)
        outcome = switch(plan, remote)
        elapsed = time.monotonic() - start
        assert outcome.code == 0, outcome.result
        timings, info = outcome.result["timings"], outcome.result["server_info"]
        server_start = info["standin_ready_at"] - info["standin_started_at"]
        own.append(server_start)
        downtime.append(timings["detected_at"] - timings["stop_started_at"] - server_start)
        total.append(elapsed - server_start)
        lag.append(timings["detected_at"] - info["standin_ready_at"])
        print(f"run {i + 1}: server's own start {server_start:.2f} s, stop {timings['stop_s']:.2f} s, start to "
              f"ready {timings['start_to_ready_s']:.2f} s, reconfigure {elapsed:.2f} s", flush=True)  # fmt: skip
    med = statistics.median
    print(f"server's own start (process to ready, load {args.load_s:g} s + imports): {med(own):.2f} s")
    print(f"downtime overhead beyond the server's own start: {med(downtime):.3f} s (aim <= 1 s; ratio of downtime "
          f"to the server's own start {(med(downtime) + med(own)) / med(own):.2f})")  # fmt: skip
    print(f"total overhead incl. validation (models + the build's parser on the host): {med(total):.2f} s")
    print(f"readiness detection lag: {med(lag) * 1000:.0f} ms (aim <= 250 ms), medians of {args.repeat}")


if __name__ == "__main__":
    main()
