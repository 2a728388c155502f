"""`provision sweep`: each config of a matrix on one host, measured over the grid, with a coding check.

Per config: reconfigure (models, the build's own parser, the safe switch), warm up, then each grid
cell through SGLang's bench_serving on the host where it imports (provision/sweep/bench_driver.py, which
also keeps each request's acceptance), else our async client (provision/sweep/load.py, the same
definitions) through a tunnel; then the coding check on the final answers. Every finished cell is one
record in results.jsonl (append-only, atomic), so `--resume` skips finished cells and redoes none; a
config that fails is recorded and the sweep goes on. At the end the host serves the config it started
with (or, with `--keep best:WORKLOAD`, the one recommended for that workload), and the report is
written: report.md (with the recommendations), report.csv, report.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from provision.errors import InputError
from provision.files import write_atomic
from provision.inventory.reader import Inventory
from provision.planning.types import Plan
from provision.remote.connection import Remote, for_host
from provision.remote.reconfigure import check_with_parser, plan_new, switch
from provision.sweep import coding, load
from provision.sweep.matrix import GridCell, Matrix, SweepConfig, load_matrix
from provision.sweep.report import Workload, recommend, summarize, workloads, write_report
from provision.sweep.results import CONFIG_LEVEL, Record, Results, now

CODING = "coding"


@contextlib.contextmanager
def tunnel(remote: Remote, plan: Plan) -> Iterator[str]:
    """The server's URL as the control node reaches it: a forward over the host's connection to its loopback address."""
    if remote.local:
        yield plan.service_url
        return
    with remote.forward(plan.service_address, plan.config.serve.port) as local:
        yield f"http://127.0.0.1:{local}"


def api_key(remote: Remote, plan: Plan) -> str | None:
    path = plan.config.serve.api_key_file
    if not path:
        return None
    proc = remote.run(f"cat {shlex.quote(path)}", timeout=30)
    return proc.stdout.strip() or None


def has_bench_serving(remote: Remote, plan: Plan) -> bool:
    python = f"{plan.python_env.venv}/bin/python3"
    return remote.run(f"{shlex.quote(python)} -c 'import sglang.bench_serving'", timeout=120).return_code == 0


@dataclass(frozen=True)
class BenchTool:
    """bench_serving on the host: the venv's python, SGLang's version, and whether the driver stands in for
    torchvision (bench_driver.py --placeholder)."""

    python: str
    version: str
    placeholder: bool


def bench_probe(remote: Remote, plan: Plan, placeholder: bool) -> BenchTool | None:
    """bench_serving through the driver on the host, or None (the sweep's own client measures then)."""
    python = f"{plan.python_env.venv}/bin/python3"
    flag = " --placeholder" if placeholder else ""
    proc = remote.run(f"{shlex.quote(python)} - probe{flag}", stdin=load.DRIVER.read_text(), timeout=300)
    if proc.return_code != 0:
        return None
    report = load.driver_report(proc.stdout)
    return BenchTool(python, str(report["version"]), bool(report["placeholders"]))


def measure(remote: Remote, plan: Plan, url: str, key: str | None, cell: GridCell, matrix: Matrix,
            bench: BenchTool | None) -> load.CellResult:  # fmt: skip
    if bench is None:
        return asyncio.run(load.run_cell(url, key, cell, seed=1))
    out = f"/tmp/dflash-sweep-{cell.id}.jsonl"
    args = load.bench_serving_args(plan.service_url, cell, out, dataset=matrix.bench_serving.dataset,
                                   dataset_path=matrix.bench_serving.dataset_path,
                                   tokenizer=str(plan.config.model.path))  # fmt: skip
    argv = load.driver_argv(bench.python, args, "SGLANG_DFLASH_API_KEY" if key else None, 1, bench.placeholder)
    secrets = f"set -a; . {plan.config.service.config_dir}/secrets.env; set +a; " if key else ""
    proc = remote.run(f"rm -f {out}; {secrets}{shlex.join(argv)}", stdin=load.DRIVER.read_text(), timeout=3600)
    if proc.return_code != 0:
        raise RuntimeError(f"bench_serving failed: {(proc.stderr.strip() or proc.stdout.strip())[-500:]}")
    command = f"{shlex.join(argv)} < provision/sweep/bench_driver.py"
    return load.parse_bench_serving(load.driver_report(proc.stdout), prompts=cell.prompts, command=command)


def coding_check(url: str, key: str | None, plan: Plan, matrix: Matrix, base: Path) -> coding.CodingScore:
    problems_path = matrix.coding.problems
    if problems_path is not None and not problems_path.is_absolute():
        problems_path = base / problems_path
    problems = coding.load_problems(problems_path)[: matrix.coding.limit]
    model = plan.config.model.served_name or plan.config.model.path
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    answers: list[dict[str, Any] | None] = []
    with httpx.Client(timeout=600, headers=headers) as client:
        for problem in problems:
            body = {"model": model, "max_tokens": matrix.coding.max_tokens, "temperature": 0.0,
                    "messages": [{"role": "user", "content": coding.prompt_for(problem)}]}  # fmt: skip
            response = client.post(url + "/v1/chat/completions", json=body)
            answers.append(response.json()["choices"][0]["message"] if response.status_code == 200 else None)
    return coding.grade(problems, answers)


def run_config(config: SweepConfig, inventory: Inventory, host: str, matrix: Matrix, results: Results,
               base: Path, console: Console) -> None:  # fmt: skip
    started = now()
    try:
        [(plan, remote)] = plan_new(inventory, host, config.overrides(), {}, config.allow_untrained_depth, console)
        check_with_parser(remote, plan)
    except InputError as err:
        results.append(Record(config=config.name, cell=CONFIG_LEVEL, status="failed", error=str(err),
                              started=started, finished=now()))  # fmt: skip
        console.print(f"[red]{config.name}: refused[/]: {err}")
        return
    outcome = switch(plan, remote)
    if outcome.code != 0:
        error = outcome.result.get("reason") or outcome.result.get("status")
        results.append(Record(config=config.name, cell=CONFIG_LEVEL, status="failed", error=str(error),
                              started=started, finished=now()))  # fmt: skip
        console.print(f"[red]{config.name}: did not start[/]: {error}")
        return
    server_args = plan.config.serve.model_dump(mode="json")
    key = api_key(remote, plan)
    on_host = has_bench_serving(remote, plan)
    bench = bench_probe(remote, plan, placeholder=not on_host)  # imports plainly, else try with the placeholder
    trained = plan.config.drafter.block_size if plan.config.drafter else None
    with tunnel(remote, plan) as url:
        if matrix.warmup_requests:
            warm = matrix.grid[0].model_copy(update={"prompts": matrix.warmup_requests, "concurrency": 1})
            asyncio.run(load.run_cell(url, key, warm, seed=0))
        for cell in matrix.grid:
            if results.skip(config.name, cell.id):
                continue
            began = now()
            try:
                res = measure(remote, plan, url, key, cell, matrix, bench)
                status, error = ("ok", None) if res.failed == 0 else ("failed", f"{res.failed} requests failed")
                results.append(Record(config=config.name, cell=cell.id, status=status, error=error, started=began,
                                      finished=now(), result=res.model_dump(mode="json"),
                                      accept_length=res.accept_length, server_args=server_args,
                                      trained_block_size=trained))  # fmt: skip
                console.print(f"{config.name} {cell.id}: {res.output_tok_s:.1f} output tok/s, "
                              f"accept {res.accept_length}, via {res.source}")  # fmt: skip
            except (RuntimeError, httpx.HTTPError) as err:
                results.append(Record(config=config.name, cell=cell.id, status="failed", error=str(err),
                                      started=began, finished=now()))  # fmt: skip
        if matrix.coding.enabled and not results.skip(config.name, CODING):
            began = now()
            score = coding_check(url, key, plan, matrix, base)
            results.append(Record(config=config.name, cell=CODING, status="ok", started=began, finished=now(),
                                  coding=score))  # fmt: skip
            console.print(f"{config.name} coding: {score.passed}/{score.total}")


def serving_config(remote: Remote, plan: Plan) -> dict[str, str]:
    """The unit and environment file the host serves now, to go back to at the end."""
    svc = plan.config.service
    unit = remote.run(f"cat /etc/systemd/system/{svc.name}.service", timeout=30).stdout
    env = remote.run(f"cat {svc.config_dir}/{svc.name}.env", timeout=30).stdout
    return {"unit": unit, "env": env}


def _start_config(path: Path, remote: Remote, plan: Plan) -> dict[str, str]:
    """The config to leave the host on. Kept in the output directory on the first run, because a sweep
    killed mid-config leaves the host on one of the matrix's configs and --resume must not take that one."""
    if path.exists():
        return dict(json.loads(path.read_text()))
    start = serving_config(remote, plan)
    write_atomic(path, json.dumps(start))
    return start


def sweep(inventory: Inventory, host: str, matrix_path: Path, out_dir: Path, resume: bool, keep: str,
          console: Console) -> int:  # fmt: skip
    matrix = load_matrix(matrix_path)  # bad input stops here, before any host is touched
    plans = inventory.plans(host, {})
    if len(plans) != 1:
        raise InputError("--host", host, f"a sweep runs on one host; {host} names {len(plans)}")
    for i, config in enumerate(matrix.configs):  # every config planned before the host is touched
        try:
            # a block size above the inventory's trained one needs the config's own allow_untrained_depth: true;
            # judged again against the drafter's own config.json when the config runs
            inventory.plans(host, config.overrides())
        except InputError as err:
            if not err.source.startswith("--set"):
                raise
            message = err.message.replace("set serve.allow_untrained_depth=true", "add allow_untrained_depth: true")
            raise InputError(f"{matrix_path}: configs[{i}] ({config.name})", err.field, message) from None
    keep_workload(keep, matrix)
    results_path = out_dir / "results.jsonl"
    if results_path.exists() and not resume:
        raise InputError("--out", str(out_dir), "holds results already; add --resume to go on, or choose another")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = Results(results_path)
    [plan] = plans
    remote = for_host(inventory, plan.host)
    start = _start_config(out_dir / "start.json", remote, plan)
    (out_dir / "matrix.json").write_text(matrix.model_dump_json(indent=2))
    try:
        for config in matrix.configs:
            todo = [c.id for c in matrix.grid] + ([CODING] if matrix.coding.enabled else [])
            if all(results.skip(config.name, cell) for cell in todo):
                console.print(f"{config.name}: done before (resumed)")
                continue
            run_config(config, inventory, plan.host, matrix, results, matrix_path.parent, console)
    finally:
        _leave(keep, start, plan, remote, inventory, matrix, results, console)
        files = write_report(results.records(), matrix, out_dir, host=plan.host)
        console.print(f"report: {files.markdown}, {files.csv}, {files.png}")
    return 0 if all(r.status == "ok" for r in results.records()) else 1


def _leave(keep: str, start: dict[str, str], plan: Plan, remote: Remote, inventory: Inventory, matrix: Matrix,
           results: Results, console: Console) -> None:  # fmt: skip
    workload = keep_workload(keep, matrix)
    if workload is not None:
        rec = next(r for r in recommend(summarize(results.records(), matrix), matrix) if r.workload == workload)
        if rec.best is None:
            console.print(f"no config to keep for {workload.name}: {rec.why_none}")
        else:
            config = matrix.config(rec.best)
            [(new, _)] = plan_new(inventory, plan.host, config.overrides(), {}, config.allow_untrained_depth, console)
            if switch(new, remote).code == 0:
                console.print(f"left serving the best config for {workload.name}: {rec.best}")
                return
    back = plan.model_copy(update={"unit": start["unit"], "env_file": start["env"]})
    outcome = switch(back, remote)
    verdict = "serving the config it started with" if outcome.code == 0 else f"FAILED: {outcome.result}"
    console.print(f"{plan.host}: {verdict}")


def keep_workload(keep: str, matrix: Matrix) -> Workload | None:
    """--keep: `start` (None), or `best:WORKLOAD` with a workload of the matrix's grid; InputError otherwise."""
    if keep == "start":
        return None
    choices = {w.name: w for w in workloads(matrix.grid)}
    name = keep.removeprefix("best:") if keep.startswith("best:") else None
    if name not in choices:
        allowed = ", ".join(["start", *(f"best:{n}" for n in choices)])
        raise InputError("--keep", keep, f"allowed: {allowed} (workloads of this matrix's grid)")
    return choices[name]
