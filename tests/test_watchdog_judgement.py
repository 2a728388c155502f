"""The acceptance watchdog's judgement, its state machine and its settings, without a host or a server.

roles/sglang_service/files/acceptance_watchdog.py is imported as the host runs it (stdlib only, beside
service_switch.py); the sandbox proofs are in tests/test_watchdog.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from provision import paths
from provision.model.deployment import Watchdog

FILES = paths.role_file("sglang_service", "acceptance_watchdog.py").parent
sys.path.insert(0, str(FILES))
spec = importlib.util.spec_from_file_location("acceptance_watchdog", FILES / "acceptance_watchdog.py")
assert spec and spec.loader
wd_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wd_mod)

# short windows, as the sandbox test's inventory sets them
WD = {**Watchdog().model_dump(), "initial_delay_s": 10, "interval_s": 2, "min_verify_calls": 5}


def obs(t: float, tokens: float | None, verify: float | None, *, config: str = "A", arm: str = "arm1",
        healthy: bool = True) -> dict[str, Any]:  # fmt: skip
    metrics = None if tokens is None else {wd_mod.TOKENS: tokens, wd_mod.VERIFY: verify}
    return {"t": t, "arm": arm, "config_id": config, "healthy": healthy, "metrics": metrics}


class Run:
    """Feeds a series of observations through step(), as the loop does, keeping every request."""

    def __init__(self, wd: dict[str, Any] = WD) -> None:
        self.wd, self.state, self.requests = wd, None, []
        self.tokens = self.verify = 0.0
        self.t = 0.0

    def tick(self, accept: float | None, verify: float = 50, **kw: Any) -> dict[str, Any]:
        """One interval with `verify` verify calls at acceptance `accept` (None: /metrics unreachable)."""
        self.t += self.wd["interval_s"]
        if accept is not None:
            self.verify += verify
            self.tokens += verify * accept
        seen = obs(self.t, None if accept is None else self.tokens, self.verify, **kw)
        self.state, request = wd_mod.step(self.state, seen, self.wd)
        json.dumps(self.state)  # what goes to disk must be JSON
        if request:
            self.requests.append(request)
        return self.state

    def warm(self, accept: float = 4.0) -> None:
        """Up to the first sample after the warm-up: the next tick judges the first window."""
        while self.state is None or self.state["phase"] != "watching":
            self.tick(accept)


def test_metrics_are_summed_over_label_sets() -> None:
    text = (
        "# HELP sglang:generation_tokens_total x\n# TYPE sglang:generation_tokens_total counter\n"
        'sglang:generation_tokens_total{model_name="m",is_streaming="false"} 100.0\n'
        'sglang:generation_tokens_total{model_name="m",is_streaming="true"} 20.0\n'
        'sglang:spec_verify_calls_total{model_name="m",tp_rank="0"} 30\n'
        "garbage line\n"
    )
    assert wd_mod.parse_metrics(text) == {wd_mod.TOKENS: 120.0, wd_mod.VERIFY: 30.0}


@pytest.mark.parametrize(
    ("tokens", "verify", "baseline", "verdict"),
    [
        (400, 100, None, "passed"),  # 4.0
        (100, 100, None, "failed"),  # 1.0 below the floor, no baseline yet: fails on the floor alone
        (100, 100, 4.0, "failed"),  # below the floor and below half the baseline
        (140, 100, 2.5, "passed"),  # 1.4 below the floor 1.5, but not below 0.5 x 2.5 = 1.25
        (190, 100, 4.0, "passed"),  # 1.9 is below half of 4.0 but above the floor
        (4, 4, None, "inconclusive"),  # fewer verify calls than min_verify_calls
        (0, 0, 4.0, "inconclusive"),  # idle
    ],
)
def test_judge_needs_both_the_floor_and_the_baseline(tokens: float, verify: float, baseline: float | None,
                                                    verdict: str) -> None:  # fmt: skip
    assert wd_mod.judge(tokens, verify, WD, baseline)[0] == verdict


def test_a_collapse_is_rolled_back_after_failure_limit_windows_then_it_holds() -> None:
    run = Run()
    run.warm()
    for _ in range(5):
        run.tick(4.0)
    assert run.state["phase"] == "watching" and run.state["failures"] == 0
    assert run.state["baselines"]["A"] == [4.0, 4.0, 4.0]  # the first baseline_windows healthy windows
    run.tick(1.0)
    run.tick(1.0)
    assert not run.requests and run.state["failures"] == 2
    run.tick(1.0)
    (request,) = run.requests
    assert request["config_id"] == "A" and "3 consecutive failed windows" in request["reason"]
    assert run.state["phase"] == "rollback requested"
    # still collapsed: never a second request
    for _ in range(5):
        run.tick(1.0)
    assert len(run.requests) == 1 and run.state["phase"].startswith("holding")


def test_a_config_collapsed_from_its_start_fails_on_the_floor() -> None:
    run = Run()
    run.warm(accept=1.0)  # warm-up windows are never judged
    assert run.state["windows"] == [] and not run.requests
    for _ in range(3):
        run.tick(1.0)
    assert len(run.requests) == 1


def test_a_passing_window_resets_the_count_and_inconclusive_ones_leave_it() -> None:
    run = Run()
    run.warm()
    run.tick(1.0)
    run.tick(1.0)
    run.tick(4.0)
    assert run.state["failures"] == 0
    run.tick(1.0)
    run.tick(1.0, verify=2)  # too few verify calls
    run.tick(None)  # /metrics unreachable
    assert run.state["failures"] == 1 and run.state["windows"][-1]["why"] == "/metrics unreachable"
    assert not run.requests


def test_idle_and_unreachable_servers_never_roll_back() -> None:
    run = Run()
    run.warm()
    for _ in range(20):
        run.tick(1.0, verify=0)
    for _ in range(20):
        run.tick(None)
    assert not run.requests
    assert {w["verdict"] for w in run.state["windows"]} == {"inconclusive"}


def test_warm_up_counts_from_readiness() -> None:
    run = Run()
    for _ in range(10):
        run.tick(None, healthy=False)  # loading for 20 s
    assert run.state["ready_at"] is None and run.state["phase"] == "starting"
    run.tick(1.0)
    ready = run.state["ready_at"]
    while run.t + WD["interval_s"] < ready + WD["initial_delay_s"]:
        run.tick(1.0)
        assert run.state["phase"] == "warming up"
    run.tick(1.0)  # the first sample after the warm-up
    for _ in range(3):
        assert not run.requests
        run.tick(1.0)
    assert len(run.requests) == 1


@pytest.mark.parametrize("delay", [4, 5, 0])
def test_a_collapse_is_asked_back_within_the_warm_up_and_failure_limit_windows(delay: int) -> None:
    """The loop's schedule (next_tick): the first sample when the warm-up ends, not up to an interval later."""
    wd = {**WD, "initial_delay_s": delay}
    state, t, requests = None, 0.7, []
    while not requests:
        state, request = wd_mod.step(state, obs(t, 10 * t, 10 * t), wd)  # acceptance 1 from the start
        requests += [request] if request else []
        t = wd_mod.next_tick(state, wd, t)
    assert requests[0]["at"] - state["ready_at"] == delay + wd["failure_limit"] * wd["interval_s"]


def test_a_restarted_watchdog_keeps_the_cadence() -> None:
    run = Run()
    run.warm()
    run.tick(1.0)
    last = run.state["last_sample"]["t"]
    assert wd_mod.first_tick(run.state, WD, last + 0.5) == last + WD["interval_s"]  # a whole window, not 0.5 s
    assert wd_mod.first_tick(run.state, WD, last + 30) == last + 30  # long down: at once
    assert wd_mod.first_tick(run.state, WD, last - 3600) == last - 3600 + WD["interval_s"]  # the clock went back
    assert wd_mod.first_tick(None, WD, 7.0) == 7.0


def test_a_restart_warms_up_again() -> None:
    run = Run()
    run.warm()
    run.tick(1.0)
    run.tick(1.0)
    run.tokens = run.verify = 0.0  # the server restarted: counters from zero
    run.tick(1.0)
    assert run.state["failures"] == 0 and run.state["phase"] == "warming up"


def test_resumed_state_gives_no_second_request(tmp_path: Path) -> None:
    """The loop's tick() persists after every window; a new process reads the state back."""
    run = Run()
    run.warm()
    for _ in range(3):
        run.tick(1.0)
    (tmp_path / "state.json").write_text(json.dumps(run.state))
    resumed = json.loads((tmp_path / "state.json").read_text())
    state, request = wd_mod.step(resumed, obs(run.t + 2, run.tokens + 50, run.verify + 50), WD)
    assert request is None and state["phase"].startswith("holding")


def test_after_the_rollback_a_second_collapse_holds_and_a_new_arming_watches_again() -> None:
    run = Run()
    run.warm()
    for _ in range(3):
        run.tick(1.0)
    assert len(run.requests) == 1
    # the rollback: another config serves (a restart: counters from zero), under the same arming
    run.tokens = run.verify = 0.0
    for _ in range(15):
        run.tick(1.0, config="B")
    assert len(run.requests) == 1 and run.state["phase"].startswith("holding")
    # provision reconfigure or apply writes the settings anew: armed again, a fresh analysis
    before = [w["config_id"] for w in run.state["windows"]]
    for _ in range(15):
        run.tick(1.0, config="C", arm="arm2")
    assert len(run.requests) == 2 and run.requests[1]["config_id"] == "C"
    # the windows before the arming stay, for status and plots; the analysis did not count them
    assert [w["config_id"] for w in run.state["windows"]][: len(before)] == before and "B" in before


def test_disabled_judges_nothing() -> None:
    run = Run({**WD, "enabled": False})
    for _ in range(20):
        run.tick(1.0)
    assert run.state["phase"] == "disabled" and not run.requests


def test_a_fixed_baseline_from_a_sweep_replaces_the_recorded_one() -> None:
    run = Run({**WD, "baseline": 2.8, "failure_floor": 1.5})
    run.warm()
    for _ in range(3):
        run.tick(1.45)  # below 1.5 but above 0.5 x 2.8 = 1.4: passes
    assert not run.requests and run.state["baselines"] == {"A": []}
    for _ in range(3):
        run.tick(1.3)
    assert len(run.requests) == 1


def test_tick_rewrites_a_request_lost_between_state_and_request(tmp_path: Path, monkeypatch) -> None:
    run = Run()
    run.warm()
    for _ in range(3):
        run.tick(1.0)
    (tmp_path / "state.json").write_text(json.dumps(run.state))  # the state made it to disk, the request did not
    seen = obs(run.t + 2, run.tokens + 50, run.verify + 50)
    monkeypatch.setattr(wd_mod, "observe", lambda settings, now: seen)
    settings = {"watchdog": WD}
    wd_mod.tick(settings, str(tmp_path), seen["t"])
    request = json.loads((tmp_path / wd_mod.REQUEST).read_text())
    assert request["id"] == run.requests[0]["id"]
    # answered by the root side: never again
    (tmp_path / wd_mod.REQUEST).rename(tmp_path / wd_mod.HANDLED)
    wd_mod.tick(settings, str(tmp_path), seen["t"])
    assert not (tmp_path / wd_mod.REQUEST).exists()


@pytest.mark.parametrize(
    ("key", "value"),
    [("interval_s", 0), ("failure_fraction", 1.0), ("failure_fraction", 0), ("failure_floor", 0.9),
     ("failure_limit", 0), ("min_verify_calls", 0), ("initial_delay_s", -1), ("baseline", 0.5),
     ("enabled", 1), ("interval_s", "'60'")],
)  # fmt: skip
def test_settings_refuse_what_cannot_work(run, inventory: Path, key: str, value: object) -> None:
    code, out, err = run("plan", "--host", "b300", "--inventory", str(inventory), "--set", f"watchdog.{key}={value}")
    assert code == 2 and err.count("\n") == 1 and f"watchdog.{key}" in err, err


def test_settings_reach_the_plan(run, inventory: Path) -> None:
    code, out, _ = run("plan", "--host", "b300", "--inventory", str(inventory), "--json",
                       "--set", "watchdog.interval_s=5")  # fmt: skip
    assert code == 0
    assert json.loads(out)["config"]["watchdog"] == {**Watchdog().model_dump(), "interval_s": 5}


@pytest.mark.parametrize(
    ("sets", "words"),
    [(["serve.algorithm=NONE", "watchdog.interval_s=5"], ["--set watchdog.interval_s=5", "has no effect", "NONE"]),
     (["serve.metrics=false", "watchdog.enabled=true"], ["--set watchdog.enabled=true", "has no effect",
                                                          "serve.metrics is false"])],
)  # fmt: skip
def test_watchdog_settings_without_anything_to_judge_are_refused(run, inventory: Path, sets: list[str],
                                                                 words: list[str]) -> None:  # fmt: skip
    args = [a for s in sets for a in ("--set", s)]
    code, _, err = run("plan", "--host", "b300", "--inventory", str(inventory), *args)
    assert code == 2 and err.count("\n") == 1 and all(w in err for w in words), err


def test_watchdog_settings_from_the_inventory_without_metrics_are_a_note(run, inventory: Path) -> None:
    group_vars = inventory / "group_vars" / "b300.yml"
    group_vars.write_text(group_vars.read_text() + "dflash_watchdog: {interval_s: 5}\n")
    code, out, err = run("plan", "--host", "b300", "--inventory", str(inventory), "--json",
                         "--set", "serve.metrics=false")  # fmt: skip
    assert code == 0, err
    notes = json.loads(out)["notes"]
    assert any("interval_s has no effect" in n and "serve.metrics is false" in n for n in notes), notes
    # disabled, it asks for nothing: no note
    code, out, err = run("plan", "--host", "b300", "--inventory", str(inventory), "--json",
                         "--set", "serve.metrics=false", "--set", "watchdog.enabled=false")  # fmt: skip
    assert code == 0, err
    assert not [n for n in json.loads(out)["notes"] if "watchdog" in n]
