"""Broken input: one clear line naming the file or option, the field and what is allowed; exit 2; no run."""

from __future__ import annotations

from pathlib import Path

import pytest


def assert_refused(rc: int, out: str, err: str, expected: list[str]) -> None:
    """Exit 2, nothing on stdout, one line on stderr that names every expected fragment."""
    assert rc == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for fragment in expected:
        assert fragment in err


# (--set items, what the message must name)
BAD_SETS = [
    (["serve.block_size=16"], ["--set serve.block_size=16", "trained block size 8", "allow_untrained_depth"]),
    (["serve.draft_window=4"], ["serve.draft_window", ">= block_size (8)"]),
    (["serve.pp=2"], ["serve.pp", "does not support pipeline parallelism", "allowed: 1"]),
    (["serve.dp_attention=true"], ["serve.dp_attention", "dp-attention"]),
    (["serve.tp=16"], ["serve.tp", "needs more GPUs than 8"]),
    (["serve.ep=4"], ["serve.ep", "must be 1 or equal to tp (8)"]),
    (["serve.ddtree.budget=0"], ["serve.ddtree.budget", "greater than or equal to 1"]),
    (["serve.ddtree.topk=0"], ["serve.ddtree.topk", "greater than or equal to 1"]),
    (["serve.attention_backend=fa3"], ["serve.attention_backend", "sm_120", "allowed:"]),
    (["serve.attention_backend=fa4"], ["serve.attention_backend", "FA4"]),
    (["serve.draft_attention_backend=trtllm_mla"], ["serve.draft_attention_backend", "sglang#24633"]),
    (["serve.attention_backend=flashinferr"], ["serve.attention_backend", "unknown attention backend", "allowed:"]),
    (["cuda.version=12.8", "sglang.torch_cuda=12.8", "gpu.arch=10.3"], ["cuda.version", "needs >= 12.9"]),
    (["cuda.version=12.9"], ["cuda.version", "torch"]),
    (["cuda.version=11.0"], ["cuda.version", "supported: 12.8, 12.9, 13.0"]),
    (["cuda.version=thirteen"], ["cuda.version", "supported:"]),
    (["serve.bogus=1"], ["--set", "serve.bogus", "unknown key", "allowed under serve:", "block_size"]),
    (["bogus.key=1"], ["--set", "bogus.key", "unknown key", "allowed under top level:"]),
    (["serve.port=70000"], ["serve.port", "less than or equal to 65535"]),
    (["serve.port=http"], ["serve.port", "valid integer"]),
    (["serve.algorithm=EAGLE"], ["serve.algorithm", "'DFLASH', 'DDTREE' or 'NONE'"]),
    (["drafter.block_size=x"], ["drafter.block_size", "valid integer"]),
    (["drafter.block_size=1"], ["drafter.block_size", "greater than or equal to 2"]),
    (["serve"], ["--set", "expected KEY=VALUE"]),
    (["=3"], ["--set", "expected KEY=VALUE"]),
    (["serve.ddtree.budget.deeper=1"], ["serve.ddtree.budget", "takes no sub-keys"]),
    (["sglang.dialect=sglang-0.5.23"], ["dflash_serve.algorithm", "DDTREE is not spoken", "allowed: DFLASH, NONE"]),
    (["sglang.dialect=nightly"], ["sglang.dialect", "unknown dialect", "ddtree-pr29907"]),
    (["sglang.source=release", "sglang.version=0.4.0"], ["sglang.version", "unknown release", "0.5.23"]),
    (["serve.host=myhost"], ["serve.host", "IP address"]),
    (["serve.api_key_file=relative/key"], ["serve.api_key_file", "absolute path"]),
    (["serve.mem_fraction=1.5"], ["serve.mem_fraction", "less than 1"]),
    (["serve.env.9BAD=1"], ["serve.env", "invalid environment variable name"]),
    (["gpu.arch=7.0"], ["gpu.arch", "unknown compute capability", "12.0"]),
    (["gpu.interconnect=infiniband"], ["gpu.interconnect", "'pcie' or 'nvlink'"]),
    (["triton.ptxas=bundled", "triton.version=3.5.0", "gpu.arch=10.3"], ["triton.ptxas", "cannot assemble sm_103a"]),
    (["triton.version=2.9.0", "triton.ptxas=auto"], ["triton.version", "no ptxas facts"]),
    (["serve.extra_args=notalist"], ["serve.extra_args", "valid list"]),
]


@pytest.mark.parametrize(("sets", "expected"), BAD_SETS, ids=[" ".join(s) for s, _ in BAD_SETS])
def test_bad_set(run, sets: list[str], expected: list[str]) -> None:
    argv = ["plan", "--host", "rtx6000"]
    for item in sets:
        argv += ["--set", item]
    assert_refused(*run(*argv), expected)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


# (file under the inventory, old text, new text, what the message must name)
BAD_FILES = [
    (
        "group_vars/b300.yml",
        "  tp: 8\n",
        "  tp: 8\n  tp_size: 8\n",
        ["group_vars/b300.yml", "dflash_serve.tp_size", "unknown key"],
    ),
    (
        "group_vars/b300.yml",
        "  count: 8\n",
        "  count: 0\n",
        ["group_vars/b300.yml:5", "dflash_gpu.count", "greater than or equal to 1"],
    ),
    ("group_vars/b300.yml", "  count: 8\n", "  count: [8\n", ["group_vars/b300.yml:", "YAML parsing failed"]),
    (
        "group_vars/b300.yml",
        "dflash_serve:\n",
        "dflash_serv:\n",
        ["group_vars/b300.yml", "dflash_serv", "unknown variable"],
    ),
    (
        "group_vars/b300.yml",
        "dflash_triton:\n  ptxas: toolkit\n",
        "dflash_triton: toolkit\n",
        ["dflash_triton", "must be a mapping"],
    ),
    (
        "group_vars/b300.yml",
        '  arch: "10.3"\n',
        '  arch: "10.3"\n  vram: 1\n',
        ["dflash_gpu.vram", "allowed: arch, count, interconnect, memory_gb, model"],
    ),
    (
        "group_vars/b300.yml",
        "  block_size: 8\n  draft_window: 2048\n",
        "  block_size: 8\n  draft_window: 6\n",
        ["group_vars/b300.yml:", "dflash_serve.draft_window"],
    ),
    (
        "group_vars/all.yml",
        "  block_size: 8\n",
        "  block_size: 4\n",
        ["group_vars/b300.yml:", "dflash_serve.block_size", "trained block size 4"],
    ),
    (
        "group_vars/all.yml",
        "  path: /models/Kimi-K2.6\n",
        "  path: models/Kimi-K2.6\n",
        ["group_vars/all.yml", "dflash_model.path", "absolute"],
    ),
    (
        "group_vars/all.yml",
        "  git_ref: refs/pull/29907/head\n",
        "",
        ["dflash_sglang.git_ref", "required when source is git"],
    ),
    ("hosts.yml", "b300-test:", "b300-test: [", ["hosts.yml:", "cannot parse the inventory"]),
    (
        "group_vars/b300.yml",
        "dflash_gpu:\n",
        "dflash_set: notamapping\ndflash_gpu:\n",
        ["group_vars/b300.yml", "dflash_set", "must be a mapping"],
    ),
    (
        "group_vars/b300.yml",
        "dflash_gpu:\n",
        "dflash_set: {serve.tp_size: 2}\ndflash_gpu:\n",
        ["group_vars/b300.yml", "serve.tp_size", "unknown key"],
    ),
    (
        "group_vars/b300.yml",
        "dflash_gpu:\n",
        "dflash_set: {serve.tp: 9}\ndflash_gpu:\n",
        ["group_vars/b300.yml:2", "dflash_set[serve.tp]", "needs more GPUs"],
    ),
]


@pytest.mark.parametrize(("name", "old", "new", "expected"), BAD_FILES, ids=[f"{n}:{e[1]}" for n, _, _, e in BAD_FILES])
def test_bad_inventory_file(inventory: Path, run, name: str, old: str, new: str, expected: list[str]) -> None:
    _edit(inventory / name, old, new)
    assert_refused(*run("plan", "--host", "b300", "--inventory", str(inventory)), expected)


def test_unknown_host_lists_the_known_ones(inventory: Path, run) -> None:
    rc, _, err = run("plan", "--host", "b300-02", "--inventory", str(inventory))
    assert rc == 2
    assert "--host: b300-02: unknown host or group; hosts: rtx-test, b300-test; groups: rtx6000, b300" in err


def test_missing_inventory(tmp_path: Path, run) -> None:
    rc, _, err = run("plan", "--host", "b300", "--inventory", str(tmp_path / "nope"))
    assert rc == 2 and "--inventory" in err and "does not exist" in err


def test_empty_group(inventory: Path, run) -> None:
    (inventory / "hosts.yml").write_text(
        "all:\n  children:\n    b300:\n      hosts: {}\n    other:\n      hosts:\n        x:\n"
    )
    rc, _, err = run("plan", "--host", "b300", "--inventory", str(inventory))
    assert rc == 2 and "--host: b300: the group has no hosts" in err


def test_bad_option(run) -> None:
    rc, _, err = run("plan", "--host", "b300", "--frobnicate")
    assert rc == 2 and "unrecognized arguments: --frobnicate" in err and len(err.strip().splitlines()) == 1


def test_apply_with_bad_input_never_starts_ansible(inventory: Path, tmp_path: Path, run) -> None:
    state = tmp_path / "state"
    rc, out, err = run(
        "apply", "--host", "b300", "--inventory", str(inventory), "--state-dir", str(state), "--set", "serve.ep=3"
    )
    assert rc == 2 and "serve.ep" in err
    assert not state.exists()  # no run record, no playbook
