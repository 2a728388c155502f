"""The plan as a person reads it."""

from __future__ import annotations

import shlex

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table

from provision.plan import Plan


def _facts(plan: Plan) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(overflow="fold")
    gpu, cuda, drv, tri, fi, sgl = plan.gpu, plan.cuda, plan.driver, plan.triton, plan.flashinfer, plan.sglang
    table.add_row(
        "hardware", f"{gpu.count}x {gpu.model}, compute {gpu.arch} ({gpu.sm}), {gpu.memory_gb} GB, {gpu.interconnect}"
    )
    table.add_row("CUDA", f"{cuda.version} at {cuda.home} via {cuda.method}: {cuda.reason}")
    table.add_row("driver", f">= {drv.min} ({drv.branch}): {drv.reason}")
    table.add_row(
        "Triton",
        f"{tri.version}, target {tri.target}, ptxas override {'on' if tri.ptxas_override else 'off'}: {tri.reason}",
    )
    table.add_row("FlashInfer", f"{fi.version}, FLASHINFER_CUDA_ARCH_LIST={fi.arch_list}")
    build = {"release": sgl.version, "git": f"{sgl.git_url} @ {sgl.git_ref}", "wheel": sgl.wheel}[sgl.source]
    deps = "" if sgl.install_deps else ", without its dependencies"
    table.add_row("SGLang", f"{sgl.source} {build} (dialect {sgl.dialect}{deps})")
    env = plan.python_env
    source = "wheelhouse shipped from the control node" if env.wheelhouse else "the hosts' index"
    extra = f" (+ {env.torch_index_url})" if env.torch_index_url else ""
    table.add_row("Python env", f"{env.venv}: {', '.join(env.requirements[:2])}; {source}{extra}")
    serve = plan.config.serve
    parallel = f"tp {serve.tp}, ep {serve.ep}, pp {serve.pp}, dp-attention {'on' if serve.dp_attention else 'off'}"
    table.add_row("parallelism", parallel)
    if plan.multinode:
        mn = plan.multinode
        table.add_row("multi-node", f"node {mn.node_rank} of {mn.nnodes}, init {mn.dist_init_addr}")
    spec = serve.algorithm
    if serve.speculative:
        window = serve.draft_window if serve.draft_window is not None else "full context"
        spec += f", block size {serve.block_size}, draft window {window}"
        if serve.algorithm == "DDTREE":
            spec += f", budget {serve.ddtree.budget}, topk {serve.ddtree.topk}"
    table.add_row("speculative", spec)
    table.add_row("listen", f"{serve.host}:{serve.port}")
    for note in plan.notes:
        table.add_row("note", note)
    return table


def _command(argv: list[str], args: list[str]) -> str:
    """Shell-quoted, the executable part first, then one option and its value per line."""
    lines = [shlex.join(argv[: len(argv) - len(args)])]
    for arg in args:
        if arg.startswith("--") or len(lines) == 1:
            lines.append(shlex.quote(arg))
        else:
            lines[-1] += " " + shlex.quote(arg)
    return " \\\n    ".join(lines)


def print_plan(plan: Plan, console: Console) -> None:
    env = Table(show_header=False, box=None, pad_edge=False)
    env.add_column(style="green", no_wrap=True)
    env.add_column(overflow="fold")
    for name, value in plan.env.items():
        env.add_row(name, value)
    body = Group(
        _facts(plan),
        Panel(env, title="environment", title_align="left"),
        Panel(_command(plan.argv, plan.server_args), title="launch command", title_align="left"),
        Panel(Syntax(plan.unit, "ini", word_wrap=True), title="systemd unit", title_align="left"),
    )
    console.print(Panel(body, title=f"[bold]{plan.host}[/] ({', '.join(plan.groups)})", title_align="left"))
