"""Render the launch command, the environment file and the systemd unit from a Deployment.

Every value is escaped for the place it lands by that place's own rules (systemd.service(5) for
ExecStart=, systemd.exec(5) for path directives and EnvironmentFile=, specifiers in systemd.unit(5));
the config models have already refused what no escape can make safe (control characters).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import cache
from typing import TYPE_CHECKING, NamedTuple

import jinja2
from pydantic import BaseModel, ConfigDict

from provision.model.deployment import SECRET_NAME, Deployment, RuleError, check_path_limits
from provision.model.server_args import END_OF_OPTIONS, Grammar, GrammarError, Occurrence
from provision.model.tables import Dialect, ParserOption, load_data, parsers

if TYPE_CHECKING:
    from provision.planning.types import NodePlan, SystemdPlan

# systemd reads unit files line by line and refuses a line of LONG_LINE_MAX bytes or more (src/basic/fileio.h:
# 1 MiB), failing the whole file; the environment file is held to the same.
LONG_LINE_MAX = 1024 * 1024
# execve(2) fails with E2BIG on any argv or environment string longer than MAX_ARG_STRLEN, 32 pages
# (include/uapi/linux/binfmts.h); 4 KiB pages, the smallest a Linux host runs, give the smallest limit.
MAX_ARG_STRLEN = 32 * 4096
# The field that makes each unit line long where one could be (the rest are bounded by PATH_MAX and the models).
UNIT_LINE_FIELDS = {"ExecStart": "serve.extra_args", "Description": "model.path",
                    "EnvironmentFile": "service.config_dir", "ReadWritePaths": "triton.cache_dir"}  # fmt: skip
API_KEY_VAR = "SGLANG_DFLASH_API_KEY"
API_KEY_REF = "${" + API_KEY_VAR + "}"
_PLAIN = re.compile(r"^[A-Za-z0-9_./:=,+@-]+$")
# The field that decides each flag the deployment renders: extra_args may not repeat one.
FLAG_FIELDS = {
    "--model-path": "model.path", "--served-model-name": "model.served_name",
    "--trust-remote-code": "model.trust_remote_code", "--tp-size": "serve.tp", "--ep-size": "serve.ep",
    "--pp-size": "serve.pp", "--enable-dp-attention": "serve.dp_attention", "--nnodes": "multinode.nodes",
    "--node-rank": "multinode.nodes", "--dist-init-addr": "multinode.init_addr",
    "--attention-backend": "serve.attention_backend", "--context-length": "serve.context_length",
    "--mem-fraction-static": "serve.mem_fraction", "--kv-cache-dtype": "serve.kv_cache_dtype",
    "--host": "serve.host", "--port": "serve.port", "--api-key": "serve.api_key_file",
    "--reasoning-parser": "serve.reasoning_parser", "--tool-call-parser": "serve.tool_call_parser",
    "--enable-metrics": "serve.metrics",
}  # fmt: skip
# The dialect's flag names (provision/data/sglang_builds.yml) and the fields that decide them.
DIALECT_FIELDS = {
    "draft_model": "drafter.path", "block_size": "serve.block_size", "draft_window": "serve.draft_window",
    "draft_attention_backend": "serve.draft_attention_backend", "cuda_graph_max_bs": "serve.cuda_graph.max_bs",
    "disable_cuda_graph": "serve.cuda_graph.enabled", "disable_prefill_cuda_graph": "serve.cuda_graph.prefill",
}  # fmt: skip

# Options the deployment does not render but whose setting it decides, by destination: the GPU split
# the plan counts (data parallelism), the CUDA graphs serve.cuda_graph sets (per-phase backends, the
# JSON that sets them all, the decode batch sizes), the block size the drafter was trained with.
DECIDED = {
    "dp_size": "serve.tp", "attn_dp_size": "serve.dp_attention", "moe_dp_size": "serve.ep",
    "cuda_graph_config": "serve.cuda_graph", "cuda_graph_backend_decode": "serve.cuda_graph.enabled",
    "cuda_graph_backend_prefill": "serve.cuda_graph.prefill", "disable_decode_cuda_graph": "serve.cuda_graph.enabled",
    "cuda_graph_bs_decode": "serve.cuda_graph.max_bs", "speculative_dflash_block_size": "serve.block_size",
}  # fmt: skip
# Options that take the rest of the command line out of the plan's hands.
TAKEOVER = {
    "help": "SGLang would print its help and exit instead of serving",
    "config": "SGLang would read options from that file, where the plan cannot check them; put them in "
    "serve.extra_args",
}
_NO_SECRETS = (
    "it would sit in the world-readable unit: give the API key as serve.api_key_file (a 0600 file); "
    "other secrets have no place on the command line"
)


class Argv(NamedTuple):
    argv: list[str]
    env: dict[str, str]
    # the one word that is a reference for systemd to substitute (the API key), by position: a value
    # that happens to read "${SGLANG_DFLASH_API_KEY}" is escaped like any other
    secret_at: int | None


def owned_flags(dialect: Dialect) -> dict[str, str]:
    """Every flag the deployment can render -> the field that decides it."""
    owned = dict(FLAG_FIELDS)
    owned.update({dialect.flags[key]: field for key, field in DIALECT_FIELDS.items() if key in dialect.flags})
    for spelling in dialect.algorithms.values():
        for flag, value in zip(spelling.args, [*spelling.args[1:], ""], strict=True):
            if flag.startswith("--"):
                placeholder = re.fullmatch(r"\{(\w+)\}", value)
                owned[flag] = f"serve.ddtree.{placeholder[1]}" if placeholder else "serve.algorithm"
    return owned


def grammar_for(dep: Deployment, dialect: Dialect) -> Grammar:
    """The build's parser: its base release's table, plus the options its dialect spells that the table lacks
    (a DDTree PR's flags), each taking a value when its spelling gives one."""
    options = list(parsers()[dep.sglang.release_name].options)
    known = {name for option in options for name in option.names}
    for spelling in dialect.algorithms.values():
        for flag, value in zip(spelling.args, [*spelling.args[1:], "--"], strict=True):
            if flag.startswith("--") and flag not in known:
                nargs = 0 if value.startswith("--") else 1
                options.append(ParserOption(names=[flag], dest=flag[2:].replace("-", "_"), nargs=nargs))
    return Grammar(options)


def check_extra_args(dep: Deployment, dialect: Dialect, rendered: list[str]) -> None:
    """Read the whole command line (rendered flags, then extra_args) as SGLang's parser would, and refuse
    what extra_args would make of it: a word that parser stops at or leaves over, an option that takes
    the rest of the command line out of the plan's hands, a secret (it would sit in the world-readable
    unit), a setting the deployment decides (the server would bind, load or split one thing while
    readiness, verify and status look at another) and a port that is serve.port.

    A git or wheel build is read with its base release's table: words that table does not know go on to
    the build's own parser, which the sglang role runs before the service is touched."""
    grammar = grammar_for(dep, dialect)
    extra, first = dep.serve.extra_args, len(rendered)
    try:
        resolved = grammar.resolve([*rendered, *extra])
    except GrammarError as err:
        raise RuleError(
            "serve.extra_args", f"SGLang's parser stops at {_word(rendered, extra, err.index)}: {err.message}"
        ) from None
    for index in resolved.extras:
        if index >= first:
            _check_left_over(dep, grammar, extra[index - first])
    owned = {
        grammar.options[flag].dest: (flag, field)
        for flag, field in owned_flags(dialect).items()
        if flag in grammar.options
    }
    for found in resolved.occurrences:
        if found.index >= first:
            _check_option(dep, found, owned)


def _word(rendered: list[str], extra: list[str], index: int) -> str:
    return repr(extra[index - len(rendered)]) if index >= len(rendered) else f"the rendered {rendered[index]!r}"


def _check_left_over(dep: Deployment, grammar: Grammar, word: str) -> None:
    """A word argparse would leave over: refused on a release build ("unrecognized arguments")."""
    if word == END_OF_OPTIONS:
        raise RuleError("serve.extra_args", "-- ends SGLang's options: the words after it would not be read as options")
    unknown_option = grammar.name(word) is not None
    if dep.sglang.source != "release":
        if unknown_option and SECRET_NAME.search(word.split("=", 1)[0]):
            raise RuleError("serve.extra_args", f"{word.split('=', 1)[0]} looks like a secret: {_NO_SECRETS}")
        return
    release = dep.sglang.release_name
    if unknown_option:
        near = grammar.nearest(word)
        hint = f"nearest: {', '.join(near)}" if near else "see python -m sglang.launch_server --help"
        raise RuleError("serve.extra_args", f"{word.split('=', 1)[0]}: SGLang {release} has no such option; {hint}")
    raise RuleError(
        "serve.extra_args",
        f"{word!r} is not a value of the option before it: SGLang {release}'s parser would refuse it "
        "(unrecognized arguments)",
    )


def _check_option(dep: Deployment, found: Occurrence, owned: dict[str, tuple[str, str]]) -> None:
    flag, dest = found.word.split("=", 1)[0], found.option.dest
    # an abbreviation or a glued value: say which option SGLang reads it as
    named = flag if flag == found.spelled else f"{flag} (SGLang reads {found.spelled})"
    if dest in TAKEOVER:
        raise RuleError("serve.extra_args", f"{named}: {TAKEOVER[dest]}")
    if found.option.secret:
        raise RuleError("serve.extra_args", f"{named} is a secret: {_NO_SECRETS}")
    if dest in owned:
        hit, field = owned[dest]
        raise RuleError(
            "serve.extra_args", f"{flag} repeats {hit}, which the deployment renders from {field}; set {field} instead"
        )
    if dest in DECIDED:
        field = DECIDED[dest]
        raise RuleError(
            "serve.extra_args",
            f"{named} sets {dest}, which the deployment decides from {field}; set {field} instead",
        )
    port = dep.serve.port
    if dest.endswith("port") and any(_integer(v) == port for v in found.values):
        raise RuleError(
            "serve.extra_args",
            f"{named} would take serve.port ({port}), where the HTTP server listens; pick another port",
        )


def _integer(value: str) -> int | None:
    """The value as argparse's type=int reads it."""
    try:
        return int(value)
    except ValueError:
        return None


def argv_for(dep: Deployment, dialect: Dialect, nodes: NodePlan | None) -> Argv:
    """The server's command line, and the environment its algorithm spelling asks for."""
    serve, flags = dep.serve, dialect.flags
    args = ["--model-path", dep.model.path]
    if dep.model.served_name:
        args += served_name_args(dep.model.served_name)
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
    secret_at = None
    if serve.api_key_file:
        # systemd substitutes it from a root-only EnvironmentFile: the key is never in the unit.
        args += ["--api-key", API_KEY_REF]
        secret_at = len(launcher(dep)) + len(args) - 1
    if serve.reasoning_parser:
        args += ["--reasoning-parser", serve.reasoning_parser]
    if serve.tool_call_parser:
        args += ["--tool-call-parser", serve.tool_call_parser]
    if serve.metrics:
        args.append("--enable-metrics")
    for word in serve.extra_args:
        if len(word.encode()) >= MAX_ARG_STRLEN:
            raise RuleError(
                "serve.extra_args",
                f"a word of {len(word.encode())} bytes ({word[:20]}...) is over the kernel's limit for one "
                f"argument (MAX_ARG_STRLEN, {MAX_ARG_STRLEN - 1} bytes): the server would never start",
            )
    check_extra_args(dep, dialect, args)
    args += serve.extra_args
    return Argv([*launcher(dep), *args], env, secret_at)


def served_name_args(name: str) -> list[str]:
    """--served-model-name NAME; a name that starts with "-" would read as an option, so it travels
    after "=", where SGLang's parser takes any text as the value."""
    return [f"--served-model-name={name}"] if name.startswith("-") else ["--served-model-name", name]


def _derived_path(path: str, field: str) -> str:
    """A path the unit names that the tool builds from a field (venv/bin/python3): it must fit PATH_MAX too."""
    try:
        return check_path_limits(path)
    except ValueError as err:
        raise RuleError(field, f"{path[:40]}... {err}") from None


def launcher(dep: Deployment) -> list[str]:
    """The executable part of the command line; the stand-in takes exactly SGLang's arguments."""
    python = _derived_path(f"{dep.service.venv}/bin/python3", "service.venv")
    if dep.service.launcher == "standin":
        return [python, dep.service.standin_path]
    return [python, "-m", "sglang.launch_server"]


def specifiers(text: str) -> str:
    """Text in a directive that expands %-specifiers, kept literal."""
    return text.replace("%", "%%")


def exec_word(arg: str) -> str:
    """One ExecStart= word, literal whatever its value: specifiers and $-expansion escaped, quoted
    (with C escapes) unless plain; a lone ";" would separate commands, so it is escaped as systemd says."""
    escaped = specifiers(arg).replace("$", "$$")
    if escaped == ";":
        return "\\;"
    if _PLAIN.match(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_start(argv: Argv) -> str:
    return " ".join(API_KEY_REF if i == argv.secret_at else exec_word(a) for i, a in enumerate(argv.argv))


def path_word(path: str) -> str:
    """A path in a directive that splits and unquotes its value (ReadWritePaths=): quoted, specifiers escaped."""
    return '"' + specifiers(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def env_file_text(env: dict[str, str], field_of: Callable[[str], str] = lambda name: f"serve.env.{name}") -> str:
    """systemd's EnvironmentFile= syntax: in double quotes, \\ " $ and ` are taken literally after a backslash.
    field_of: the field that gives a variable, named when its value is too long for the kernel or systemd."""
    lines = ["# Rendered by dflash-provision from the host's plan; do not edit by hand."]
    for name, value in env.items():
        size = len(f"{name}={value}".encode())
        if size >= MAX_ARG_STRLEN:
            raise RuleError(
                field_of(name),
                f"{name} would be an environment string of {size} bytes; the kernel passes at most "
                f"{MAX_ARG_STRLEN - 1} (MAX_ARG_STRLEN): the server would never start",
            )
        quoted = re.sub(r'([\\"$`])', r"\\\1", value)
        lines.append(f'{name}="{quoted}"')
    text = "\n".join(lines) + "\n"
    check_lines(text, "environment file", lambda line: field_of(line.split("=", 1)[0]))
    return text


def check_lines(text: str, what: str, field_of: Callable[[str], str]) -> None:
    """Every line shorter than LONG_LINE_MAX bytes, else the field that made the line long is refused."""
    for line in text.splitlines():
        size = len(line.encode())
        if size >= LONG_LINE_MAX:
            raise RuleError(
                field_of(line),
                f"makes a line of {size} bytes in the {what}; systemd refuses a file with a line of "
                f"{LONG_LINE_MAX} bytes (LONG_LINE_MAX) or more",
            )


class DirectiveTable(BaseModel):
    """provision/data/systemd_directives.yml: the systemd version each directive (or value) appeared in."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    introduced: dict[int, list[str]]
    essential: list[str]

    def since(self) -> Mapping[str, int]:
        return {spelling: version for version, names in self.introduced.items() for spelling in names}


@cache
def directive_table() -> DirectiveTable:
    return DirectiveTable.model_validate(load_data("systemd_directives.yml"))


def needs(line: str) -> tuple[str, int]:
    """The spelling in a directive line that needs the newest systemd, and that version: the directive
    itself, or one of the words of its value ("Type=exec", "SystemCallFilter=@swap")."""
    since = directive_table().since()
    name, _, value = line.partition("=")
    if name not in since:
        raise LookupError(f"{name}= is rendered but has no entry in provision/data/systemd_directives.yml")
    spellings = [name, *(f"{name}={word.lstrip('~')}" for word in value.split())]
    return max(((s, since[s]) for s in spellings if s in since), key=lambda pair: pair[1])


def for_systemd(unit: str, version: int) -> str:
    """The unit as `version` reads it: a directive it lacks is omitted with a comment, or, where the
    table calls it essential, the version is refused with the directive named."""
    table = directive_table()
    directives = [line for line in unit.splitlines() if line and not line.startswith(("#", "["))]
    floor = max(needs(line)[1] for line in directives if line.partition("=")[0] in table.essential)
    out = []
    for line in unit.splitlines(keepends=True):
        if line.strip() in directives:
            spelling, since = needs(line.strip())
            spelling += "" if "=" in spelling else "="
            if since > version:
                if line.partition("=")[0] in table.essential:
                    raise RuleError(
                        "service.systemd_version",
                        f"systemd {version} has no {spelling} (systemd {since}), which the unit cannot do "
                        f"without; allowed: {floor} or newer",
                    )
                line = f"# systemd {version} has no {spelling} (systemd {since}): omitted\n"
        out.append(line)
    return "".join(out)


_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("provision.planning"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


def unit_text(dep: Deployment, argv: Argv, systemd: SystemdPlan) -> str:
    service = dep.service
    env_files = [service.env_path]
    env_files += [service.secrets_path] if dep.serve.api_key_file else []
    unit = _templates.get_template("sglang-dflash.service.j2").render(
        dep=dep,
        description=specifiers(
            f"SGLang {dep.serve.algorithm} server for {dep.model.path}"
            + (" (SGLang stand-in, no GPU)" if service.launcher == "standin" else "")
        ),
        env_files=[specifiers(_derived_path(path, "service.config_dir")) for path in env_files],
        exec_start=exec_start(argv),
        rdma=service.rdma or dep.multinode is not None,
        writable=[path_word(p) for p in sorted({dep.triton.cache_dir, dep.flashinfer.workspace_base})],
    )
    check_lines(unit, "unit", lambda line: UNIT_LINE_FIELDS.get(line.split("=", 1)[0], "service"))
    return for_systemd(unit, systemd.version)
