"""Load for one benchmark cell, measured with `python -m sglang.bench_serving`'s definitions.

What matches bench_serving (sglang/benchmark/serving.py, backend "sglang"):
- requests go to SGLang's native `POST /generate` with `stream: true` and
  `sampling_params: {max_new_tokens, ignore_eos: true, temperature: 0}`; all are queued at once
  (`--request-rate inf`) and at most `concurrency` are in flight (`--max-concurrency`);
- warm-up: `warmup` requests of the first prompt with at most 32 output tokens, at the same concurrency;
- TTFT: request start to the first chunk with text; ITL: each later chunk's gap split evenly over the tokens it
  added (SGLang streams one chunk per verify step, so one chunk carries several tokens); TPOT per request:
  (latency - TTFT) / (output tokens - 1); output token count: the last chunk's `meta_info.completion_tokens`;
- output throughput: all output tokens / wall duration of the measured run; request throughput: completed / duration;
  percentiles: linear interpolation (numpy's default), p50 = median.

What differs: bench_serving's random dataset cuts ShareGPT text to exactly N tokens with the model's tokenizer.
This client has no tokenizer: a prompt is N words drawn (seeded) from a fixed list of short common English words,
which common BPE tokenizers encode as about one token each (with the leading space), so "input_tokens" is
approximate; the server's own count is in `prompt_tokens` of each reply.

Accept length: per run, from each request's final `meta_info`: sum(completion_tokens) / sum(spec_verify_ct)
(`CellResult.accept_length`, the figure to use; `accept_source` says how it was read). `/get_server_info`'s
avg_spec_accept_length is cumulative since boot, so `accept_length_delta` can only turn a snapshot pair into a
per-run figure with the token counts since boot; it is kept as a cross-check.

bench_serving: the sweep runs it through provision/sweep/bench_driver.py (`driver_argv`), which keeps each
measured request's spec_accept_length, and reads the line it appends to --output-file (`parse_bench_serving`).
Either tool's CellResult carries the same fields: the tool (`source`), its version, the exact command and the
server_info seen after the run.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

import provision
from provision.model.tables import parsers
from provision.sweep.matrix import GridCell

WORDS = (
    "the of and to in is it that was for on are as with his they at be this from have or by one had not but what "
    "all were when we there can an your which their said if do will each about how up out them then she many some "
    "so these would other into has more her two like him see time could no make than first been its who now people "
    "my made over did down only way find use may water long little very after words called just where most know"
).split()
WARMUP_MAX_TOKENS = 32  # bench_serving: min(output_len, 32)
ERRORS_KEPT = 5
ACCEPT_FROM_VERIFY_CT = "this run's requests: sum(completion_tokens) / sum(meta_info spec_verify_ct)"
ACCEPT_FROM_BENCH = (
    "this run's requests (bench_serving's own, warm-up excluded): sum(output tokens) / sum(verify steps), "
    "verify steps = output tokens / meta_info spec_accept_length"
)
DRIVER = Path(__file__).with_name("bench_driver.py")


class Stats(BaseModel):
    mean: float
    p50: float
    p90: float
    p99: float


class CellResult(BaseModel):
    concurrency: int
    input_tokens: int
    output_tokens: int
    prompts: int
    completed: int
    failed: int
    duration_s: float
    output_tok_s: float
    request_s: float
    ttft_ms: Stats
    itl_ms: Stats
    tpot_ms: Stats
    total_output_tokens: int = 0
    accept_length: float | None = None  # per run: sum(completion_tokens) / sum(spec_verify_ct)
    verify_steps: int | None = None
    server_accept_length: float | None = None  # /get_server_info's figure: cumulative since boot
    source: str = "loadgen"  # the tool, or "bench_serving" (parse_bench_serving)
    errors: list[str] = []  # the first few distinct request errors
    tool_version: str | None = None  # loadgen: provision's; bench_serving: the SGLang it ran from
    command: str | None = None  # exactly what ran
    server_info: dict[str, Any] | None = None  # /server_info as the tool read it after the run
    accept_source: str | None = None  # how accept_length was read (ACCEPT_FROM_*)
    placeholders: list[str] = []  # modules the driver stood in for (bench_driver.py --placeholder)


class _Request(BaseModel):
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    output_len: int = 0
    itl: list[float] = []
    verify_ct: int | None = None


# ---- statistics


def percentile(values: list[float], q: float) -> float:
    """numpy.percentile's default (linear); 0.0 for no values, as bench_serving's `np.percentile(x or 0, q)`."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def stats_ms(seconds: list[float]) -> Stats:
    ms = [s * 1000 for s in seconds]
    mean = sum(ms) / len(ms) if ms else 0.0
    return Stats(mean=mean, p50=percentile(ms, 50), p90=percentile(ms, 90), p99=percentile(ms, 99))


# ---- prompts


def make_prompts(cell: GridCell, seed: int) -> list[str]:
    """`cell.prompts` distinct prompts of about `cell.input_tokens` tokens (one word ~ one token), seeded."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(cell.input_tokens)) for _ in range(cell.prompts)]


# ---- the client


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def _one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> _Request:
    payload = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0},
        "stream": True,
    }
    out = _Request()
    start = time.perf_counter()
    last_stamp, last_len = start, 0
    try:
        async with client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                out.error = f"HTTP {response.status_code}: {' '.join(body.split())[:200]}"
                return out
            async for line in response.aiter_lines():
                line = line.strip()
                if not line:
                    continue
                data = line.removeprefix("data:").strip()
                out.latency = time.perf_counter() - start
                if data == "[DONE]":
                    continue
                chunk = json.loads(data)
                meta = chunk.get("meta_info") or {}
                if meta.get("spec_verify_ct") is not None:
                    out.verify_ct = int(meta["spec_verify_ct"])
                if not chunk.get("text"):
                    continue
                stamp = time.perf_counter()
                out.output_len = int(meta.get("completion_tokens", out.output_len))
                if out.ttft == 0.0:
                    out.ttft = stamp - start
                else:
                    new = out.output_len - last_len
                    if new == 0:
                        continue
                    out.itl.extend([(stamp - last_stamp) / new] * new)
                last_stamp, last_len = stamp, out.output_len
        out.ok = True
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as err:
        out.error = f"{type(err).__name__}: {err}"
    return out


async def run_cell(
    base_url: str,
    api_key: str | None,
    cell: GridCell,
    seed: int,
    *,
    warmup: int = 0,
    timeout_s: float = 1800.0,
) -> CellResult:
    """Measure one cell against a running SGLang server; request failures are counted, not raised."""
    url = base_url.rstrip("/") + "/generate"
    prompts = make_prompts(cell, seed)
    limits = httpx.Limits(max_connections=cell.concurrency, max_keepalive_connections=cell.concurrency)
    timeout = httpx.Timeout(timeout_s, connect=30.0)
    async with httpx.AsyncClient(headers=_headers(api_key), timeout=timeout, limits=limits) as client:
        gate = asyncio.Semaphore(cell.concurrency)

        async def limited(prompt: str, max_tokens: int) -> _Request:
            async with gate:
                return await _one(client, url, prompt, max_tokens)

        if warmup:
            await asyncio.gather(
                *(limited(prompts[0], min(cell.output_tokens, WARMUP_MAX_TOKENS)) for _ in range(warmup))
            )
        begin = time.perf_counter()
        outputs = await asyncio.gather(*(limited(p, cell.output_tokens) for p in prompts))
        duration = time.perf_counter() - begin
    result = _summarize(cell, outputs, duration)
    try:
        info: dict[str, Any] | None = await fetch_server_info(base_url, api_key)
    except httpx.HTTPError:
        info = None  # the figures stand without it
    command = f"provision.sweep.load.run_cell({base_url!r}, {cell!r}, seed={seed}, warmup={warmup})"
    return result.model_copy(update={"tool_version": provision.__version__, "command": command, "server_info": info,
                                     "server_accept_length": server_accept_length(info or {})})  # fmt: skip


def _summarize(cell: GridCell, outputs: list[_Request], duration: float) -> CellResult:
    ok = [o for o in outputs if o.ok]
    total = sum(o.output_len for o in ok)
    spec = [o for o in ok if o.verify_ct]
    steps = sum(o.verify_ct or 0 for o in spec)
    errors = list(dict.fromkeys(o.error for o in outputs if not o.ok))[:ERRORS_KEPT]
    return CellResult(
        concurrency=cell.concurrency,
        input_tokens=cell.input_tokens,
        output_tokens=cell.output_tokens,
        prompts=len(outputs),
        completed=len(ok),
        failed=len(outputs) - len(ok),
        duration_s=duration,
        output_tok_s=total / duration if duration > 0 else 0.0,
        request_s=len(ok) / duration if duration > 0 else 0.0,
        ttft_ms=stats_ms([o.ttft for o in ok]),
        itl_ms=stats_ms([gap for o in ok for gap in o.itl]),
        tpot_ms=stats_ms([(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1]),
        total_output_tokens=total,
        accept_length=sum(o.output_len for o in spec) / steps if steps else None,
        verify_steps=steps if spec else None,
        errors=errors,
        accept_source=ACCEPT_FROM_VERIFY_CT if steps else None,
    )


# ---- /get_server_info


def redacted(info: Any) -> Any:
    """server_info without secrets: SGLang returns its server_args, the API keys included; a key is secret when
    the server's own parser table marks its option so."""
    options = [o for data in parsers().values() for o in data.options if o.secret]
    dests, flags = {o.dest for o in options}, {name for o in options for name in o.names}
    if isinstance(info, dict):
        return {k: "(redacted)" if k in dests and v else redacted(v) for k, v in info.items()}
    if isinstance(info, list):  # a command line: the word after a secret flag, or its =value
        out: list[Any] = []
        for word in info:
            after_flag = bool(out) and isinstance(out[-1], str) and out[-1] in flags
            if isinstance(word, str) and word.split("=", 1)[0] in flags and "=" in word:
                word = word.split("=", 1)[0] + "=(redacted)"
            out.append("(redacted)" if after_flag else redacted(word))
        return out
    if isinstance(info, str) and any(flag in info for flag in flags):  # a command line as one string
        pattern = "|".join(re.escape(f) for f in sorted(flags, key=len, reverse=True))
        return re.sub(rf"(?<!\S)({pattern})(=|\s+)(\S+)", r"\1\2(redacted)", info)
    return info


async def fetch_server_info(base_url: str, api_key: str | None, timeout_s: float = 30.0) -> dict[str, Any]:
    """One /get_server_info snapshot, secrets redacted (raises httpx.HTTPError on failure)."""
    async with httpx.AsyncClient(headers=_headers(api_key), timeout=timeout_s) as client:
        response = await client.get(base_url.rstrip("/") + "/get_server_info")
        response.raise_for_status()
        return dict(redacted(response.json()))


def server_accept_length(info: dict[str, Any]) -> float | None:
    """internal_states[0].avg_spec_accept_length: cumulative since boot, absent before the first spec request."""
    states = info.get("internal_states") or [{}]
    value = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
    return float(value) if value is not None else None


def accept_length_delta(
    before: dict[str, Any],
    after: dict[str, Any],
    tokens_before: int | None = None,
    tokens_after: int | None = None,
) -> float | None:
    """The run's accept length from two cumulative /get_server_info snapshots, where it can be known.

    SGLang reports A = T / S (all spec completion tokens / all verify steps since boot), not S. The run's figure
    is (T1 - T0) / (S1 - S0) = (A1*S1 - A0*S0) / (S1 - S0); with the token counts since boot at each snapshot
    (which a client that is the server's only user knows) S = T / A. Without them it is known only when the
    server had no spec request before the run (A0 absent): then it is A1. Otherwise None.
    """
    a0, a1 = server_accept_length(before), server_accept_length(after)
    if a1 is None:
        return None
    if a0 is None:
        return a1
    if tokens_before is None or tokens_after is None or tokens_after <= tokens_before:
        return None
    steps = tokens_after / a1 - tokens_before / a0
    return (tokens_after - tokens_before) / steps if steps > 0 else None


# ---- bench_serving, where it imports

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def bench_serving_args(
    base_url: str,
    cell: GridCell,
    output_file: str,
    *,
    warmup: int = 1,
    seed: int = 1,
    dataset: str = "random",
    dataset_path: str | None = None,
    tokenizer: str | None = None,
) -> list[str]:
    """The arguments of `python -m sglang.bench_serving` for one cell, appending one JSON line to `output_file`.

    Its `random` dataset samples ShareGPT text (downloaded from the Hugging Face hub unless `dataset_path` names
    a local copy); `random-ids` samples token ids below the vocabulary size and needs no download. Both need the
    model's tokenizer: `tokenizer` (a path on the machine that runs it), else the server's /model_info says.
    """
    args = [
        "--backend", "sglang", "--base-url", base_url.rstrip("/"), "--dataset-name", dataset,
        "--random-input-len", str(cell.input_tokens), "--random-output-len", str(cell.output_tokens),
        "--random-range-ratio", "1", "--num-prompts", str(cell.prompts), "--max-concurrency", str(cell.concurrency),
        "--request-rate", "inf", "--warmup-requests", str(warmup), "--seed", str(seed), "--output-file", output_file,
        "--output-details", "--disable-tqdm",
    ]  # fmt: skip
    if dataset_path:
        args += ["--dataset-path", dataset_path]
    if tokenizer:
        # --model too: else bench_serving takes the served name from /v1/models and asks the hub about it
        args += ["--model", tokenizer, "--tokenizer", tokenizer]
    return args


def driver_argv(python: str, args: list[str], api_key_env: str | None, warmup: int, placeholder: bool) -> list[str]:
    """bench_driver.py (on stdin) running bench_serving with `args`; see its docstring.

    bench_serving takes the key only from the environment (OPENAI_API_KEY, sent as a Bearer token). With
    `api_key_env` naming the host's variable that holds it, the command is wrapped in `sh -c` to copy it into
    OPENAI_API_KEY at run time, so the key never appears in an argv.
    """
    argv = [python, "-", "run", *(["--placeholder"] if placeholder else []), "--warmup", str(warmup), "--", *args]
    if api_key_env and api_key_env != "OPENAI_API_KEY":
        if not ENV_NAME.match(api_key_env):
            raise ValueError(f"not an environment variable name: {api_key_env!r}")
        return ["sh", "-c", f'OPENAI_API_KEY="${{{api_key_env}}}" exec "$@"', "sh", *argv]
    return argv


def driver_report(stdout: str) -> dict[str, Any]:
    """The driver's last `DFLASH-BENCH {json}` line; RuntimeError when there is none."""
    marker = "DFLASH-BENCH "
    lines = [line for line in stdout.splitlines() if line.startswith(marker)]
    if not lines:
        raise RuntimeError(f"bench_driver.py printed no DFLASH-BENCH line: {stdout.strip()[-300:]}")
    return dict(json.loads(lines[-1].removeprefix(marker)))


def parse_bench_serving(report: dict[str, Any], prompts: int | None = None, command: str | None = None) -> CellResult:
    """A CellResult from the driver's report: the line bench_serving appended to its --output-file (keys of
    sglang/benchmark/serving.py) and each measured request's [output tokens, spec_accept_length].

    The number of prompts is not in the file: it is `prompts`, else the length of the per-request lists that
    --output-details adds, else the completed count. The file's accept_length is the server's cumulative figure
    read after the run (since boot, warm-up included): it goes to server_accept_length; accept_length is the
    run's own, from the requests.
    """
    data = report["result"]
    errors = data.get("errors")
    total = prompts if prompts is not None else (len(errors) if isinstance(errors, list) else int(data["completed"]))
    spec = [(int(n), float(a)) for n, a in report.get("requests", []) if a and a > 0]
    tokens = sum(n for n, _ in spec)
    steps = sum(round(n / a) for n, a in spec)

    def stats(name: str) -> Stats:
        return Stats(mean=data[f"mean_{name}_ms"], p50=data[f"median_{name}_ms"], p90=data[f"p90_{name}_ms"],
                     p99=data[f"p99_{name}_ms"])  # fmt: skip

    return CellResult(
        concurrency=int(data.get("max_concurrency") or 0),
        input_tokens=int(data["random_input_len"]),
        output_tokens=int(data["random_output_len"]),
        prompts=total,
        completed=int(data["completed"]),
        failed=total - int(data["completed"]),
        duration_s=float(data["duration"]),
        output_tok_s=float(data["output_throughput"]),
        request_s=float(data["request_throughput"]),
        ttft_ms=stats("ttft"),
        itl_ms=stats("itl"),
        tpot_ms=stats("tpot"),
        total_output_tokens=int(data.get("total_output_tokens") or 0),
        accept_length=tokens / steps if steps else None,
        verify_steps=steps or None,
        server_accept_length=data.get("accept_length"),
        source="bench_serving",
        errors=list(dict.fromkeys(e for e in errors or [] if e))[:ERRORS_KEPT],
        tool_version=report.get("version"),
        command=command,
        server_info=redacted(data.get("server_info")),
        accept_source=ACCEPT_FROM_BENCH if steps else None,
        placeholders=list(report.get("placeholders") or []),
    )
