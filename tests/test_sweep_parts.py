"""The sweep's parts: the matrix file, the load generator (against the SGLang stand-in), the results store and the
report. No timed asserts: speed figures are only checked to exist and be positive."""

from __future__ import annotations

import ast
import asyncio
import csv
import io
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from provision import paths
from provision.errors import InputError
from provision.sweep import load
from provision.sweep.load import CellResult, Stats
from provision.sweep.matrix import GridCell, Matrix, load_matrix
from provision.sweep.report import column_label, markdown, recommend, summarize, to_csv, workloads, write_report
from provision.sweep.results import CONFIG_LEVEL, Record, Results, TornLineWarning, now
from provision.sweep.run import keep_workload

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "sweeps"
STANDIN = paths.standin()
SGLANG_VENV_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
needs_standin = pytest.mark.skipif(
    not SGLANG_VENV_PYTHON.exists(), reason="/work/main/.venv-sglang is missing (the stand-in needs sglang's parser)"
)

GOOD = """\
configs:
  - name: b8-t4-w2048
    set:
      serve.algorithm: DDTREE
      serve.ddtree.budget: 8
      serve.ddtree.topk: 4          # typed by YAML: a quoted "4" is text, refused for an integer
      serve.draft_window: 2048
  - name: b16.deep
    set: {serve.block_size: 16, serve.draft_window: null, serve.extra_args: [--foo, "1"]}
    allow_untrained_depth: true
grid:
  - {concurrency: 1, input_tokens: 60}
  - {concurrency: 8, input_tokens: 512, output_tokens: 64, prompts: 3}
warmup_requests: 0
coding: {enabled: false, max_tokens: 512, limit: 3}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.yml"
    path.write_text(text)
    return path


# ---- the matrix


def test_good_matrix(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path, GOOD))
    first, second = matrix.configs
    assert first.set == {"serve.algorithm": "DDTREE", "serve.ddtree.budget": 8, "serve.ddtree.topk": 4,
                         "serve.draft_window": 2048}  # fmt: skip
    assert second.overrides() == {"serve.block_size": 16, "serve.draft_window": None,
                                  "serve.extra_args": ["--foo", "1"], "serve.allow_untrained_depth": True}  # fmt: skip
    assert [c.id for c in matrix.grid] == ["c1-in60", "c8-in512-out64"]
    assert [c.prompts for c in matrix.grid] == [4, 3]  # default max(4, 2 * concurrency)
    assert matrix.warmup_requests == 0
    assert (matrix.coding.enabled, matrix.coding.max_tokens, matrix.coding.limit) == (False, 512, 3)


def test_defaults_are_the_seeds_grid(tmp_path: Path) -> None:
    matrix = load_matrix(write(tmp_path, "configs:\n  - name: only\n"))
    assert [c.id for c in matrix.grid] == ["c1-in60", "c1-in1024", "c1-in4096", "c32-in60", "c32-in4096"]
    assert [c.prompts for c in matrix.grid] == [4, 4, 4, 64, 64]
    assert {c.output_tokens for c in matrix.grid} == {256}
    assert matrix.warmup_requests == 2
    assert (matrix.coding.enabled, matrix.coding.problems, matrix.coding.max_tokens) == (True, None, 2048)


def test_problems_path_is_relative_to_the_matrix(tmp_path: Path) -> None:
    (tmp_path / "mine.jsonl").write_text('{"task_id": "x"}\n')
    matrix = load_matrix(write(tmp_path, "configs: [{name: a}]\ncoding: {problems: mine.jsonl}\n"))
    assert matrix.coding.problems == tmp_path / "mine.jsonl"


BAD = [
    # (matrix text, line, field, words of the message)
    ("configs: [\n  {name: a\n", 3, "", ["not valid YAML"]),
    ("- a\n- b\n", None, "", ["must be a mapping", "configs"]),
    ("grid: []\n", 1, "configs", ["required"]),
    ("configs: []\n", 1, "configs", ["at least 1"]),
    ("configs:\n  - name: a\nrepeat: 3\n", 3, "repeat", ["unknown key", "coding, configs, grid, warmup_requests"]),
    # strict like the deployment: YAML's yes is no concurrency
    ("configs:\n  - name: a\ngrid:\n  - {concurrency: yes, input_tokens: 60}\n", 4, "grid[0].concurrency",
     ["valid integer", "got True"]),
    ("configs:\n  - name: a b\n", 2, "configs[0].name", ["letters, digits and _ . -", "'a b'"]),
    ("configs:\n  - name: a\n  - name: b\n  - name: a\n", 4, "configs[2].name", ["'a'", "configs[0]"]),
    ("configs:\n  - name: a\n    sets: {}\n", 3, "configs[0].sets",
     ["unknown key", "allow_untrained_depth, name, set"]),
    ("configs:\n  - name: a\n    set:\n      serve.ddtree.budgt: 3\n", 4, "configs[0].set.serve.ddtree.budgt",
     ["unknown key", "budget, topk"]),
    ("configs:\n  - name: a\n    set:\n      srve.port: 3\n", 4, "configs[0].set.srve.port", ["unknown key", "serve"]),
    ("configs:\n  - name: a\n  - name: b\n    set:\n      serve.ddtree.budget: 0\n", 5,
     "configs[1].set.serve.ddtree.budget", ["greater than or equal to 1", "got 0"]),
    ("configs:\n  - name: a\n    set:\n      serve.algorithm: EAGLE\n", 4, "configs[0].set.serve.algorithm",
     ["DFLASH", "DDTREE", "NONE"]),
    ("configs:\n  - name: a\n    set:\n      serve.draft_window: lots\n", 4, "configs[0].set.serve.draft_window",
     ["integer", "'lots'"]),
    ("configs:\n  - name: a\n    set:\n      serve.ddtree: 8\n", 4, "configs[0].set.serve.ddtree",
     ["a mapping, got an integer"]),
    ("configs:\n  - name: a\n    set:\n      serve.allow_untrained_depth: true\n", 4,
     "configs[0].set.serve.allow_untrained_depth", ["allow_untrained_depth: true"]),
    ("configs:\n  - name: a\n    allow_untrained_depth: maybe\n", 3, "configs[0].allow_untrained_depth",
     ["boolean"]),
    ("configs: [{name: a}]\ngrid:\n  - {concurrency: 1, input_tokens: 60}\n  - {concurrency: 0, input_tokens: 5}\n", 4,
     "grid[1].concurrency", ["greater than or equal to 1"]),
    ("configs: [{name: a}]\ngrid:\n  - {concurrency: 2, input_tokens: 60}\n  - {concurrency: 2, input_tokens: 60}\n", 4,
     "grid[1]", ["c2-in60", "grid[0]"]),
    ("configs: [{name: a}]\ngrid:\n  - {concurrency: 2, input_tokens: 60, output: 5}\n", 3, "grid[0].output",
     ["unknown key", "output_tokens"]),
    ("configs: [{name: a}]\nwarmup_requests: -1\n", 2, "warmup_requests", ["greater than or equal to 0"]),
    ("configs: [{name: a}]\ncoding:\n  problems: missing.jsonl\n", 3, "coding.problems", ["is not a file"]),
    ("configs: [{name: a}]\ncoding:\n  limit: 0\n", 3, "coding.limit", ["greater than or equal to 1"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "line", "field", "words"), BAD, ids=[f"{i}-{b[2] or 'file'}" for i, b in enumerate(BAD)]
)
def test_bad_matrix(tmp_path: Path, text: str, line: int | None, field: str, words: list[str]) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as caught:
        load_matrix(path)
    err = caught.value
    assert err.source == (f"{path}:{line}" if line else str(path))
    assert err.field == field
    for word in words:
        assert word in err.message
    assert "\n" not in str(err) and "Traceback" not in str(err)


def test_missing_matrix_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read the matrix file"):
        load_matrix(tmp_path / "nope.yml")


def test_shipped_seed_sweep() -> None:
    matrix = load_matrix(SWEEPS / "seed.yml")
    assert [c.name for c in matrix.configs] == ["b8-t4-w2048", "b8-t4-none", "b4-t4-w2048", "b12-t6-w2048",
                                                "b16-t4-w2048", "bs16-b16-t4-w2048"]  # fmt: skip
    shape = [(c.set["serve.ddtree.budget"], c.set["serve.ddtree.topk"], c.set["serve.draft_window"])
             for c in matrix.configs]  # fmt: skip
    assert shape == [(8, 4, 2048), (8, 4, None), (4, 4, 2048), (12, 6, 2048), (16, 4, 2048), (16, 4, 2048)]
    assert {c.set["serve.algorithm"] for c in matrix.configs} == {"DDTREE"}
    # the drafter's trained 8, but for the seed's "block size 16 with a higher budget to match", asked for on purpose
    untrained = [(c.set.get("serve.block_size"), c.allow_untrained_depth) for c in matrix.configs]
    assert untrained == [(None, False)] * 5 + [(16, True)]
    assert [c.id for c in matrix.grid] == ["c1-in60", "c1-in1024", "c1-in4096", "c32-in60", "c32-in4096"]
    assert matrix.coding.enabled


def test_shipped_quick_sweep() -> None:
    matrix = load_matrix(SWEEPS / "quick.yml")
    assert len(matrix.configs) == 2
    assert all("serve.algorithm" not in c.set for c in matrix.configs)  # the host's own: DDTREE or DFLASH
    assert [c.id for c in matrix.grid] == ["c1-in60-out32", "c4-in256-out32"]
    assert [c.prompts for c in matrix.grid] == [4, 4]
    assert matrix.coding.enabled and matrix.coding.limit == 2


def _argv_of(plan_json: Callable[..., dict], host: str, config_set: dict, *extra: str) -> list[str]:
    sets = [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in config_set.items()]
    plan = plan_json("--host", host, *extra, *[x for s in sets for x in ("--set", s)])
    return plan["argv"]


def test_shipped_configs_plan(plan_json: Callable[..., dict]) -> None:
    """Every shipped config plans on the seed's DDTREE build; quick.yml's also on a DFLASH-only release build,
    where its two configs still render different command lines."""
    for name in ("seed.yml", "quick.yml"):
        argvs = {json.dumps(_argv_of(plan_json, "rtx6000", c.overrides())) for c in load_matrix(SWEEPS / name).configs}
        assert len(argvs) == len(load_matrix(SWEEPS / name).configs)
    release = ("--set", "sglang.source=release", "--set", "sglang.dialect=sglang-0.5.23",
               "--set", "serve.algorithm=DFLASH")  # fmt: skip
    quick = [_argv_of(plan_json, "rtx6000", c.set, *release) for c in load_matrix(SWEEPS / "quick.yml").configs]
    assert quick[0] != quick[1]
    assert all("DDTREE" not in argv for argv in quick)


# ---- the results store


def record(config: str, cell: str, status: str = "ok", **extra: object) -> Record:
    return Record.model_validate({"config": config, "cell": cell, "status": status, "started": now(),
                                  "finished": now(), **extra})  # fmt: skip


def test_results_append_and_done(tmp_path: Path) -> None:
    path = tmp_path / "out" / "results.jsonl"
    results = Results(path)
    assert results.done() == set()
    results.append(record("a", "c1-in60", result={"output_tok_s": 1.0}, accept_length=4.2))
    results.append({"config": "a", "cell": "c32-in60", "status": "failed", "error": "HTTP 503",
                    "started": now(), "finished": now()})  # fmt: skip
    results.append(record("b", CONFIG_LEVEL, "failed", error="block size refused"))
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 4 and all(json.loads(line) for line in lines[:-1])
    again = Results(path)
    assert again.done() == {("a", "c1-in60"), ("a", "c32-in60"), ("b", CONFIG_LEVEL)}
    assert again.skip("a", "c32-in60")  # failed counts as done: --resume redoes none
    assert again.skip("b", "c1-in60")  # its whole config failed
    assert not again.skip("a", "c1-in4096")
    assert again.records()[0].accept_length == 4.2
    with pytest.raises(ValueError):
        again.append({"config": "a", "cell": "x", "status": "maybe", "started": now(), "finished": now()})


def test_results_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    results = Results(path)
    results.append(record("a", "c1-in60"))
    whole = path.read_bytes()
    torn = record("a", "c1-in1024").model_dump_json().encode()[:25]  # killed mid-write: no newline
    path.write_bytes(whole + torn)
    with pytest.warns(TornLineWarning, match="partly written"):
        reopened = Results(path)
    assert reopened.done() == {("a", "c1-in60")}
    assert path.read_bytes() == whole  # cut off, so the next append starts on its own line
    reopened.append(record("a", "c1-in1024"))
    assert Results(path).done() == {("a", "c1-in60"), ("a", "c1-in1024")}


def test_results_torn_only_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_bytes(b'{"config": "a", "ce')
    with pytest.warns(TornLineWarning):
        assert Results(path).done() == set()
    assert path.read_bytes() == b""


# ---- the report

SEED = [  # the seed's table (../shared/context), 145-170 read as 157, ~4.5 as 4.5; "ok" as 5/5
    ("b8-t4-w2048", [157, 109.8, 44.2, 791, 460], 4.5, (5, 5)),
    ("b8-t4-none", [145.3, 109.2, 45.5, 842.6, 456.8], 4.51, (5, 5)),
    ("b4-t4-w2048", [145.1, 86.0, 35.7, 897.1, 440], 3.65, (4, 5)),
    ("b12-t6-w2048", [147.5, 106.2, 47.6, 696.8, 421], 4.81, (5, 5)),
    ("b16-t4-w2048", [151.5, 99.0, 45.0, 611.0, 397], 4.91, (4, 5)),
]


def seed_records(matrix: Matrix) -> list[Record]:
    records = []
    for name, figures, accept, (passed, total) in SEED:
        for cell, tok_s in zip(matrix.grid, figures, strict=True):
            records.append(record(name, cell.id, result=fake_result(cell, tok_s), accept_length=accept))
        records.append(record(name, "coding", coding={"passed": passed, "total": total}))
    return records


def fake_result(cell: GridCell, tok_s: float) -> dict:
    stats = Stats(mean=1.0, p50=1.0, p90=2.0, p99=3.0)
    return CellResult(concurrency=cell.concurrency, input_tokens=cell.input_tokens, output_tokens=256,
                      prompts=cell.prompts, completed=cell.prompts, failed=0, duration_s=10.0, output_tok_s=tok_s,
                      request_s=0.4, ttft_ms=stats, itl_ms=stats, tpot_ms=stats).model_dump()  # fmt: skip


def test_report_reproduces_the_seed_table(tmp_path: Path) -> None:
    matrix = load_matrix(SWEEPS / "seed.yml")
    assert [column_label(c, matrix.grid) for c in matrix.grid] == ["C=1 60 tok", "C=1 1k", "C=1 4k", "C=32 60 tok",
                                                                    "C=32 4k"]  # fmt: skip
    table = markdown(summarize(seed_records(matrix), matrix), matrix).splitlines()
    assert table[0] == "| config | C=1 60 tok | C=1 1k | C=1 4k | C=32 60 tok | C=32 4k | accept | coding |"
    assert table[1] == "|---|---|---|---|---|---|---|---|"
    assert table[2] == "| b8-t4-w2048 | 157.0 | 109.8 | 44.2 | 791.0 | 460.0 | 4.50 | 5/5 |"
    assert table[4] == "| b4-t4-w2048 | 145.1 | 86.0 | 35.7 | 897.1 | 440.0 | 3.65 | 4/5 |"
    assert table[6] == "| b16-t4-w2048 | 151.5 | 99.0 | 45.0 | 611.0 | 397.0 | 4.91 | 4/5 |"
    rows = list(csv.reader(io.StringIO(to_csv(summarize(seed_records(matrix), matrix), matrix))))
    assert rows[0] == ["config", "C=1 60 tok", "C=1 1k", "C=1 4k", "C=32 60 tok", "C=32 4k", "accept", "coding"]
    assert rows[2] == ["b8-t4-none", "145.30", "109.20", "45.50", "842.60", "456.80", "4.51", "5/5"]


def test_report_failures_and_files(tmp_path: Path) -> None:
    matrix = load_matrix(SWEEPS / "seed.yml")
    records = [r for r in seed_records(matrix) if r.config != "b12-t6-w2048"]
    records = [r for r in records if not (r.config == "b4-t4-w2048" and r.cell in ("c32-in60", "coding"))]
    records.append(record("b4-t4-w2048", "c32-in60", "failed", error="HTTP 503"))
    records.append(record("b12-t6-w2048", CONFIG_LEVEL, "failed", error="the server never became healthy"))
    rows = {row.config: row for row in summarize(records, matrix)}
    assert rows["b4-t4-w2048"].throughput["c32-in60"] == "failed"
    assert rows["b4-t4-w2048"].coding == "-"
    assert set(rows["b12-t6-w2048"].throughput.values()) == {"failed"}
    assert (rows["b12-t6-w2048"].accept, rows["b12-t6-w2048"].coding) == (None, "failed")

    files = write_report(records, matrix, tmp_path / "report")
    text = files.markdown.read_text()
    assert "| b12-t6-w2048 | failed | failed | failed | failed | failed | - | failed |" in text
    assert "| b4-t4-w2048 | 145.1 | 86.0 | 35.7 | failed | 440.0 | 3.65 | - |" in text
    assert files.csv.read_text().startswith("config,C=1 60 tok,")
    assert files.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in files.png.parent.iterdir()) == ["report.csv", "report.md", "report.png"]


def test_report_columns_follow_the_grid() -> None:
    grid = [
        GridCell(concurrency=4, input_tokens=256, output_tokens=32),
        GridCell(concurrency=4, input_tokens=256, output_tokens=64),
        GridCell(concurrency=2, input_tokens=2048),
    ]
    assert [column_label(c, grid) for c in grid] == ["C=4 256 tok out32", "C=4 256 tok out64", "C=2 2k"]  # fmt: skip


def test_recommendation_per_workload_of_the_seed_table() -> None:
    matrix = load_matrix(SWEEPS / "seed.yml")
    assert [(w.name, w.cell.id) for w in workloads(matrix.grid)] == [
        ("c1-short", "c1-in60"),
        ("c1-long", "c1-in4096"),
        ("c32-short", "c32-in60"),
        ("c32-long", "c32-in4096"),
    ]
    rows = summarize(seed_records(matrix), matrix)
    # the default gate: every coding problem passed, so b4 (the seed's best C=32 short, 4/5) and b16 are out
    best = {r.workload.name: (r.best, r.runner_up) for r in recommend(rows, matrix)}
    assert best == {
        "c1-short": ("b8-t4-w2048", ("b12-t6-w2048", 147.5)),
        "c1-long": ("b12-t6-w2048", ("b8-t4-none", 45.5)),
        "c32-short": ("b8-t4-none", ("b8-t4-w2048", 791.0)),
        "c32-long": ("b8-t4-w2048", ("b8-t4-none", 456.8)),
    }
    loose = matrix.model_copy(update={"coding": matrix.coding.model_copy(update={"gate": 0.8})})
    assert next(r for r in recommend(rows, loose) if r.workload.name == "c32-short").best == "b4-t4-w2048"
    text = markdown(rows, matrix, "rtx6000-1")
    section = text[text.index("### c1-long") : text.index("### c32-short")]
    assert "**b12-t6-w2048**: 47.6 output tok/s (accept 4.81, coding 5/5); next: b8-t4-none at 45.5 (+4.6%)" in section
    command = ("provision reconfigure --host rtx6000-1 --set serve.algorithm=DDTREE --set serve.ddtree.budget=12 "
               "--set serve.ddtree.topk=6 --set serve.draft_window=2048")  # fmt: skip
    assert command in section
    assert "dflash_set:\n  serve.algorithm: DDTREE\n  serve.ddtree.budget: 12\n" in section
    assert "host_vars/rtx6000-1.yml" in section
    none = [r for r in seed_records(matrix) if r.cell != "coding"]
    assert "None: no config passed the coding gate." in markdown(summarize(none, matrix), matrix)


def test_an_untrained_depth_config_is_marked_and_its_commands_allow_it(tmp_path: Path) -> None:
    matrix = load_matrix(SWEEPS / "seed.yml")
    config = matrix.config("bs16-b16-t4-w2048")
    records = [record(config.name, cell.id, result=fake_result(cell, 1000.0), accept_length=2.0,
                      server_args={"block_size": 16}, trained_block_size=8) for cell in matrix.grid]  # fmt: skip
    records.append(record(config.name, "coding", coding={"passed": 5, "total": 5}))
    text = markdown(summarize(records, matrix), matrix, "h")
    assert "| bs16-b16-t4-w2048 (untrained depth) | 1000.0 |" in text
    assert "(untrained depth): block size above the drafter's trained one" in text
    assert "--set serve.block_size=16" in text and "--allow-untrained-depth" in text
    assert "serve.allow_untrained_depth: true" in text
    files = write_report(records, matrix, tmp_path)
    assert files.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the same block size within the drafter's training is not marked
    trained = [r.model_copy(update={"trained_block_size": 16}) for r in records]
    assert "(untrained depth)" not in markdown(summarize(trained, matrix), matrix)


def test_keep_takes_a_workload_of_the_grid() -> None:
    matrix = load_matrix(SWEEPS / "seed.yml")
    assert keep_workload("start", matrix) is None
    assert keep_workload("best:c32-long", matrix).cell.id == "c32-in4096"  # type: ignore[union-attr]
    for bad in ("best", "best:c4", "fastest"):
        with pytest.raises(
            InputError, match="allowed: start, best:c1-short, best:c1-long, best:c32-short, best:c32-long"
        ):
            keep_workload(bad, matrix)


# ---- the load generator


def test_percentile_is_numpys_linear() -> None:
    assert load.percentile([], 50) == 0.0
    assert load.percentile([3.0], 99) == 3.0
    assert load.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert load.percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert load.percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)


def test_prompts_have_the_word_count() -> None:
    cell = GridCell(concurrency=2, input_tokens=60)
    prompts = load.make_prompts(cell, seed=7)
    assert len(prompts) == 4 and all(len(p.split()) == 60 for p in prompts)
    assert len(set(prompts)) == 4 and prompts == load.make_prompts(cell, seed=7)


def test_accept_length_delta() -> None:
    def info(accept: float | None) -> dict:
        return {"internal_states": [{} if accept is None else {"avg_spec_accept_length": accept}]}

    assert load.accept_length_delta(info(None), info(4.0)) == 4.0  # nothing speculative before the run
    assert load.accept_length_delta(info(3.0), info(4.0)) is None  # steps unknown
    # 300 tokens in 100 steps before; the run adds 500 tokens in 100 steps: 800 / 200 = 4.0 since boot
    assert load.accept_length_delta(info(3.0), info(4.0), tokens_before=300, tokens_after=800) == 5.0
    assert load.accept_length_delta(info(3.0), info(None)) is None


def test_bench_serving_args_and_the_driver_command() -> None:
    cell = GridCell(concurrency=32, input_tokens=4096)
    args = load.bench_serving_args("http://127.0.0.1:30000/", cell, "/tmp/c32.jsonl", tokenizer="/srv/m")
    joined = " ".join(args)
    assert joined.startswith("--backend sglang --base-url http://127.0.0.1:30000 --dataset-name random ")
    for part in ("--random-input-len 4096", "--random-output-len 256", "--random-range-ratio 1", "--num-prompts 64",
                 "--max-concurrency 32", "--request-rate inf", "--output-file /tmp/c32.jsonl",
                 "--model /srv/m --tokenizer /srv/m"):  # fmt: skip
        assert part in joined
    plain = load.driver_argv("/v/bin/python3", args, None, 1, placeholder=False)
    assert plain[:6] == ["/v/bin/python3", "-", "run", "--warmup", "1", "--"] and plain[6:] == args
    wrapped = load.driver_argv("py", args, "SGLANG_API_KEY", 2, placeholder=True)
    assert wrapped[:8] == ["sh", "-c", 'OPENAI_API_KEY="${SGLANG_API_KEY}" exec "$@"', "sh", "py", "-", "run",
                           "--placeholder"]  # fmt: skip
    with pytest.raises(ValueError):
        load.driver_argv("py", args, "BAD;NAME", 1, placeholder=False)


def test_bench_serving_output_line_and_the_runs_own_acceptance() -> None:
    line = {"backend": "sglang", "dataset_name": "random", "request_rate": "inf", "max_concurrency": 32,
            "random_input_len": 4096, "random_output_len": 256, "random_range_ratio": 1.0, "duration": 35.6,
            "completed": 63, "total_output_tokens": 16128, "request_throughput": 1.77, "output_throughput": 453.0,
            "accept_length": 4.4, "errors": [""] * 63 + ["timeout"], "server_info": {"version": "0.5.23"}}  # fmt: skip
    for name in ("ttft", "itl", "tpot"):
        line |= {f"mean_{name}_ms": 10.0, f"median_{name}_ms": 9.0, f"p90_{name}_ms": 20.0, f"p99_{name}_ms": 30.0}
    # 256 tokens in 64 steps and 256 in 32: 512 / 96; a request with no speculative figure counts in neither
    stdout = "Serving Benchmark Result\nAccept length: 4.40\n\nDFLASH-BENCH " + json.dumps(
        {"version": "0.5.23", "placeholders": [], "result": line, "requests": [[256, 4.0], [256, 8.0], [10, 0.0]]}
    )
    result = load.parse_bench_serving(load.driver_report(stdout), command="sh -c ...")
    assert (result.concurrency, result.input_tokens, result.prompts, result.completed, result.failed) == (
        32, 4096, 64, 63, 1)  # fmt: skip
    assert (result.output_tok_s, result.ttft_ms.p50, result.tpot_ms.p99) == (453.0, 9.0, 30.0)
    assert result.accept_length == pytest.approx(512 / 96) and result.verify_steps == 96
    assert (result.server_accept_length, result.errors) == (4.4, ["timeout"])  # cumulative: kept, not used
    assert (result.source, result.tool_version, result.command) == ("bench_serving", "0.5.23", "sh -c ...")
    assert result.server_info == {"version": "0.5.23"} and result.accept_source == load.ACCEPT_FROM_BENCH
    with pytest.raises(RuntimeError, match="no DFLASH-BENCH line"):
        load.driver_report("Traceback ...")


def bench_serving_flags() -> set[str]:
    """The flags bench_serving's parser defines, read from its source (its import needs transformers)."""
    found = sorted((ROOT / ".venv-sglang" / "lib").glob("python3*/site-packages/sglang/benchmark/serving.py"))
    if not found:
        pytest.skip("no sglang/benchmark/serving.py in /work/main/.venv-sglang")
    flags: set[str] = set()
    for node in ast.walk(ast.parse(found[0].read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return flags


def test_bench_serving_argv_flags_exist() -> None:
    known = bench_serving_flags()
    args = load.bench_serving_args("http://h:1", GridCell(concurrency=1, input_tokens=60), "/o", dataset_path="/d",
                                   tokenizer="/m")  # fmt: skip
    used = {a for a in args if a.startswith("--")}
    assert used and used <= known, used - known


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A DFLASH stand-in on 127.0.0.1 with an API key, shared by this module (sglang's import takes seconds)."""
    tmp_path = tmp_path_factory.mktemp("standin")
    port = free_port()
    argv = [str(SGLANG_VENV_PYTHON), str(STANDIN), "--model-path", "/m", "--host", "127.0.0.1", "--port", str(port),
            "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/d",
            "--speculative-num-draft-tokens", "8", "--api-key", "K"]  # fmt: skip
    log = (tmp_path / "standin.log").open("w")
    env = {**os.environ, "SGLANG_STANDIN_LOAD_S": "0.3", "SGLANG_STANDIN_TOKEN_S": "0.002"}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "standin.log").read_text()
            assert time.monotonic() < deadline, "the stand-in never became healthy"
            try:
                if httpx.get(url + "/health_generate", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@needs_standin
def test_loadgen_against_the_standin(standin: str) -> None:
    cell = GridCell(concurrency=4, input_tokens=200, output_tokens=32, prompts=8)

    async def measure() -> tuple[dict, CellResult, dict]:
        before = await load.fetch_server_info(standin, "K")
        result = await load.run_cell(standin, "K", cell, seed=3, warmup=2)
        after = await load.fetch_server_info(standin, "K")
        return before, result, after

    before, result, after = asyncio.run(measure())
    assert (result.prompts, result.completed, result.failed, result.errors) == (8, 8, 0, [])
    assert (result.concurrency, result.input_tokens, result.output_tokens) == (4, 200, 32)
    assert result.ttft_ms.p50 > 0 and result.ttft_ms.mean > 0 and result.itl_ms.p50 > 0 and result.tpot_ms.mean > 0
    assert result.output_tok_s > 0 and result.request_s > 0 and result.duration_s > 0
    assert 0 < result.total_output_tokens <= 8 * 32
    assert result.accept_length is not None and 1 < result.accept_length < 8  # DFLASH, block 8
    assert result.verify_steps and result.verify_steps < result.total_output_tokens
    # the server's figure is cumulative: warm-up included, so it is only a cross-check here
    assert load.server_accept_length(before) is None
    assert load.accept_length_delta(before, after) == pytest.approx(result.accept_length, rel=0.2)
    assert result.model_dump(mode="json")["ttft_ms"].keys() == {"mean", "p50", "p90", "p99"}


@needs_standin
def test_loadgen_counts_refused_requests(standin: str) -> None:
    cell = GridCell(concurrency=1, input_tokens=10, output_tokens=8, prompts=2)
    result = asyncio.run(load.run_cell(standin, "wrong-key", cell, seed=1))
    assert (result.completed, result.failed) == (0, 2)
    assert result.output_tok_s == 0 and result.accept_length is None
    assert any("401" in e for e in result.errors)


def test_server_info_is_recorded_without_secrets() -> None:
    """SGLang's /get_server_info returns its server_args, API keys included: a sweep record never keeps them."""
    from provision.sweep.load import redacted

    info = {"api_key": "sk-live", "admin_api_key": "adm-9f", "port": 30000, "ssl_keyfile_password": None,
            "launch_command": "--port 30000 --api-key sk-cmd --admin-api-key=sk-eq", "argv": ["--api-key", "sk-argv"],
            "internal_states": [{"api_key": "nested", "avg_spec_accept_length": 3.1}]}  # fmt: skip
    out = redacted(info)
    assert not any(s in json.dumps(out) for s in ("sk-live", "adm-9f", "nested", "sk-cmd", "sk-eq", "sk-argv"))
    assert out["port"] == 30000 and out["ssl_keyfile_password"] is None
    assert out["internal_states"][0]["avg_spec_accept_length"] == 3.1
    shipped = (Path(__file__).resolve().parent.parent / "docs" / "sweep-quick" / "results.jsonl").read_text()
    assert all(json.loads(line)["server_info"].get("api_key") in (None, "(redacted)")
               for line in shipped.splitlines() if line.strip() and json.loads(line).get("server_info"))  # fmt: skip
