"""Service readiness: the unit, what it listens on, health, a real completion, the API key, and acceptance.

On hosts without GPUs the unit runs the SGLang stand-in (provision/sandbox/sglang_double.py): these checks then
prove the unit, the key and the readiness contract, and the report marks them as served by the stand-in.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from provision.verify.checks.conftest import service_key


@pytest.fixture
def service(host: Any, plan: dict[str, Any]) -> dict[str, Any]:
    if not host.exists("systemctl") or host.run("test -d /run/systemd/system").rc != 0:
        pytest.skip(f"no systemd on {host.backend.get_hostname()}: the service is not deployed there")
    return plan["config"]["service"] | {"url": plan["service_url"]}


def _curl(host: Any, url: str, key: str | None = None, body: dict[str, Any] | None = None) -> tuple[int, str]:
    args = ["curl", "-s", "-m", "60", "-w", "\\n%{http_code}"]
    if key:
        args += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    out = host.run(" ".join(shlex.quote(a) for a in [*args, url])).stdout
    text, _, code = out.rpartition("\n")
    return int(code or 0), text


def test_unit_is_active_and_enabled(host: Any, service: dict[str, Any]) -> None:
    unit = host.service(service["name"])
    assert unit.is_running and unit.is_enabled


def test_listens_only_on_the_configured_address(host: Any, plan: dict[str, Any], service: dict[str, Any]) -> None:
    port = plan["config"]["serve"]["port"]
    pid = host.check_output(f"systemctl show -p MainPID --value {service['name']}").strip()
    listening = host.check_output(f"ss -Hltnp 'sport = :{port}'")
    assert f"pid={pid}," in listening, listening
    addresses = {line.split()[3].rsplit(":", 1)[0] for line in listening.splitlines()}
    assert addresses == {plan["config"]["serve"]["host"]}, listening


def test_health_generate_answers_200(host: Any, plan: dict[str, Any], service: dict[str, Any]) -> None:
    code, _ = _curl(host, service["url"] + "/health_generate", service_key(host, plan))
    assert code == 200


def test_a_completion_returns_tokens(host: Any, plan: dict[str, Any], service: dict[str, Any]) -> None:
    body = {"model": plan["config"]["model"]["served_name"] or plan["config"]["model"]["path"],
            "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}  # fmt: skip
    code, text = _curl(host, service["url"] + "/v1/chat/completions", service_key(host, plan), body)
    assert code == 200, text[-500:]
    assert json.loads(text)["usage"]["completion_tokens"] > 0


def test_a_request_without_the_key_is_refused(host: Any, plan: dict[str, Any], service: dict[str, Any]) -> None:
    if not plan["config"]["serve"]["api_key_file"]:
        pytest.skip("no API key is configured (serve.api_key_file)")
    code, _ = _curl(host, service["url"] + "/v1/models")
    assert code == 401


def test_speculative_decoding_accepts_more_than_one_token(
    host: Any, plan: dict[str, Any], service: dict[str, Any]
) -> None:
    if plan["config"]["serve"]["algorithm"] == "NONE":
        pytest.skip("speculative decoding is off (serve.algorithm NONE)")
    code, text = _curl(host, service["url"] + "/get_server_info", service_key(host, plan))
    assert code == 200, text[-500:]
    states = json.loads(text).get("internal_states") or [{}]
    accept = states[0].get("avg_spec_accept_length")
    assert accept is not None and accept > 1, states[0]
