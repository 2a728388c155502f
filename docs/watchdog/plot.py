"""Acceptance per window around a rollback, from tests/test_watchdog.py's WATCHDOG_PLOT_DATA file.

Usage: .venv/bin/python docs/watchdog/plot.py run.json docs/watchdog/rollback.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend

COLORS = {"passed": "tab:green", "failed": "tab:red", "inconclusive": "tab:gray"}


def main(src: str, dst: str) -> None:
    run = json.loads(open(src).read())
    t0 = run["switched_at"]
    windows = [w for w in run["state"]["windows"] if w["t"] - t0 >= -30]  # from half a minute before the switch
    rolled = [r for r in run["record"]["rollbacks"] if r["status"] == "rolled back"][0]
    fig, ax = plt.subplots(figsize=(9, 4))
    for verdict, color in COLORS.items():
        pts = [
            (w["t"] - t0, w["accept"] if w["accept"] is not None else 0.0) for w in windows if w["verdict"] == verdict
        ]
        if pts:
            ax.scatter(*zip(*pts, strict=True), color=color, label=verdict, zorder=3)
    wd = run["settings"]
    ax.axhline(wd["failure_floor"], color="tab:red", linestyle="--", label=f"floor {wd['failure_floor']}")
    ax.axvline(0, color="black", linestyle=":", label="reconfigure to the collapsed config")
    ax.axvline(rolled["request"]["at"] - t0, color="tab:purple", linestyle=":", label="rollback requested")
    ax.axvline(rolled["at"] - t0, color="tab:blue", linestyle=":", label="rollback started (root oneshot)")
    ax.set_xlabel("seconds since the reconfigure")
    ax.set_ylabel("acceptance (tokens / verify step)")
    ax.set_ylim(0, None)
    ax.set_title("Acceptance per window on a sandbox host (stand-in, SGLANG_SIMULATE_ACC_LEN=1)")
    ax.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
