"""SGLang STAND-IN: a test double for ``python3 -m sglang.launch_server``. It is NOT SGLang.

It loads no model and needs no GPU. It takes exactly the argv that the systemd unit would pass to
``sglang.launch_server``, checks it with SGLang's own parser (``ServerArgs.add_cli_args``), and
serves SGLang's HTTP contract with placeholder text on the parsed --host/--port, using only the
standard library for the server. Every answer that can carry it says so (``"standin": true``).

Environment:
  SGLANG_STANDIN_LOAD_S    seconds of simulated model load (default 2.0). The port is open during
                           the load; /health, /health_generate and /ready answer 503 until it ends.
  SGLANG_STANDIN_FAIL      ``startup``: listen, never become ready. ``crash``: exit 1 halfway
                           through the load. Anything else non-empty: exit 2.
  SGLANG_STANDIN_TOKEN_S   seconds per decode step (default 0.002); see "Speed" below.
  SGLANG_STANDIN_DRAIN_S   after SIGTERM/SIGINT, how long in-flight requests may run (default 30).
  SGLANG_DDTREE_MAX_TOPK   tree width for --speculative-algorithm DDTREE (default 1).
  SGLANG_SIMULATE_ACC_LEN  SGLang's own test hook: with a speculative algorithm and a value > 0, the accept
                           length L is that value clamped to [1, B] (SGLang's sample_simulated_acc_len
                           clamps the same way); 1 is a collapse. <= 0 or unset: the formula below.

Text: deterministic, seeded by the prompt (chat: the messages; /generate: the text). With
--reasoning-parser, a reasoning part comes first. A line ``STANDIN-REPLY-JSON: {"reasoning": "...",
"content": "..."}`` in the last user message (or /generate text) replaces both parts verbatim.
Without --reasoning-parser, chat gets the raw text (``<think>reasoning</think>content``) in
``content``, as SGLang does for a thinking model with no parser; /generate always gets raw text.
/generate with ``sampling_params.ignore_eos: true`` (bench_serving's requests) runs to exactly
max_new_tokens, as SGLang does; POST /flush_cache answers as SGLang's (nothing to flush).

Accept length (figure L, per speculative config; no algorithm: L = 1.0):
  B    = --speculative-dflash-block-size or --speculative-num-draft-tokens or 16 (DFLASH's default)
  p    = 0.45                                         acceptance share of the B - 1 draft tokens
  DDTREE adds 0.3 * (1 - 1/K) * min(1, budget / (B*K)), K = SGLANG_DDTREE_MAX_TOPK,
         budget = --speculative-ddtree-budget if the parser has it, else B*K
  L    = 1 + (B - 1) * p, so 1 < L < B for every B >= 2 (B < 2 gives L = 1.0)
A request of n tokens takes v = ceil(n / L) verify steps; it reports spec_verify_ct = v and
spec_accept_length = n / v. internal_states[i].avg_spec_accept_length is cumulative since boot:
all completion tokens / all verify steps, exactly as SGLang's scheduler sums them.

Speed: each verify step sleeps SGLANG_STANDIN_TOKEN_S and yields its ~L tokens, so the time per
token is SGLANG_STANDIN_TOKEN_S / L. Streams send one chunk per step, as SGLang does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import signal
import socket
import sys
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# when this process started, before the slow sglang import: with standin_ready_at it gives the
# server's own start time, which bench/reconfigure_speed.py subtracts from a reconfigure's
STARTED_AT = time.time()

BANNER = "sglang-standin: a TEST DOUBLE for sglang.launch_server (no model, no GPU, placeholder text). NOT SGLang."
FAIL_MODES = ("", "startup", "crash")
HOOK = re.compile(r"^[ \t]*STANDIN-REPLY-JSON:[ \t]*(\{.*\})[ \t]*$", re.MULTILINE)
WORDS = (
    "the model answers with placeholder words from a fixed list so that tests can compare them "
    "draft tokens verify block accept tree budget kernel cache prefill decode stream chunk token "
    "server request reply check value result number string list item field state ready done"
).split()
EOS_TOKEN_ID = 2  # matched_stop for a natural end; any fixed id will do
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's sampling_params default


def log(message: str) -> None:
    print(f"standin: {message}", flush=True)


def fail(message: str, code: int) -> None:
    print(f"standin: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def parse_args(argv: list[str]) -> argparse.Namespace:
    # imported late: sglang takes seconds to import, and --help text should not depend on env
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(
        prog="sglang_standin.py",
        description=BANNER + " Takes sglang.launch_server's arguments, checked by SGLang's own parser.",
        epilog="Reads SGLANG_STANDIN_LOAD_S, SGLANG_STANDIN_FAIL, SGLANG_STANDIN_TOKEN_S, SGLANG_STANDIN_DRAIN_S "
        "and SGLANG_DDTREE_MAX_TOPK; see the module docstring.",
    )
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(argv)


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        fail(f"{name}={raw!r} is not a number", 2)
    if value < 0 or not math.isfinite(value):
        fail(f"{name}={raw!r} must be a finite number >= 0", 2)
    return value


@dataclass(frozen=True)
class Env:
    load_s: float
    fail: str
    token_s: float
    drain_s: float
    ddtree_topk: int
    simulate_acc_len: float = -1.0  # SGLang's default: off

    @classmethod
    def read(cls) -> Env:
        mode = os.environ.get("SGLANG_STANDIN_FAIL", "").strip()
        if mode not in FAIL_MODES:
            fail(f"SGLANG_STANDIN_FAIL={mode!r} is not one of: startup, crash (or unset)", 2)
        raw_topk = os.environ.get("SGLANG_DDTREE_MAX_TOPK", "") or "1"
        if not raw_topk.isdigit() or int(raw_topk) < 1:
            fail(f"SGLANG_DDTREE_MAX_TOPK={raw_topk!r} must be a whole number >= 1", 2)
        return cls(
            load_s=env_float("SGLANG_STANDIN_LOAD_S", 2.0),
            fail=mode,
            token_s=env_float("SGLANG_STANDIN_TOKEN_S", 0.002),
            drain_s=env_float("SGLANG_STANDIN_DRAIN_S", 30.0),
            ddtree_topk=int(raw_topk),
            simulate_acc_len=simulated_acc_len(),
        )


def simulated_acc_len() -> float:
    """SGLANG_SIMULATE_ACC_LEN as SGLang reads it (an EnvFloat, default -1: off); negative values mean off."""
    raw = os.environ.get("SGLANG_SIMULATE_ACC_LEN", "").strip()
    if not raw:
        return -1.0
    try:
        value = float(raw)
    except ValueError:
        fail(f"SGLANG_SIMULATE_ACC_LEN={raw!r} is not a number", 2)
    if not math.isfinite(value):
        fail(f"SGLANG_SIMULATE_ACC_LEN={raw!r} must be a finite number", 2)
    return value


def block_size(args: argparse.Namespace) -> int:
    return int(args.speculative_dflash_block_size or args.speculative_num_draft_tokens or 16)


def accept_length(args: argparse.Namespace, env: Env) -> float:
    """The figure L of the module docstring."""
    algorithm = (args.speculative_algorithm or "").upper()
    block = block_size(args)
    if not algorithm or algorithm == "NONE" or block < 2:
        return 1.0
    if env.simulate_acc_len > 0:
        return max(1.0, min(float(block), env.simulate_acc_len))
    share = 0.45
    if algorithm == "DDTREE":
        topk = env.ddtree_topk
        budget = getattr(args, "speculative_ddtree_budget", None) or block * topk
        share += 0.3 * (1 - 1 / topk) * min(1.0, budget / (block * topk))
    return 1 + (block - 1) * share


def tokenize(text: str) -> list[str]:
    # whitespace-led pieces: "".join(tokenize(t)) == t, so truncation and streaming stay exact
    return re.findall(r"\s*\S+|\s+", text)


def hook_reply(text: str) -> tuple[str, str] | None:
    """The STANDIN-REPLY-JSON test hook; raises ValueError on a malformed one."""
    found = HOOK.findall(text)
    if not found:
        return None
    try:
        reply = json.loads(found[-1])
    except json.JSONDecodeError as err:
        raise ValueError(f"STANDIN-REPLY-JSON is not valid JSON: {err}") from None
    if not isinstance(reply, dict) or not all(isinstance(reply.get(k, ""), str) for k in ("reasoning", "content")):
        raise ValueError('STANDIN-REPLY-JSON must be {"reasoning": "...", "content": "..."}')
    return reply.get("reasoning", ""), reply.get("content", "")


def invented_reply(seed: str, with_reasoning: bool) -> tuple[str, str]:
    rng = random.Random(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big"))

    def sentence(count: int) -> str:
        words = [rng.choice(WORDS) for _ in range(count)]
        return (" ".join(words).capitalize() + ".") if words else ""

    reasoning = sentence(rng.randint(12, 32)) if with_reasoning else ""
    return reasoning, "[standin] " + sentence(rng.randint(20, 56))


@dataclass
class Piece:
    """One token of output: which part it belongs to and its text."""

    reasoning: bool
    text: str


@dataclass
class Plan:
    pieces: list[Piece]
    finish_reason: dict[str, Any]
    prompt_tokens: int
    verify_ct: int
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def completion_tokens(self) -> int:
        return len(self.pieces)

    @property
    def reasoning_tokens(self) -> int:
        return sum(p.reasoning for p in self.pieces)

    def steps(self) -> list[list[Piece]]:
        """The pieces of each verify step (non-speculative: one token a step)."""
        n = len(self.pieces)
        v = self.verify_ct or n
        if not n:
            return []
        cuts = [round(i * n / v) for i in range(v + 1)]
        return [self.pieces[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


def flatten(pieces: list[Piece]) -> list[Piece]:
    """The pieces as a model with no reasoning parser emits them: the thinking part inside <think> tags."""
    out: list[Piece] = []
    for i, piece in enumerate(pieces):
        prev = pieces[i - 1].reasoning if i else False
        opening = "<think>" if piece.reasoning and not prev else ""
        closing = "</think>" if prev and not piece.reasoning else ""
        out.append(Piece(False, closing + opening + piece.text))
    return out


def raw_text(pieces: list[Piece]) -> str:
    return "".join(p.text for p in flatten(pieces))


class Standin:
    """Server state shared by the handler threads."""

    def __init__(self, args: argparse.Namespace, argv: list[str], env: Env) -> None:
        self.args, self.argv, self.env = args, argv, env
        self.model_name: str = args.served_model_name or args.model_path
        self.accept = accept_length(args, env)
        self.spec = (args.speculative_algorithm or "NONE").upper() != "NONE"
        self.lock = threading.Lock()
        self.ready = False
        self.draining = False
        self.inflight = 0
        self.idle = threading.Condition(self.lock)
        self.started = time.time()
        self.load_took = 0.0
        self.ready_at: float | None = None
        # cumulative since boot, like SGLang's metrics reporter
        self.spec_accept_tokens = 0
        self.spec_verify_ct = 0
        self.last_gen_throughput = 0.0
        self.counters: dict[tuple[str, str], float] = {}

    # ---- request lifecycle

    def admit(self) -> str | None:
        """Take a generation slot; returns why not when the server can't take work."""
        with self.lock:
            if self.draining:
                return "standin: shutting down, not taking new requests"
            if not self.ready:
                return "standin: the model is still loading"
            self.inflight += 1
            return None

    def release(self) -> None:
        with self.lock:
            self.inflight -= 1
            self.idle.notify_all()

    def plan(self, seed: str, hook_text: str, prompt_tokens: int, max_tokens: int | None,
             ignore_eos: bool = False) -> Plan:  # fmt: skip
        hook = hook_reply(hook_text)
        reasoning, content = hook if hook is not None else invented_reply(seed, bool(self.args.reasoning_parser))
        pieces = [Piece(True, t) for t in tokenize(reasoning)] + [Piece(False, t) for t in tokenize(content)]
        if ignore_eos and max_tokens is not None and len(pieces) < max_tokens:
            # sampling_params.ignore_eos (bench_serving sends it): no natural end, exactly max_new_tokens
            filler = [Piece(False, t) for t in tokenize(" " + invented_reply(seed + "/more", False)[1])]
            pieces += filler * (max_tokens // len(filler) + 1)
        finish: dict[str, Any] = {"type": "stop", "matched": EOS_TOKEN_ID}
        if max_tokens is not None and len(pieces) > max_tokens:
            pieces = pieces[:max_tokens]
            finish = {"type": "length", "length": max_tokens}
        verify_ct = math.ceil(len(pieces) / self.accept) if self.spec and pieces else 0
        return Plan(pieces, finish, prompt_tokens, verify_ct)

    def finished(self, plan: Plan, streaming: bool, took: float) -> None:
        with self.lock:
            self.spec_accept_tokens += plan.completion_tokens if plan.verify_ct else 0
            self.spec_verify_ct += plan.verify_ct
            self.last_gen_throughput = plan.completion_tokens / took if took > 0 else 0.0
            label = "true" if streaming else "false"
            for name, value in (
                ("prompt_tokens_total", plan.prompt_tokens),
                ("generation_tokens_total", plan.completion_tokens),
                ("num_requests_total", 1),
            ):
                self.counters[(name, label)] = self.counters.get((name, label), 0) + value

    def spec_meta(self, plan: Plan) -> dict[str, Any]:
        # SGLang adds these only when the request had verify steps
        if not plan.verify_ct:
            return {}
        proposed = plan.verify_ct * (block_size(self.args) - 1)
        correct = plan.completion_tokens - plan.verify_ct
        return {
            "spec_accept_rate": correct / proposed if proposed else 0.0,
            "spec_accept_length": plan.completion_tokens / plan.verify_ct,
            "spec_num_correct_drafts": correct,
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": plan.verify_ct,
        }

    # ---- read-only views

    def startup_time(self) -> dict[str, Any]:
        return {"load_weight": self.load_took, "kv_cache_allocation": 0.0, "scheduler_e2e": self.load_took,
                "cuda_graph": {}}  # fmt: skip

    def server_info(self) -> dict[str, Any]:
        args = vars(self.args)
        state: dict[str, Any] = {
            **args,
            "world_size": args["dp_size"] * args["tp_size"] * args["pp_size"],
            "startup_time": self.startup_time(),
            "effective_max_running_requests_per_dp": args.get("max_running_requests") or 256,
            "last_gen_throughput": self.last_gen_throughput,
        }
        with self.lock:
            if self.spec and self.spec_verify_ct > 0:
                state["avg_spec_accept_length"] = self.spec_accept_tokens / self.spec_verify_ct
        context = args.get("context_length") or 131072
        return {
            **args,
            "launch_command": " ".join(self.argv),
            "status": "ready" if self.ready else "starting",
            "max_total_num_tokens": context * 4,
            "max_req_input_len": context - 5,
            "kv_events": None,
            "startup_time": self.startup_time(),
            "internal_states": [dict(state) for _ in range(max(1, args["dp_size"]))],
            "version": sglang_version(),
            "frontend": "python",
            "standin": True,
            "standin_accept_length": self.accept,
            "standin_started_at": STARTED_AT,
            "standin_ready_at": self.ready_at,
        }

    def model_info(self) -> dict[str, Any]:
        args = self.args
        return {
            "model_path": args.model_path,
            "served_model_name": self.model_name,
            "tokenizer_path": args.tokenizer_path or args.model_path,
            "is_generation": True,
            "preferred_sampling_params": args.preferred_sampling_params,
            "weight_version": args.weight_version,
            "load_format": args.load_format,
            "reasoning_parser": args.reasoning_parser,
            "tool_call_parser": args.tool_call_parser,
            "disaggregation_mode": args.disaggregation_mode,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": None,
            "architectures": None,
            "standin": True,
        }

    def metrics(self) -> str:
        labels = f'model_name="{self.model_name}",engine_type="unified"'
        lines: list[str] = []
        with self.lock:
            for name, doc in (
                ("prompt_tokens_total", "Number of prefill tokens processed."),
                ("generation_tokens_total", "Number of generation tokens processed."),
                ("num_requests_total", "Number of requests processed."),
            ):
                lines += [f"# HELP sglang:{name} {doc} (standin)", f"# TYPE sglang:{name} counter"]
                for streaming in ("false", "true"):
                    value = float(self.counters.get((name, streaming), 0))
                    lines.append(f'sglang:{name}{{{labels},is_streaming="{streaming}"}} {value}')
            accept = self.spec_accept_tokens / self.spec_verify_ct if self.spec_verify_ct else 0.0
            running = self.inflight
            verify_calls = self.spec_verify_ct
            throughput = self.last_gen_throughput
        lines += [
            "# HELP sglang:spec_verify_calls_total Number of speculative decoding verification calls. (standin)",
            "# TYPE sglang:spec_verify_calls_total counter",
            f"sglang:spec_verify_calls_total{{{labels}}} {float(verify_calls)}",
            "# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding. (standin)",
            "# TYPE sglang:spec_accept_length gauge",
            f"sglang:spec_accept_length{{{labels}}} {accept}",
            "# HELP sglang:num_running_reqs The number of running requests. (standin)",
            "# TYPE sglang:num_running_reqs gauge",
            f"sglang:num_running_reqs{{{labels}}} {float(running)}",
            "# HELP sglang:gen_throughput The generation throughput (token/s). (standin)",
            "# TYPE sglang:gen_throughput gauge",
            f"sglang:gen_throughput{{{labels}}} {throughput}",
        ]
        return "\n".join(lines) + "\n"


def sglang_version() -> str:
    try:
        import sglang.version

        return str(sglang.version.__version__)
    except Exception:  # noqa: BLE001 - the version is decoration here
        return "unknown"


def error_body(message: str, status: int, phrase: str) -> dict[str, Any]:
    # SGLang's ErrorResponse shape
    return {"object": "error", "message": message, "type": phrase, "param": None, "code": status}


def message_text(content: Any) -> str:
    """Text of an OpenAI message content: a string or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


class BadRequest(Exception):
    pass


def max_tokens_of(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"{name} must be a non-negative integer, got {value!r}")
    return value


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # small streamed chunks must leave at once (Nagle's algorithm held them back: ~45 ms TTFT)
    disable_nagle_algorithm = True
    server_version = "sglang-standin"
    standin: Standin  # set on the subclass made in serve()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # access logs would drown the journal lines that tests and people read

    # ---- plumbing

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def send_empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def send_event(self, payload: Any) -> None:
        data = b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_stream(self) -> None:
        self.send_event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise BadRequest(f"JSON decode error: {err}") from None

    def authorized(self, path: str) -> bool:
        # SGLang's decide_request_auth: probes and metrics are always open, by prefix
        key = self.standin.args.api_key
        if not key or self.command == "OPTIONS" or path.startswith(("/health", "/ready", "/metrics")):
            return True
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and token == key

    # ---- dispatch

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self.dispatch()

    def do_PUT(self) -> None:  # noqa: N802
        self.dispatch()

    def dispatch(self) -> None:
        path = self.path.split("?", 1)[0]
        if not self.authorized(path):
            # read the refused body, or it would be taken for the next request on this connection
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_json(401, {"error": "Unauthorized"})
            return
        standin = self.standin
        routes: dict[str, tuple[tuple[str, ...], Any]] = {
            "/health": (("GET",), self.health),
            "/health_generate": (("GET",), self.health),
            "/ready": (("GET",), self.health),
            "/get_server_info": (("GET",), lambda: self.send_json(200, standin.server_info())),
            "/server_info": (("GET",), lambda: self.send_json(200, standin.server_info())),
            "/get_model_info": (("GET",), lambda: self.send_json(200, standin.model_info())),
            "/model_info": (("GET",), lambda: self.send_json(200, standin.model_info())),
            "/v1/models": (("GET",), self.models),
            "/v1/chat/completions": (("POST",), self.chat),
            "/generate": (("POST", "PUT"), self.generate),
            "/flush_cache": (("GET", "POST"), self.flush_cache),  # bench_serving, after its warm-up
        }
        if standin.args.enable_metrics and path.startswith("/metrics"):
            routes[path] = (("GET",), self.metrics)
        if path.startswith("/v1/models/"):
            routes[path] = (("GET",), lambda: self.model_card(path.removeprefix("/v1/models/")))
        if path not in routes:
            self.send_json(404, {"detail": "Not Found"})
            return
        methods, handler = routes[path]
        if self.command not in methods:
            self.send_json(405, {"detail": "Method Not Allowed"}, {"Allow": ", ".join(methods)})
            return
        try:
            handler()
        except BadRequest as err:
            self.send_json(400, error_body(str(err), 400, "Bad Request"))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client left; nothing to answer

    # ---- endpoints

    def health(self) -> None:
        with self.standin.lock:
            up = self.standin.ready and not self.standin.draining
        self.send_empty(200 if up else 503)

    def flush_cache(self) -> None:
        # SGLang's answer; the stand-in has no cache to flush
        data = b"Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"  # noqa: E501
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def metrics(self) -> None:
        data = self.standin.metrics().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def card(self) -> dict[str, Any]:
        name = self.standin.model_name
        return {"id": name, "object": "model", "created": int(self.standin.started), "owned_by": "sglang",
                "root": name, "parent": None, "max_model_len": self.standin.args.context_length or 131072}  # fmt: skip

    def models(self) -> None:
        self.send_json(200, {"object": "list", "data": [self.card()]})

    def model_card(self, name: str) -> None:
        if name == self.standin.model_name:
            self.send_json(200, self.card())
            return
        self.send_json(404, {"error": {"message": f"The model '{name}' does not exist", "type": "invalid_request_error",
                                       "param": "model", "code": "model_not_found"}})  # fmt: skip

    def run_generation(self, plan: Plan, emit: Any, streaming: bool) -> float:
        """Sleep through the verify steps, calling emit(pieces_of_step, done_so_far) after each."""
        begin = time.monotonic()
        done = 0
        for step in plan.steps():
            time.sleep(self.standin.env.token_s)
            done += len(step)
            emit(step, done)
        took = time.monotonic() - begin
        self.standin.finished(plan, streaming, took)
        return took

    def admit_or_503(self) -> bool:
        why = self.standin.admit()
        if why is not None:
            self.send_json(503, error_body(why, 503, "Service Unavailable"))
            return False
        return True

    def chat(self) -> None:
        media = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            raise BadRequest("Unsupported Media Type: Only 'application/json' is allowed")
        body = self.read_json()
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise BadRequest("messages: Field required (a non-empty list)")
        messages = body["messages"]
        if not all(isinstance(m, dict) for m in messages):
            raise BadRequest("messages: each message must be an object")
        limit = max_tokens_of(body.get("max_completion_tokens", body.get("max_tokens")), "max_tokens")
        last_user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        prompt_tokens = sum(len(tokenize(message_text(m.get("content")))) + 4 for m in messages)
        try:
            plan = self.standin.plan(json.dumps(messages, sort_keys=True), message_text(last_user.get("content")),
                                     prompt_tokens, limit)  # fmt: skip
        except ValueError as err:
            raise BadRequest(str(err)) from None
        separate = bool(self.standin.args.reasoning_parser) and body.get("separate_reasoning", True) is not False
        if not separate:  # no parser: the thinking part stays in the text, tags and all
            plan.pieces = flatten(plan.pieces)
        plan.rid = "chatcmpl-" + plan.rid  # SGLang's chat request ids
        model = body.get("model") or "default"
        created = int(time.time())
        if not self.admit_or_503():
            return
        try:
            if body.get("stream"):
                self.chat_stream(body, plan, model, created)
            else:
                self.chat_whole(plan, model, created)
        finally:
            self.standin.release()

    def usage(self, plan: Plan) -> dict[str, Any]:
        reasoning = plan.reasoning_tokens
        return {
            "prompt_tokens": plan.prompt_tokens,
            "total_tokens": plan.prompt_tokens + plan.completion_tokens,
            "completion_tokens": plan.completion_tokens,
            "prompt_tokens_details": None,
            "reasoning_tokens": reasoning,
            "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
        }

    def chat_whole(self, plan: Plan, model: str, created: int) -> None:
        self.run_generation(plan, lambda step, done: None, streaming=False)
        reasoning = "".join(p.text for p in plan.pieces if p.reasoning)
        content = "".join(p.text for p in plan.pieces if not p.reasoning)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content, "reasoning_content": reasoning or None},
            "logprobs": None,
            "finish_reason": plan.finish_reason["type"],
            "matched_stop": plan.finish_reason.get("matched"),
        }
        self.send_json(200, {
            "id": plan.rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
            "usage": self.usage(plan), "metadata": {"weight_version": self.standin.args.weight_version},
        })  # fmt: skip

    def chat_stream(self, body: dict[str, Any], plan: Plan, model: str, created: int) -> None:
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage")) or self.standin.args.stream_response_default_include_usage

        def chunk(delta: dict[str, Any], finish: str | None = None, matched: Any = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": matched}
            return {"id": plan.rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [choice]}  # fmt: skip

        def emit(step: list[Piece], done: int) -> None:
            reasoning = "".join(p.text for p in step if p.reasoning)
            content = "".join(p.text for p in step if not p.reasoning)
            if reasoning:
                self.send_event(chunk({"reasoning_content": reasoning}))
            if content:
                self.send_event(chunk({"reasoning_content": None, "content": content}))

        self.start_stream()
        self.send_event(chunk({"reasoning_content": None, "role": "assistant", "content": ""}))
        self.run_generation(plan, emit, streaming=True)
        finish = plan.finish_reason
        self.send_event(chunk({"reasoning_content": None}, finish["type"], finish.get("matched")))
        if include_usage:
            usage_chunk = {"id": plan.rid, "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": [], "usage": self.usage(plan)}  # fmt: skip
            self.send_event(usage_chunk)
        self.end_stream()

    def generate(self) -> None:
        body = self.read_json()
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        text, input_ids = body.get("text"), body.get("input_ids")
        if isinstance(text, list) or (isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list)):
            raise BadRequest("standin: batched /generate is not supported")
        if text is None and input_ids is None:
            raise BadRequest("Either text or input_ids should be provided.")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object")
        limit = max_tokens_of(params.get("max_new_tokens", GENERATE_DEFAULT_MAX_NEW_TOKENS), "max_new_tokens")
        prompt = text if isinstance(text, str) else json.dumps(input_ids)
        prompt_tokens = len(tokenize(text)) if isinstance(text, str) else len(input_ids or [])
        try:
            plan = self.standin.plan(prompt, prompt, max(1, prompt_tokens), limit, params.get("ignore_eos") is True)
        except ValueError as err:
            raise BadRequest(str(err)) from None
        if not self.admit_or_503():
            return
        try:
            self.generate_stream(plan) if body.get("stream") else self.generate_whole(plan)
        finally:
            self.standin.release()

    def meta(self, plan: Plan, done: int, finished: bool, took: float) -> dict[str, Any]:
        pieces = plan.pieces[:done]
        meta = {
            "id": plan.rid,
            "finish_reason": plan.finish_reason if finished else None,
            "prompt_tokens": plan.prompt_tokens,
            "weight_version": self.standin.args.weight_version,
            "num_retractions": 0,
            "reasoning_tokens": sum(p.reasoning for p in pieces),
            "completion_tokens": done,
            "cached_tokens": 0,
            "e2e_latency": took,
        }
        if finished:
            meta.update(self.standin.spec_meta(plan))
        return meta

    def generate_whole(self, plan: Plan) -> None:
        took = self.run_generation(plan, lambda step, done: None, streaming=False)
        self.send_json(200, {
            "text": raw_text(plan.pieces),
            "output_ids": [zlib.crc32(p.text.encode()) % 150000 for p in plan.pieces],
            "meta_info": self.meta(plan, plan.completion_tokens, True, took),
        })  # fmt: skip

    def generate_stream(self, plan: Plan) -> None:
        # SGLang streams the whole text so far unless --incremental-streaming-output
        incremental = bool(self.standin.args.incremental_streaming_output)
        begin = time.monotonic()
        last = len(plan.steps())
        count = [0]

        def emit(step: list[Piece], done: int) -> None:
            count[0] += 1
            shown = step if incremental else plan.pieces[:done]
            self.send_event({
                "text": raw_text(shown) if not incremental else "".join(p.text for p in shown),
                "output_ids": [zlib.crc32(p.text.encode()) % 150000 for p in shown],
                "meta_info": self.meta(plan, done, count[0] == last, time.monotonic() - begin),
            })  # fmt: skip

        self.start_stream()
        self.run_generation(plan, emit, streaming=True)
        if not last:
            self.send_event({"text": "", "output_ids": [], "meta_info": self.meta(plan, 0, True, 0.0)})
        self.end_stream()


def serve(args: argparse.Namespace, argv: list[str], env: Env) -> int:
    standin = Standin(args, argv, env)
    handler = type("BoundHandler", (Handler,), {"standin": standin})

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in args.host else socket.AF_INET

    try:
        server = Server((args.host, args.port), handler)
    except OSError as err:
        fail(f"cannot listen on {args.host}:{args.port}: {err}", 1)
    # a short poll: shutdown() waits for it, and a real server has no such delay
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="http", daemon=True).start()

    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    log(BANNER)
    log(f"listening on http://{args.host}:{args.port}, model {standin.model_name!r} (not loaded), "
        f"accept length {standin.accept:.3f}, loading for {env.load_s:g} s")  # fmt: skip
    # the load: the port is open and probes get 503 meanwhile
    if env.fail == "crash":
        if stop.wait(env.load_s / 2):
            log("signal during load: exit 0")
            return 0
        log("SGLANG_STANDIN_FAIL=crash: simulated crash while loading the model, exit 1")
        return 1
    if stop.wait(env.load_s):
        log("signal during load: exit 0")
        return 0
    if env.fail == "startup":
        log("SGLANG_STANDIN_FAIL=startup: simulated hang, never becoming ready (503 forever)")
    else:
        standin.load_took = time.time() - standin.started
        with standin.lock:
            standin.ready = True
            standin.ready_at = time.time()
        log("ready (SGLang would log: The server is fired up and ready to roll!)")
    stop.wait()

    with standin.lock:
        standin.draining = True
        log(f"draining {standin.inflight} requests (deadline {env.drain_s:g} s)")
        deadline = time.monotonic() + env.drain_s
        while standin.inflight and (left := deadline - time.monotonic()) > 0:
            standin.idle.wait(left)
        left_over = standin.inflight
    if left_over:
        log(f"drain deadline passed with {left_over} requests still running; cutting them off")
    server.shutdown()
    server.server_close()
    log("stopped, exit 0")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)  # exits 2 with argparse's message on a flag SGLang refuses
    env = Env.read()
    return serve(args, argv, env)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip the interpreter's teardown of the sglang/torch imports (~0.6 s): it would count as stop time
    os._exit(code)
