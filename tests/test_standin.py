"""The SGLang stand-in (provision/sandbox/sglang_double.py): a test double the sandbox hosts run instead of SGLang.

The stand-in runs under SGLANG_PYTHON (or .venv-sglang), since it parses its argv with SGLang's own parser;
those tests are skipped without one, never passed. The accept-length formula is checked here directly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from provision import paths
from provision.sandbox import sglang_double as sglang_standin

ROOT = Path(__file__).resolve().parent.parent
STANDIN = paths.standin()
LOCAL = ROOT / ".venv-sglang" / "bin" / "python"
SGLANG_PYTHON = os.environ.get("SGLANG_PYTHON") or (str(LOCAL) if LOCAL.exists() else None)
KEY = "test-key"

needs_sglang = pytest.mark.skipif(not SGLANG_PYTHON, reason="SGLANG_PYTHON is not set (a Python with sglang installed)")


def kimi_argv(port: int) -> list[str]:
    """What the real unit passes to sglang.launch_server on a DFLASH host."""
    return [
        "--model-path", "/models/Kimi-K2.6", "--served-model-name", "kimi-k2.6", "--trust-remote-code",
        "--tp-size", "8", "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
        "/models/Kimi-K2.6-DFlash", "--speculative-num-draft-tokens", "8", "--speculative-draft-window-size", "2048",
        "--attention-backend", "flashinfer", "--host", "127.0.0.1", "--port", str(port), "--api-key", KEY,
        "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--enable-metrics",
    ]  # fmt: skip


def plain_argv(port: int) -> list[str]:
    return ["--model-path", "/models/plain", "--host", "127.0.0.1", "--port", str(port)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Standin:
    proc: subprocess.Popen[str]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text()

    def wait_listening(self, timeout: float = 60) -> None:
        host, port = self.url.removeprefix("http://").split(":")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the stand-in exited {self.proc.returncode}:\n{self.output()}"
            try:
                socket.create_connection((host, int(port)), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        raise AssertionError(f"the stand-in never listened:\n{self.output()}")

    def wait_healthy(self, timeout: float = 60) -> None:
        self.wait_listening(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if httpx.get(f"{self.url}/health").status_code == 200:
                return
            time.sleep(0.05)
        raise AssertionError(f"the stand-in never became healthy:\n{self.output()}")


def launch(tmp: Path, argv: list[str], **env: str) -> Standin:
    port = argv[argv.index("--port") + 1] if "--port" in argv else "30000"
    log = tmp / f"standin-{len(list(tmp.iterdir()))}.log"
    full_env = {**os.environ, "SGLANG_STANDIN_LOAD_S": "0.3", **env}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(SGLANG_PYTHON), str(STANDIN), *argv], stdout=out, stderr=subprocess.STDOUT, text=True, env=full_env
        )
    return Standin(proc, f"http://127.0.0.1:{port}", log)


@contextmanager
def running(tmp: Path, argv: list[str], **env: str) -> Iterator[Standin]:
    standin = launch(tmp, argv, **env)
    try:
        yield standin
    finally:
        if standin.proc.poll() is None:
            standin.proc.kill()
        standin.proc.wait(timeout=30)


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def sse(lines: Iterator[str]) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


def chat(url: str, content: str, **extra: object) -> httpx.Response:
    body = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth(), timeout=30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Standin]]:
    """The stand-ins whose tests do not care when they look, started together: each spends seconds importing sglang."""
    if not SGLANG_PYTHON:
        pytest.skip("SGLANG_PYTHON is not set (a Python with sglang installed)")
    tmp = tmp_path_factory.mktemp("fleet")
    refused = [*kimi_argv(free_port()), "--speculative-ddtree-budget", "8"]
    with ExitStack() as stack:
        yield {
            "kimi": stack.enter_context(running(tmp, kimi_argv(free_port()))),
            "help": stack.enter_context(running(tmp, ["--help"])),
            "bad-flag": stack.enter_context(running(tmp, refused)),
            "bad-fail": stack.enter_context(running(tmp, plain_argv(free_port()), SGLANG_STANDIN_FAIL="sometimes")),
            "crash": stack.enter_context(running(tmp, plain_argv(free_port()), SGLANG_STANDIN_FAIL="crash")),
            "startup": stack.enter_context(running(tmp, plain_argv(free_port()), SGLANG_STANDIN_FAIL="startup")),
        }


@pytest.fixture(scope="module")
def kimi(fleet: dict[str, Standin]) -> Standin:
    fleet["kimi"].wait_healthy()
    return fleet["kimi"]


# ---- the formula, without a server


def spec_args(algorithm: str | None, draft_tokens: int | None = None, **extra: object) -> SimpleNamespace:
    return SimpleNamespace(speculative_algorithm=algorithm, speculative_num_draft_tokens=draft_tokens,
                           speculative_dflash_block_size=None, **extra)  # fmt: skip


def env(topk: int = 1) -> sglang_standin.Env:
    return sglang_standin.Env(load_s=0, fail="", token_s=0, drain_s=0, ddtree_topk=topk)


@pytest.mark.parametrize("block", [2, 3, 8, 16, 64])
@pytest.mark.parametrize("algorithm", ["DFLASH", "DDTREE"])
def test_accept_length_is_between_one_and_the_block(algorithm: str, block: int) -> None:
    for topk in (1, 4, 16):
        length = sglang_standin.accept_length(spec_args(algorithm, block), env(topk))
        assert 1 < length < block


def test_accept_length_follows_the_config() -> None:
    assert sglang_standin.accept_length(spec_args(None), env()) == 1.0
    assert sglang_standin.accept_length(spec_args("DFLASH", 8), env()) == pytest.approx(1 + 7 * 0.45)
    assert sglang_standin.accept_length(spec_args("DFLASH"), env()) == pytest.approx(1 + 15 * 0.45)  # block 16
    wide = sglang_standin.accept_length(spec_args("DDTREE", 8), env(4))
    assert wide == pytest.approx(1 + 7 * (0.45 + 0.3 * 0.75))
    small_budget = sglang_standin.accept_length(spec_args("DDTREE", 8, speculative_ddtree_budget=16), env(4))
    assert 1 + 7 * 0.45 < small_budget < wide


# ---- the process


def test_help_says_it_is_a_test_double(fleet: dict[str, Standin]) -> None:
    standin = fleet["help"]
    assert standin.proc.wait(timeout=120) == 0, standin.output()
    assert "TEST DOUBLE" in standin.output() and "NOT SGLang" in standin.output()
    assert "--speculative-algorithm" in standin.output()  # SGLang's own flags


def test_a_flag_sglang_refuses_exits_2_with_the_parsers_message(fleet: dict[str, Standin]) -> None:
    standin = fleet["bad-flag"]
    assert standin.proc.wait(timeout=120) == 2
    assert "error: unrecognized arguments: --speculative-ddtree-budget 8" in standin.output()


def test_an_unknown_failure_mode_exits_2(fleet: dict[str, Standin]) -> None:
    standin = fleet["bad-fail"]
    assert standin.proc.wait(timeout=120) == 2
    assert "SGLANG_STANDIN_FAIL='sometimes'" in standin.output()


def test_fail_crash_exits_1_during_the_load(fleet: dict[str, Standin]) -> None:
    standin = fleet["crash"]
    assert standin.proc.wait(timeout=120) == 1
    out = standin.output()
    assert "listening on" in out and "simulated crash" in out and "standin: ready" not in out


def test_fail_startup_listens_but_stays_503(fleet: dict[str, Standin]) -> None:
    standin = fleet["startup"]
    standin.wait_listening()
    deadline = time.monotonic() + 1.5  # well past the 0.3 s load
    while time.monotonic() < deadline:
        assert httpx.get(standin.url + "/health").status_code == 503
        time.sleep(0.1)
    assert standin.proc.poll() is None
    assert "never becoming ready" in standin.output()
    standin.proc.send_signal(signal.SIGTERM)
    assert standin.proc.wait(timeout=30) == 0


@needs_sglang
def test_probes_answer_503_while_loading_then_200(tmp_path: Path) -> None:
    with running(tmp_path, plain_argv(free_port()), SGLANG_STANDIN_LOAD_S="2.0") as standin:
        standin.wait_listening()
        for probe in ("/health", "/health_generate"):
            assert httpx.get(standin.url + probe).status_code == 503
        standin.wait_healthy()
        assert httpx.get(standin.url + "/health_generate").status_code == 200
        assert "standin: ready" in standin.output()
        # no --reasoning-parser, no speculative algorithm, no --enable-metrics
        reply = chat(standin.url, "hello").json()["choices"][0]["message"]
        assert reply["content"] and reply["reasoning_content"] is None
        info = httpx.get(standin.url + "/get_server_info").json()
        assert "avg_spec_accept_length" not in info["internal_states"][0]  # SGLang leaves it out too
        assert httpx.get(standin.url + "/metrics").status_code == 404
        assert httpx.get(standin.url + "/v1/models").json()["data"][0]["id"] == "/models/plain"


@needs_sglang
def test_sigterm_drains_an_inflight_stream_then_exits_0(tmp_path: Path) -> None:
    with running(tmp_path, plain_argv(free_port()), SGLANG_STANDIN_TOKEN_S="0.05") as standin:
        standin.wait_healthy()
        body = {"messages": [{"role": "user", "content": "a long one"}], "max_tokens": 30, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        with httpx.stream("POST", f"{standin.url}/v1/chat/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            standin.proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)  # let the signal land
            assert httpx.get(standin.url + "/health").status_code == 503
            refused = httpx.post(f"{standin.url}/v1/chat/completions", json={**body, "stream": False})
            assert refused.status_code == 503
            rest = sse(lines)
        events = [json.loads(first.removeprefix("data: "))] + [json.loads(e) for e in rest[:-1]]
        assert rest[-1] == "[DONE]"
        assert events[-1]["usage"]["completion_tokens"] == 30
        assert standin.proc.wait(timeout=30) == 0
        out = standin.output()
        assert "standin: draining 1 requests" in out and "exit 0" in out


# ---- one realistic DFLASH server for the HTTP contract


@needs_sglang
def test_the_startup_log_says_it_is_a_test_double(kimi: Standin) -> None:
    assert "TEST DOUBLE" in kimi.output() and "NOT SGLang" in kimi.output()


@needs_sglang
def test_api_key_guards_all_but_the_probes(kimi: Standin) -> None:
    for path in ("/v1/models", "/get_server_info", "/server_info"):
        assert httpx.get(kimi.url + path).status_code == 401
        assert httpx.get(kimi.url + path, headers=auth("wrong")).status_code == 401
        assert httpx.get(kimi.url + path, headers=auth()).status_code == 200
    assert httpx.post(f"{kimi.url}/generate", json={"text": "x"}).status_code == 401
    for path in ("/health", "/health_generate", "/metrics"):
        assert httpx.get(kimi.url + path).status_code == 200
    assert httpx.get(kimi.url + "/v1/models", headers=auth()).json()["data"][0]["id"] == "kimi-k2.6"


@needs_sglang
def test_streaming_chat_has_reasoning_and_content_chunks(kimi: Standin) -> None:
    body = {"model": "kimi-k2.6", "messages": [{"role": "user", "content": "stream please"}], "stream": True,
            "max_tokens": 40, "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", f"{kimi.url}/v1/chat/completions", json=body, headers=auth(), timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse(response.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert reasoning and content
    whole = chat(kimi.url, "stream please", max_tokens=40).json()
    assert whole["choices"][0]["message"]["reasoning_content"] == reasoning  # deterministic, seeded by the prompt
    assert whole["choices"][0]["message"]["content"] == content
    assert chunks[-1]["usage"] == whole["usage"]
    assert whole["usage"]["completion_tokens"] <= 40


@needs_sglang
def test_max_tokens_cuts_the_reply(kimi: Standin) -> None:
    reply = chat(kimi.url, "short", max_tokens=3).json()
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 3


@needs_sglang
def test_server_info_has_the_args_and_a_cumulative_accept_length(kimi: Standin) -> None:
    for i in range(3):
        assert chat(kimi.url, f"warm {i}").status_code == 200
    info = httpx.get(kimi.url + "/get_server_info", headers=auth()).json()
    assert info["standin"] is True and info["version"] == "0.5.23"
    assert info["speculative_algorithm"] == "DFLASH" and info["speculative_num_draft_tokens"] == 8
    assert info["tp_size"] == 8 and info["served_model_name"] == "kimi-k2.6" and info["reasoning_parser"] == "kimi_k2"
    first = info["internal_states"][0]["avg_spec_accept_length"]
    assert 1 < first < 8
    alias = httpx.get(kimi.url + "/server_info", headers=auth()).json()
    assert alias.keys() == info.keys() and alias["internal_states"] == info["internal_states"]
    native = httpx.post(f"{kimi.url}/generate", json={"text": "more", "sampling_params": {"max_new_tokens": 50}},
                        headers=auth()).json()  # fmt: skip
    meta = native["meta_info"]
    assert meta["completion_tokens"] == 50 and meta["prompt_tokens"] > 0
    assert meta["spec_verify_ct"] > 0 and meta["spec_accept_length"] == 50 / meta["spec_verify_ct"]
    after = httpx.get(kimi.url + "/get_server_info", headers=auth()).json()["internal_states"][0]
    assert after["avg_spec_accept_length"] != first  # it moved: a running figure over all requests
    assert 1 < after["avg_spec_accept_length"] < 8


@needs_sglang
def test_metrics_count_tokens(kimi: Standin) -> None:
    chat(kimi.url, "count me", max_tokens=5)
    text = httpx.get(kimi.url + "/metrics").text
    counters = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sglang:") and 'is_streaming="false"' in line
    }
    assert counters["sglang:prompt_tokens_total"] > 0 and counters["sglang:generation_tokens_total"] >= 5


@needs_sglang
def test_reply_hook_gives_exactly_the_parts(kimi: Standin) -> None:
    reasoning = "Plan:\n```python\ndef add(a, b):\n    return a +"  # an unfinished block, on purpose
    content = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\n"
    prompt = "Write add().\nSTANDIN-REPLY-JSON: " + json.dumps({"reasoning": reasoning, "content": content})
    message = chat(kimi.url, prompt).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": content, "reasoning_content": reasoning}
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True}
    with httpx.stream("POST", f"{kimi.url}/v1/chat/completions", json=body, headers=auth(), timeout=30) as response:
        deltas = [json.loads(e)["choices"][0]["delta"] for e in sse(response.iter_lines())[:-1]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == reasoning
    assert "".join(d.get("content") or "" for d in deltas) == content
    native = httpx.post(f"{kimi.url}/generate", json={"text": prompt}, headers=auth()).json()
    assert native["text"] == f"<think>{reasoning}</think>{content}"  # /generate is raw model text


@needs_sglang
def test_what_bench_serving_asks_for(kimi: Standin) -> None:
    """bench_serving's /generate requests set ignore_eos: the reply runs to exactly max_new_tokens; and after its
    warm-up it may POST /flush_cache (with ?timeout=)."""
    body = {"text": "one two", "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}}
    meta = httpx.post(f"{kimi.url}/generate", json=body, headers=auth(), timeout=30).json()["meta_info"]
    assert meta["completion_tokens"] == 300 and meta["finish_reason"]["type"] == "length"
    assert meta["spec_accept_length"] == 300 / meta["spec_verify_ct"]
    natural = {"text": "one two", "sampling_params": {"max_new_tokens": 300}}
    meta = httpx.post(f"{kimi.url}/generate", json=natural, headers=auth(), timeout=30).json()["meta_info"]
    assert meta["completion_tokens"] < 300 and meta["finish_reason"]["type"] == "stop"
    flushed = httpx.post(f"{kimi.url}/flush_cache?timeout=60", headers=auth())
    assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")
    assert httpx.post(f"{kimi.url}/flush_cache").status_code == 401  # behind the key, as in SGLang


def test_simulated_acceptance_is_sglangs_hook_clamped_to_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLANG_SIMULATE_ACC_LEN (SGLang's own env hook): > 0 forces L, clamped to [1, B]; <= 0 or unset is off."""
    for raw, want in (("1", 1.0), ("2.5", 2.5), ("99", 8.0), ("0.5", 1.0), ("-1", 1 + 7 * 0.45), ("", 1 + 7 * 0.45)):
        monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", raw)
        monkeypatch.setenv("SGLANG_STANDIN_LOAD_S", "0")
        assert sglang_standin.accept_length(spec_args("DFLASH", 8), sglang_standin.Env.read()) == pytest.approx(want)
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "1")
    assert sglang_standin.accept_length(spec_args(None), sglang_standin.Env.read()) == 1.0  # no speculation: 1


@pytest.mark.parametrize("raw", ["fast", "nan", "inf"])
def test_simulated_acceptance_must_be_a_number(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", raw)
    with pytest.raises(SystemExit) as exc:
        sglang_standin.Env.read()
    assert exc.value.code == 2
