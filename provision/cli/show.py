"""The plan as a person reads it. Values are `Text`, never markup: `[bold]` or `:smile:` in a value shows as typed;
control and format characters (escape sequences, bidi overrides) show escaped (errors.one_line), before layout."""

from __future__ import annotations

import shlex

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from provision.errors import one_line
from provision.planning.planner import url_host
from provision.planning.types import Plan


def _facts(plan: Plan) -> Table:
    gpu, cuda, drv, tri, fi, sgl = plan.gpu, plan.cuda, plan.driver, plan.triton, plan.flashinfer, plan.sglang
    build = {"release": sgl.version, "git": f"{sgl.git_url} @ {sgl.git_ref}", "wheel": sgl.wheel}[sgl.source]
    deps = "" if sgl.install_deps else ", without its dependencies"
    env = plan.python_env
    source = "wheelhouse shipped from the control node" if env.wheelhouse else "the hosts' index"
    extra = f" (+ {env.torch_index_url})" if env.torch_index_url else ""
    serve = plan.config.serve
    rows = [
        (
            "hardware",
            f"{gpu.count}x {gpu.model}, compute {gpu.arch} ({gpu.sm}), {gpu.memory_gb} GB, {gpu.interconnect}",
        ),
        ("CUDA", f"{cuda.version} at {cuda.home} via {cuda.method}: {cuda.reason}"),
        ("driver", f">= {drv.min} ({drv.branch}): {drv.reason}"),
        (
            "Triton",
            f"{tri.version}, target {tri.target}, ptxas override {'on' if tri.ptxas_override else 'off'}: {tri.reason}",
        ),
        ("FlashInfer", f"{fi.version}, FLASHINFER_CUDA_ARCH_LIST={fi.arch_list}"),
        ("SGLang", f"{sgl.source} {build} (dialect {sgl.dialect}{deps})"),
        ("Python env", f"{env.venv}: {', '.join(env.requirements[:2])}; {source}{extra}"),
        (
            "parallelism",
            f"tp {serve.tp}, ep {serve.ep}, pp {serve.pp}, dp-attention {'on' if serve.dp_attention else 'off'}",
        ),
    ]
    if plan.multinode:
        mn = plan.multinode
        rows.append(("multi-node", f"node {mn.node_rank} of {mn.nnodes}, init {mn.dist_init_addr}"))
    spec = serve.algorithm
    if serve.speculative:
        window = serve.draft_window if serve.draft_window is not None else "full context"
        spec += f", block size {serve.block_size}, draft window {window}"
        if serve.algorithm == "DDTREE":
            spec += f", budget {serve.ddtree.budget}, topk {serve.ddtree.topk}"
    rows += [("speculative", spec), ("listen", f"{url_host(serve.host)}:{serve.port}")]
    rows += [("note", note) for note in plan.notes]
    return _table(rows, "bold cyan")


def _table(rows: list[tuple[str, str]], name_style: str) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style=name_style, no_wrap=True)
    table.add_column(overflow="fold")
    for name, value in rows:
        table.add_row(Text(one_line(name)), Text(one_line(value)))
    return table


def _quote(arg: str) -> str:
    """shlex.quote, or bash's $'...' for an argument with a character one_line escapes: what is shown is one line
    a shell reads back as the same argument."""
    if one_line(arg) == arg:
        return shlex.quote(arg)
    return "$'" + "".join(_bash_escape(c) for c in arg) + "'"


def _bash_escape(c: str) -> str:
    if c in "\\'":
        return "\\" + c
    if one_line(c) == c:
        return c
    # bash's \xHH is a byte: past ASCII, the code point (\U, as UTF-8 in a UTF-8 locale)
    return one_line(c) if ord(c) < 0x80 else f"\\U{ord(c):08x}"


def _command(argv: list[str], args: list[str]) -> str:
    """Shell-quoted, the executable part first, then one option and its value per line."""
    lines = [" ".join(_quote(arg) for arg in argv[: len(argv) - len(args)])]
    for arg in args:
        if arg.startswith("--") or len(lines) == 1:
            lines.append(_quote(arg))
        else:
            lines[-1] += " " + _quote(arg)
    return " \\\n    ".join(lines)


def print_plan(plan: Plan, console: Console) -> None:
    body = Group(
        _facts(plan),
        Panel(_table(list(plan.env.items()), "green"), title="environment", title_align="left"),
        Panel(Text(_command(plan.argv, plan.server_args)), title="launch command", title_align="left"),
        Panel(
            Syntax(one_line(plan.unit, keep_newlines=True), "ini", word_wrap=True),
            title="systemd unit",
            title_align="left",
        ),
    )
    title = Text.assemble((one_line(plan.host), "bold"), one_line(f" ({', '.join(plan.groups)})"))
    console.print(Panel(body, title=title, title_align="left"))
