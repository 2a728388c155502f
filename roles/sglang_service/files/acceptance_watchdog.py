"""Acceptance watchdog: roll a speculative config that collapses back to the last good one, once.

Standalone, stdlib only; runs on each host as its own unprivileged, sandboxed unit (NAME-watchdog.service, a
DynamicUser). Usage: python3 acceptance_watchdog.py SETTINGS_JSON

Every interval it reads the server's Prometheus counters at /metrics and judges the window since the last read:
acceptance = increase(sglang:generation_tokens_total) / increase(sglang:spec_verify_calls_total), summed over
every label set (ranks, streaming or not). Never the sglang:spec_accept_length gauge: it keeps its last value on
an idle server. A window is
  inconclusive  before the server is ready + initial_delay_s, with /metrics unreachable, after a counter reset
                (a restart), or with fewer than min_verify_calls verify calls (no rollback, ever, from these);
  failed        below failure_floor AND below failure_fraction x the config's baseline (the settings' baseline,
                else the mean of the config's first baseline_windows windows at or above the floor);
  passed        otherwise (it resets the count of consecutive failures; inconclusive windows leave it).
failure_limit consecutive failures ask for a rollback: the watchdog writes a request into its state directory, and a
root-owned path unit starts NAME-rollback.service (service_switch.py rollback), which checks the request against
the config serving now and does the switch. Then the watchdog holds: under the same arming (the settings file's
content; `provision reconfigure` and `provision apply` write it anew) it never asks again, it reports.

State is written atomically after every tick and read back at start, so a restart resumes the analysis (the
consecutive failures, the baseline, the last sample) and never asks twice.
"""

import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from service_switch import config_id, get, read, read_json, write_atomic  # noqa: E402 - shipped side by side

TOKENS = "sglang:generation_tokens_total"
VERIFY = "sglang:spec_verify_calls_total"
KEEP_WINDOWS = 60  # the last windows kept in the state, for `provision status` and plots
REQUEST = "rollback-request.json"
HANDLED = "rollback-request.handled.json"  # the root side's answer, moved there when it acted on a request
STATE = "state.json"


def parse_metrics(text):
    """Prometheus text format: each sample's value summed per metric name (over ranks and label sets)."""
    totals = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        try:
            totals[name] = totals.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return totals


def judge(tokens, verify, wd, baseline):
    """(verdict, acceptance or None, why) of one window's counter increases."""
    if verify < wd["min_verify_calls"]:
        return "inconclusive", None, f"{verify:g} verify calls, fewer than min_verify_calls {wd['min_verify_calls']}"
    accept = tokens / verify
    limit = None if baseline is None else wd["failure_fraction"] * baseline
    if accept < wd["failure_floor"] and (limit is None or accept < limit):
        against = "no baseline yet" if limit is None else f"{wd['failure_fraction']:g} x baseline {baseline:.3f}"
        return "failed", accept, f"acceptance {accept:.3f} below the floor {wd['failure_floor']:g} and {against}"
    return "passed", accept, f"acceptance {accept:.3f}"


def fresh(arm, windows=()):
    """A new analysis; the past windows stay (each names its config): status and plots show what came before."""
    return {"arm": arm, "config_id": None, "ready_at": None, "last_sample": None, "failures": 0,
            "baselines": {}, "hold": None, "rollback": None, "phase": "starting", "windows": list(windows)}  # fmt: skip


def baseline_of(state, wd):
    if wd.get("baseline") is not None:
        return wd["baseline"]
    seen = state["baselines"].get(state["config_id"], [])
    return sum(seen) / len(seen) if len(seen) >= wd["baseline_windows"] else None


def step(state, obs, wd):
    """One tick of the analysis: the new state and the rollback request to make, if any (pure: tested alone).

    obs: {"t", "arm", "config_id", "healthy" (bool), "metrics" (parsed, or None when unreachable)}."""
    if state is None or state.get("arm") != obs["arm"]:
        state = fresh(obs["arm"], (state or {}).get("windows", []))  # armed anew (apply, reconfigure): no hold
    state = dict(state)
    if state["config_id"] != obs["config_id"]:
        state.update(config_id=obs["config_id"], ready_at=None, last_sample=None, failures=0)
    if not wd["enabled"]:
        state["phase"] = "disabled"
        return state, None
    metrics = obs["metrics"]
    sample = None if metrics is None else {"t": obs["t"], "tokens": metrics.get(TOKENS, 0.0),
                                           "verify": metrics.get(VERIFY, 0.0)}  # fmt: skip
    last, state["last_sample"] = state["last_sample"], sample
    if sample and last and (sample["tokens"] < last["tokens"] or sample["verify"] < last["verify"]):
        state.update(ready_at=None, failures=0)  # the counters went back: the server restarted, warm up again
        last = None
    if state["ready_at"] is None:
        if not obs["healthy"]:
            state["phase"] = "starting"
            return state, None
        state["ready_at"] = obs["t"]
    if obs["t"] < state["ready_at"] + wd["initial_delay_s"]:
        state.update(phase="warming up", last_sample=None)  # the first window starts after the warm-up
        return state, None
    if sample is None:
        return _record(state, obs["t"], "inconclusive", None, "/metrics unreachable", None, None), None
    if last is None:
        state["phase"] = "watching"
        return state, None
    tokens, verify = sample["tokens"] - last["tokens"], sample["verify"] - last["verify"]
    baseline = baseline_of(state, wd)
    verdict, accept, why = judge(tokens, verify, wd, baseline)
    if verdict == "passed":
        state["failures"] = 0
        seen = state["baselines"].setdefault(state["config_id"], [])
        if wd.get("baseline") is None and accept >= wd["failure_floor"] and len(seen) < wd["baseline_windows"]:
            state["baselines"] = {**state["baselines"], state["config_id"]: seen + [accept]}
    elif verdict == "failed":
        state["failures"] += 1
    state = _record(state, obs["t"], verdict, accept, why, tokens, verify)
    if state["failures"] < wd["failure_limit"]:
        return state, None
    reason = f"{state['failures']} consecutive failed windows of {wd['interval_s']} s: {why}"
    if state["hold"] is not None:
        state["phase"] = f"holding: {reason}; one rollback was made already ({state['hold']['reason']})"
        return state, None
    request = {"id": f"{obs['arm']}-{state['config_id']}", "config_id": state["config_id"], "arm": obs["arm"],
               "reason": reason, "at": obs["t"], "windows": state["windows"][-wd["failure_limit"]:]}  # fmt: skip
    state["hold"] = {"config_id": state["config_id"], "reason": reason, "at": obs["t"]}
    state["rollback"] = request
    state["phase"] = "rollback requested"
    return state, request


def _record(state, t, verdict, accept, why, tokens, verify):
    window = {"t": t, "config_id": state["config_id"], "verdict": verdict, "accept": accept, "why": why,
              "tokens": tokens, "verify": verify, "failures": state["failures"]}  # fmt: skip
    state["windows"] = (state["windows"] + [window])[-KEEP_WINDOWS:]
    state["phase"] = "holding" if state["hold"] is not None else "watching"
    print(json.dumps({"window": window}), flush=True)
    return state


def arm_of(path):
    return hashlib.sha256((read(path) or "").encode()).hexdigest()[:16]


def observe(settings, now):
    url = settings["url"]
    status, body = get(url + "/metrics", None)
    return {
        "t": now,
        "arm": arm_of(settings["path"]),
        "config_id": config_id(read(settings["unit_path"]) or "", read(settings["env_path"]) or ""),
        "healthy": get(url + "/health", None)[0] == 200,
        "metrics": parse_metrics(body.decode(errors="replace")) if status == 200 else None,
    }


def tick(settings, state_dir, now):
    """Observe at `now`, judge, persist; then, when it is due, (re)write the rollback request."""
    state_path = os.path.join(state_dir, STATE)
    state, request = step(read_json(state_path), observe(settings, now), settings["watchdog"])
    write_atomic(state_path, json.dumps(state))  # the hold is on disk before the request: never two requests
    pending = state.get("rollback")
    if (request is None and pending and pending["config_id"] == state["config_id"]
            and not os.path.exists(os.path.join(state_dir, REQUEST))
            and (read_json(os.path.join(state_dir, HANDLED)) or {}).get("id") != pending["id"]):  # fmt: skip
        request = pending  # stopped between the state and the request: the same request again (same id)
    if request is not None:
        write_atomic(os.path.join(state_dir, REQUEST), json.dumps(request))
        print(json.dumps({"rollback_requested": request["reason"]}), flush=True)
    return state


def next_tick(state, wd, now):
    """When to observe next: one interval after this observation (the time a tick takes does not lengthen the
    windows), and at the end of the warm-up, not up to an interval after it: the first sample is taken when the
    warm-up ends, so a collapse is asked back within initial_delay_s + failure_limit x interval_s of the first tick
    that saw the server ready."""
    at = now + wd["interval_s"]
    if state.get("phase") == "warming up":
        at = min(at, state["ready_at"] + wd["initial_delay_s"])
    return at


def first_tick(state, wd, now):
    """A restart keeps the cadence: the first window after it is a whole one, from the last sample taken."""
    last = (state or {}).get("last_sample")
    return now if last is None else min(max(now, last["t"] + wd["interval_s"]), now + wd["interval_s"])


def settings_of(path):
    return {**json.loads(read(path) or "{}"), "path": path}


def main(path):
    state_dir = os.environ.get("STATE_DIRECTORY") or sys.exit("STATE_DIRECTORY is not set (run by the unit)")
    at = first_tick(read_json(os.path.join(state_dir, STATE)), settings_of(path)["watchdog"], time.time())
    while True:
        time.sleep(max(0.0, at - time.time()))
        settings, now = settings_of(path), time.time()
        state = tick(settings, state_dir, now)
        at = next_tick(state, settings["watchdog"], now)


if __name__ == "__main__":
    main(sys.argv[1])
