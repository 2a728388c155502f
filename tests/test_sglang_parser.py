"""The rendered launch command against SGLang 0.5.23's own argument parser (installed without GPU packages).

SGLANG_PYTHON (or .venv-sglang, which .ci/setup builds) names a Python that has the sglang wheel.
Without one these tests are skipped, never passed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ARGCHECK = Path(__file__).resolve().parent.parent / "roles" / "sglang" / "files" / "sglang_argcheck.py"
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
