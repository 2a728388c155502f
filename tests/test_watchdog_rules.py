"""The Prometheus rules shipped for sites with Prometheus (roles/sglang_service/files/prometheus/dflash-rules.yml).

promtool checks them and runs their unit tests; then a real Prometheus (Debian's binary, on loopback, in a temp
dir, scraping every second) scrapes two SGLang stand-ins on 127.0.0.1, both collapsed by SGLANG_SIMULATE_ACC_LEN=1:
the alert fires for the one under load and stays quiet for the idle one (whose gauge still says 1.0).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from provision import paths
from tests.conftest import ROOT
from tests.test_standin import SGLANG_PYTHON, chat, free_port, kimi_argv, running

RULES = paths.role_file("sglang_service", "prometheus/dflash-rules.yml")
RULE_TESTS = ROOT / "tests" / "data" / "prometheus" / "dflash-rules.test.yml"
PROMTOOL, PROMETHEUS = shutil.which("promtool"), shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(not PROMTOOL, reason="promtool is not installed (.ci/setup installs prometheus)")


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    proc = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert proc.returncode == 0 and "SUCCESS: 3 rules found" in proc.stdout, proc.stdout + proc.stderr


@needs_promtool
def test_promtool_unit_tests_the_rules() -> None:
    proc = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def fast_rules(tmp: Path) -> Path:
    """The shipped rules with windows of seconds instead of minutes (the expressions otherwise as shipped)."""
    text = RULES.read_text()
    for old, new in (("[5m]", "[10s]"), ("for: 3m", "for: 3s"), ("keep_firing_for: 5m", "keep_firing_for: 5s"),
                     (">= 100", ">= 20")):  # fmt: skip
        assert old in text, old
        text = text.replace(old, new)
    out = tmp / "rules.yml"
    out.write_text(text)
    return out


@pytest.mark.skipif(not (PROMETHEUS and SGLANG_PYTHON), reason="needs prometheus and SGLANG_PYTHON")
def test_a_real_prometheus_fires_on_a_collapse_under_load_and_not_on_an_idle_server(tmp_path: Path) -> None:
    busy_port, idle_port, prom_port = free_port(), free_port(), free_port()
    collapse = {"SGLANG_SIMULATE_ACC_LEN": "1"}
    with (
        running(tmp_path, kimi_argv(busy_port), **collapse) as busy,
        running(tmp_path, kimi_argv(idle_port), **collapse) as idle,
    ):
        busy.wait_healthy()
        idle.wait_healthy()
        chat(idle.url, "one request, then idle")  # the gauge reads 1.0 from here on
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(fast_rules(tmp_path))],
            "scrape_configs": [{"job_name": "sglang", "static_configs": [
                {"targets": [f"127.0.0.1:{busy_port}"], "labels": {"role": "busy"}},
                {"targets": [f"127.0.0.1:{idle_port}"], "labels": {"role": "idle"}}]}],
        }  # fmt: skip
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                chat(busy.url, f"load {time.time()}", max_tokens=64)

        load = threading.Thread(target=loop, daemon=True)
        prom = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"),
        )  # fmt: skip
        load.start()
        try:
            api = f"http://127.0.0.1:{prom_port}/api/v1"
            firing: list[dict] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not firing:
                time.sleep(1)
                try:
                    alerts = httpx.get(f"{api}/alerts", timeout=5).json()["data"]["alerts"]
                except httpx.HTTPError:
                    continue
                firing = [a for a in alerts if a["state"] == "firing"]
            assert [a["labels"]["instance"] for a in firing] == [f"127.0.0.1:{busy_port}"], (
                tmp_path / "prometheus.log"
            ).read_text()[-2000:]
            assert firing[0]["labels"]["alertname"] == "DFlashAcceptanceCollapse"
            # the idle one's gauge says collapsed, its counters say nothing: no alert, not even pending
            gauge = httpx.get(f"{api}/query", params={"query": 'sglang:spec_accept_length{role="idle"}'}).json()
            assert float(gauge["data"]["result"][0]["value"][1]) == 1.0
            alerts = httpx.get(f"{api}/alerts", timeout=5).json()["data"]["alerts"]
            assert all(a["labels"]["instance"] != f"127.0.0.1:{idle_port}" for a in alerts)
        finally:
            stop.set()
            load.join(timeout=30)
            prom.terminate()
            prom.wait(timeout=30)
