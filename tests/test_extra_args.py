"""serve.extra_args read through SGLang's own grammar, with the flags the deployment renders before them.

tests/test_sglang_parser.py shows that the installed parser reads these spellings the same way.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import Run
from tests.test_bad_input import assert_refused

# a release build: its parser table is the whole grammar, so an unknown option is refused
RELEASE = ["--set", "sglang.source=release", "--set", "sglang.dialect=null", "--set", "serve.algorithm=DFLASH"]
SECRET = ["is a secret", "world-readable unit", "serve.api_key_file"]

REFUSED = [
    (["--admin-api-k", "sk"], ["--admin-api-k (SGLang reads --admin-api-key)", *SECRET]),
    (["--api-key=sk"], ["--api-key", *SECRET]),
    (["--api", "sk"], ["--api (SGLang reads --api-key)", *SECRET]),
    (["--ssl-keyfile-password", "pw"], ["--ssl-keyfile-password", *SECRET]),
    (["--watermark-config", '{"key": 1}'], ["--watermark-config", *SECRET]),
    (["--config", "/etc/sglang.yml"], ["--config", "read options from that file", "put them in serve.extra_args"]),
    (["--conf=/etc/sglang.yml"], ["--conf (SGLang reads --config)", "read options from that file"]),
    (["-h"], ["-h", "print its help and exit"]),
    (["--hel"], ["--hel (SGLang reads --help)", "print its help"]),
    (["-hx"], ["'-hx'", "ignored explicit argument 'x'"]),
    (["--"], ["-- ends SGLang's options"]),
    (["--", "--port", "1"], ["-- ends SGLang's options"]),
    (["--cuda-graph-config", "{}"], ["--cuda-graph-config sets cuda_graph_config", "set serve.cuda_graph instead"]),
    (["--cuda-graph-backend-decode", "disabled"], ["set serve.cuda_graph.enabled instead"]),
    (["--disable-cuda-graph"], ["repeats --disable-cuda-graph", "serve.cuda_graph.enabled"]),
    (["--speculative-dflash-block-size", "4"], ["speculative_dflash_block_size", "set serve.block_size instead"]),
    (["--attn-dp-size", "2"], ["attn_dp_size", "set serve.dp_attention instead"]),
    (["--attention-data-parallel-size=2"], ["attn_dp_size", "serve.dp_attention"]),
    (["--dp-size", "2"], ["dp_size", "set serve.tp instead"]),
    (["--dp", "2"], ["--dp (SGLang reads --dp-size)", "serve.tp"]),
    (["--tensor-parallel-size=4"], ["repeats --tp-size", "set serve.tp instead"]),
    (["--model-pa", "/other"], ["--model-pa repeats --model-path", "model.path"]),
    (["--served-model-name", "other"], ["repeats --served-model-name", "model.served_name"]),
    (["--grpc-port", "30000"], ["--grpc-port would take serve.port (30000)"]),
    (["--grpc-port=30000"], ["--grpc-port would take serve.port (30000)"]),
    (["--no-such-flag"], ["--no-such-flag: SGLang 0.5.23 has no such option"]),
    (["--enable-metrix"], ["no such option", "nearest: --enable-metrics"]),
    (["--d", "1"], ["SGLang's parser stops at '--d'", "ambiguous option: --d could match --detokenizer-worker-num"]),
    (["stray"], ["'stray' is not a value of the option before it", "unrecognized arguments"]),
    (["--enable-cache-report", "yes"], ["'yes' is not a value"]),
    (["--log-level", "--x"], ["stops at '--log-level'", "expected one argument"]),
    (["--log-level"], ["expected one argument"]),
    (["--log-lev=debug"], ["ambiguous option: --log-lev=debug could match --log-level, --log-level-http"]),
    (["--enable-cache-report=1"], ["ignored explicit argument '1'"]),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "expected"), REFUSED, ids=[" ".join(e) for e, _ in REFUSED])
def test_refused_on_a_release_build(run: Run, extra: list[str], expected: list[str]) -> None:
    rc, out, err = run("plan", "--host", "rtx6000", *RELEASE, "--set", "serve.extra_args=" + json.dumps(extra))
    assert_refused(rc, out, err, ["serve.extra_args", *expected])


def test_a_port_option_may_not_take_serve_port(run: Run) -> None:
    extra = json.dumps(["--nccl-port", "31000"])
    rc, out, err = run(
        "plan", "--host", "rtx6000", *RELEASE, "--set", "serve.port=31000", "--set", f"serve.extra_args={extra}"
    )
    assert_refused(rc, out, err, ["--nccl-port would take serve.port (31000)"])


ACCEPTED = [
    ["--speculative-token-map", "/models/map.pt"],  # "token" in the name is not a secret
    ["--log-level", "debug", "--enable-cache-report"],
    ["--schedule-pol=lpm"],  # an abbreviation SGLang reads as one allowed option
    ["--uvicorn-access-log-exclude-prefixes", "/health", "-1", "a b"],
    ["--chat-template=-x"],  # a value that starts with "-", after "="
    ["--grpc-port", "30001"],
    ["--no-enable-tf32-matmul"],
]


@pytest.mark.parametrize("extra", ACCEPTED, ids=[" ".join(e) for e in ACCEPTED])
def test_accepted_and_rendered_last(plan_json, extra: list[str]) -> None:
    plan = plan_json("--host", "rtx6000", *RELEASE, "--set", "serve.extra_args=" + json.dumps(extra))
    assert plan["argv"][-len(extra) :] == extra


def test_a_git_build_leaves_unknown_options_to_its_own_parser(plan_json) -> None:
    # a PR build may add options its base release's table lacks; the sglang role runs its parser
    plan = plan_json("--host", "rtx6000", "--set", 'serve.extra_args=["--ddtree-new-knob", "3"]')
    assert plan["config"]["sglang"]["source"] == "git"
    assert plan["argv"][-2:] == ["--ddtree-new-knob", "3"]


GIT_REFUSED = [
    (["--hf-token=hf_x"], ["--hf-token looks like a secret", "world-readable unit"]),
    (["--admin-api-k", "sk"], ["--admin-api-k (SGLang reads --admin-api-key)", *SECRET]),
    (["--speculative-ddtree-b", "4"], ["repeats --speculative-ddtree-budget", "set serve.ddtree.budget instead"]),
    (["--", "x"], ["-- ends SGLang's options"]),
    (["--d", "1"], ["ambiguous option"]),
]


@pytest.mark.parametrize(("extra", "expected"), GIT_REFUSED, ids=[" ".join(e) for e, _ in GIT_REFUSED])
def test_refused_on_a_git_build(run: Run, extra: list[str], expected: list[str]) -> None:
    rc, out, err = run("plan", "--host", "rtx6000", "--set", "serve.extra_args=" + json.dumps(extra))
    assert_refused(rc, out, err, ["serve.extra_args", *expected])


@pytest.mark.parametrize(("name", "words"), [("-x", ["--served-model-name=-x"]), ("k2", ["--served-model-name", "k2"])])
def test_a_served_name_that_reads_as_an_option_travels_after_equals(plan_json, name: str, words: list[str]) -> None:
    plan = plan_json("--host", "rtx6000", "--set", f"model.served_name={name}")
    argv = plan["argv"]
    at = next(i for i, w in enumerate(argv) if w.startswith("--served-model-name"))
    assert argv[at : at + len(words)] == words
