"""The rendered launch command against SGLang 0.5.23's own argument parser (installed without GPU packages).

SGLANG_PYTHON (or .venv-sglang, which .ci/setup builds) names a Python that has the sglang wheel.
Without one these tests are skipped, never passed. The parser table (provision/data/sglang_parsers.yml)
and the grammar that reads a command line with it (provision/model/server_args.py) are checked here
against that parser: the same table, and the same reading of the same words.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provision.model.server_args import Grammar, GrammarError
from provision.model.tables import builds, parsers

ARGCHECK = Path(__file__).resolve().parent.parent / "roles" / "sglang" / "files" / "sglang_argcheck.py"
TABLE = Path(__file__).resolve().parent / "sglang_parser_table.py"
# .ci/setup builds it beside the repository
LOCAL = Path(__file__).resolve().parent.parent / ".venv-sglang" / "bin" / "python"
SGLANG_PYTHON = os.environ.get("SGLANG_PYTHON") or (str(LOCAL) if LOCAL.exists() else None)

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.skipif(not SGLANG_PYTHON, reason="SGLANG_PYTHON is not set (a Python with sglang installed)"),
]


def parse(server_args: list[str]) -> dict:
    proc = subprocess.run(
        [str(SGLANG_PYTHON), str(ARGCHECK), json.dumps(server_args)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_parser_is_sglang_0_5_23() -> None:
    out = subprocess.run(
        [str(SGLANG_PYTHON), "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "0.5.23"


def test_parser_refuses_what_it_does_not_know() -> None:
    # the check can fail: a flag SGLang lacks is refused
    assert parse(["--model-path", "/m", "--no-such-flag"]) == {
        "ok": False,
        "error": "unrecognized arguments: --no-such-flag",
    }


@pytest.mark.parametrize("host", ["rtx6000", "b300"])
def test_dflash_argv_parses(plan_json, host: str) -> None:
    plan = plan_json("--host", host, "--set", "serve.algorithm=DFLASH")
    assert plan["argv"][:3] == ["/opt/sglang-dflash/venv/bin/python3", "-m", "sglang.launch_server"]
    assert parse(plan["argv"][3:]) == {"ok": True}


def test_multinode_and_tuning_flags_parse(plan_json) -> None:
    plan = plan_json(
        "--host", "b300", "--set", "serve.algorithm=DFLASH", "--set", "serve.cuda_graph.prefill=false",
        "--set", "serve.context_length=65536", "--set", "serve.kv_cache_dtype=fp8_e4m3", "--set", "serve.ep=8",
    )  # fmt: skip
    assert parse(plan["argv"][3:]) == {"ok": True}
    plan = plan_json("--host", "b300", "--set", "serve.algorithm=DFLASH", "--set", "serve.cuda_graph.enabled=false")
    assert parse(plan["argv"][3:]) == {"ok": True}


def test_ddtree_needs_a_build_that_has_it(plan_json) -> None:
    # the seed's DDTREE spelling (PR #29907) is exactly what the release parser refuses
    plan = plan_json("--host", "b300")
    result = parse(plan["argv"][3:])
    assert result == {"ok": False, "error": "unrecognized arguments: --speculative-ddtree-budget 8"}


def test_the_table_is_the_installed_parser() -> None:
    """Every option, spelling, destination, value count and secret mark, and the parser names, as the
    installed parser has them (regenerate with: .venv-sglang/bin/python tests/sglang_parser_table.py yaml)."""
    out = subprocess.run([str(SGLANG_PYTHON), str(TABLE), "table"], capture_output=True, text=True, check=True)
    real = json.loads(out.stdout)
    ours = parsers()[real.pop("release")].model_dump(exclude_defaults=True)
    assert ours == real


def test_the_table_marks_sglangs_own_secrets() -> None:
    secret = {o.dest for o in parsers()["0.5.23"].options if o.secret}
    # the API keys, the SSL key's password and the watermark key SGLang itself redacts
    assert secret == {"api_key", "admin_api_key", "ssl_keyfile_password", "watermark_config"}


def test_every_flag_a_dialect_renders_is_in_the_table() -> None:
    table = builds()
    known = {n for o in parsers()["0.5.23"].options for n in o.names}
    for name in table.dialects:
        dialect = table.resolved_dialect(name)
        assert set(dialect.flags.values()) <= known, name


Real = Callable[[list[str]], dict]


@pytest.fixture(scope="module")
def real() -> Iterator[Real]:
    """SGLang's parser, started once: one command line in, what it sets (or why it refused) out."""
    proc = subprocess.Popen(
        [str(SGLANG_PYTHON), str(TABLE), "serve"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None

    def ask(argv: list[str]) -> dict:
        proc.stdin.write(json.dumps(argv) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    yield ask
    proc.stdin.close()
    proc.wait(timeout=60)


GRAMMAR = Grammar(parsers()["0.5.23"].options)
BASE = ["--model-path", "/m"]


def ours(argv: list[str]) -> dict:
    """What our grammar makes of a command line, in the real parser's terms: the destinations set, or
    refused ("exit" where -h is read: argparse prints the help and exits as it reads it)."""
    try:
        resolved = GRAMMAR.resolve(argv)
    except GrammarError:
        return {"ok": False, "dests": None}
    if any(o.option.dest == "help" for o in resolved.occurrences):
        return {"ok": False, "dests": "exit"}
    if resolved.extras:
        return {"ok": False, "dests": None}
    return {"ok": True, "dests": sorted({o.option.dest for o in resolved.occurrences})}


def theirs(answer: dict) -> dict:
    if answer["error"] == "exit":
        return {"ok": False, "dests": "exit"}
    return {"ok": answer["ok"], "dests": sorted(answer["set"]) if answer["ok"] else None}


# extra_args -> what SGLang's parser sets from them (None: it refuses the command line; "exit": -h)
CASES = [
    (["--admin-api-k", "sk"], {"admin_api_key": "sk"}),
    (["--api-key=sk"], {"api_key": "sk"}),
    (["--ssl-keyfile-p", "pw"], {"ssl_keyfile_password": "pw"}),
    (["--config", "/etc/x.yml"], {"config": "/etc/x.yml"}),
    (["--cuda-graph-config", "{}"], {"cuda_graph_config": "{}"}),
    (["--speculative-dflash-block-size", "4"], {"speculative_dflash_block_size": "4"}),
    (["--attention-data-parallel-size", "2"], {"attn_dp_size": "2"}),
    (["--attn-dp-size=2"], {"attn_dp_size": "2"}),
    (["--dp", "2"], {"dp_size": "2"}),
    (["--tensor-parallel-size", "4"], {"tp_size": "4"}),
    (["--ep", "8"], {"ep_size": "8"}),
    (["--po", "30001"], {"port": "30001"}),
    (["--grpc-port", "30000"], {"grpc_port": "30000"}),
    (["--no-enable-tf32-matmul"], {"enable_tf32_matmul": False}),
    (["--monokernel-backend", "amd"], {"enable_amd_monokernel": True}),
    (["--speculative-token-map", "/t"], {"speculative_token_map": "/t"}),
    (["--uvicorn-access-log-exclude", "a", "-1", "b c"], {"uvicorn_access_log_exclude_prefixes": ["a", "-1", "b c"]}),
    (["--model-checksum"], {"model_checksum": ""}),
    (["--served-model-name=-x"], {"served_model_name": "-x"}),
    (["--served-model-name", "-x"], None),
    (["--log-level", "--x"], None),
    (["--enable-metrics=1"], None),
    (["--bucket-time-to-first-token"], None),
    (["--d", "1"], None),
    (["--no-such-flag"], None),
    (["stray"], None),
    (["--"], None),
    (["--", "--port", "1"], None),
    (["-hx"], None),
    (["-h"], "exit"),
    (["--help"], "exit"),
    (["--hel"], "exit"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "expected"), CASES, ids=[" ".join(e) for e, _ in CASES])
def test_the_grammar_reads_a_command_line_as_sglang_does(real: Real, extra: list[str], expected: object) -> None:
    answer = real([*BASE, *extra])
    if expected is None:
        assert not answer["ok"] and answer["error"] != "exit", answer
    elif expected == "exit":
        assert answer["error"] == "exit", answer
    else:
        assert answer["ok"], answer
        assert answer["set"] == {"model_path": "/m", **expected}
    assert ours([*BASE, *extra]) == theirs(answer)


OPTIONS = [o for o in parsers()["0.5.23"].options if o.dest != "help"]


@st.composite
def spelled(draw: st.DrawFn) -> list[str]:
    """One option as a user might write it: any spelling or a prefix of one, its values after "=" or as
    the following words, sometimes too many or too few, sometimes values that look like options."""
    option = draw(st.sampled_from(OPTIONS))
    name = draw(st.sampled_from(option.names))
    if draw(st.booleans()):
        name = name[: draw(st.integers(min_value=3, max_value=len(name)))]
    if "--help".startswith(name):
        name = option.names[0]
    want = {0: 0, 1: 1, "?": draw(st.integers(0, 1)), "*": draw(st.integers(0, 2)), "+": draw(st.integers(1, 2))}
    count = want.get(option.nargs, 1)
    if draw(st.integers(0, 9)) == 0:
        count = draw(st.integers(0, 2))
    values = draw(st.lists(st.sampled_from(["v", "1", "-1", "a b", "-x", "--", "-"]), min_size=count, max_size=count))
    if values and draw(st.booleans()):
        return [f"{name}={values[0]}", *values[1:]]
    return [name, *values]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(spelled(), max_size=5).map(lambda groups: [w for g in groups for w in g]))
def test_the_grammar_sets_what_sglang_sets(real: Real, extra: list[str]) -> None:
    argv = [*BASE, *extra]
    assert ours(argv) == theirs(real(argv))


@pytest.mark.parametrize("name", ["-x", "--port", "-", "--served-model-name=-y", "- x"])
def test_a_served_name_that_starts_with_a_dash_parses(plan_json, real: Real, name: str) -> None:
    plan = plan_json("--host", "rtx6000", "--set", "serve.algorithm=DFLASH", "--set", f"model.served_name={name}")
    answer = real(plan["argv"][3:])
    assert answer["ok"], answer
    assert answer["set"]["served_model_name"] == name
