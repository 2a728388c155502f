"""Render the launch command, the environment file and the systemd unit from a Deployment."""

from __future__ import annotations

import re
from importlib import resources
from typing import TYPE_CHECKING

import jinja2

from provision.config import Deployment
from provision.tables import Dialect

if TYPE_CHECKING:
    from provision.plan import NodePlan

API_KEY_VAR = "SGLANG_DFLASH_API_KEY"
API_KEY_REF = "${" + API_KEY_VAR + "}"
_PLAIN = re.compile(r"^[A-Za-z0-9_./:=,+@-]+$")


def argv_for(dep: Deployment, dialect: Dialect, nodes: NodePlan | None) -> tuple[list[str], dict[str, str]]:
    """The server's command line, and the environment its algorithm spelling asks for."""
    serve, flags = dep.serve, dialect.flags
    args = ["--model-path", dep.model.path]
    if dep.model.served_name:
        args += ["--served-model-name", dep.model.served_name]
    if dep.model.trust_remote_code:
        args.append("--trust-remote-code")
    args += ["--tp-size", str(serve.tp)]
    if serve.ep > 1:
        args += ["--ep-size", str(serve.ep)]
    if serve.pp > 1:
        args += ["--pp-size", str(serve.pp)]
    if serve.dp_attention:
        args.append("--enable-dp-attention")
    if nodes is not None:
        args += ["--nnodes", str(nodes.nnodes), "--node-rank", str(nodes.node_rank)]
        args += ["--dist-init-addr", nodes.dist_init_addr]
    env: dict[str, str] = {}
    if serve.speculative and dep.drafter is not None:
        spelling = dialect.algorithms[serve.algorithm]
        values = {"budget": serve.ddtree.budget, "topk": serve.ddtree.topk, "block_size": serve.block_size}
        args += [a.format(**values) for a in spelling.args]
        env = {k: v.format(**values) for k, v in spelling.env.items()}
        args += [flags["draft_model"], dep.drafter.path, flags["block_size"], str(serve.block_size)]
        if serve.draft_window is not None:
            args += [flags["draft_window"], str(serve.draft_window)]
        if serve.draft_attention_backend:
            args += [flags["draft_attention_backend"], serve.draft_attention_backend]
    if serve.attention_backend:
        args += ["--attention-backend", serve.attention_backend]
    graph = serve.cuda_graph
    if not graph.enabled:
        args.append(flags["disable_cuda_graph"])
    else:
        if not graph.prefill:
            args.append(flags["disable_prefill_cuda_graph"])
        if graph.max_bs is not None:
            args += [flags["cuda_graph_max_bs"], str(graph.max_bs)]
    if serve.context_length is not None:
        args += ["--context-length", str(serve.context_length)]
    if serve.mem_fraction is not None:
        args += ["--mem-fraction-static", str(serve.mem_fraction)]
    if serve.kv_cache_dtype is not None:
        args += ["--kv-cache-dtype", serve.kv_cache_dtype]
    args += ["--host", serve.host, "--port", str(serve.port)]
    if serve.api_key_file:
        # systemd substitutes it from a root-only EnvironmentFile: the key is never in the unit.
        args += ["--api-key", API_KEY_REF]
    if serve.reasoning_parser:
        args += ["--reasoning-parser", serve.reasoning_parser]
    if serve.tool_call_parser:
        args += ["--tool-call-parser", serve.tool_call_parser]
    if serve.metrics:
        args.append("--enable-metrics")
    args += serve.extra_args
    return [*launcher(dep), *args], env


def launcher(dep: Deployment) -> list[str]:
    """The executable part of the command line; the stand-in takes exactly SGLang's arguments."""
    python = f"{dep.service.venv}/bin/python3"
    if dep.service.launcher == "standin":
        return [python, dep.service.standin_path]
    return [python, "-m", "sglang.launch_server"]


def systemd_quote(arg: str) -> str:
    """One ExecStart word: %-specifiers and $-expansion escaped, except the API key reference."""
    if arg == API_KEY_REF:
        return arg
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN.match(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def env_file_text(env: dict[str, str]) -> str:
    lines = ["# Rendered by dflash-provision from the host's plan; do not edit by hand."]
    for name, value in env.items():
        quoted = value.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'{name}="{quoted}"')
    return "\n".join(lines) + "\n"


_templates = jinja2.Environment(
    loader=jinja2.FunctionLoader(lambda name: resources.files("provision").joinpath("templates", name).read_text()),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


def unit_text(dep: Deployment, argv: list[str]) -> str:
    return _templates.get_template("sglang-dflash.service.j2").render(
        dep=dep,
        exec_start=" ".join(systemd_quote(a) for a in argv),
        writable=sorted({dep.triton.cache_dir, dep.flashinfer.workspace_base}),
    )
