"""Kernel JIT: nvcc and Triton build for the host's arch; on GPUs, Triton and FlashInfer kernels run and are checked."""

from __future__ import annotations

import json
from typing import Any

import pytest

from provision.verify.checks.conftest import run_script

ADD_CU = r"""extern "C" __global__ void add(const float *x, const float *y, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] + y[i];
}
"""


def _last_json(text: str) -> dict[str, Any]:
    return json.loads(text.strip().splitlines()[-1])


def test_nvcc_compiles_for_the_arch(host: Any, plan: dict[str, Any]) -> None:
    """No GPU needed: the toolkit either knows the target or it does not."""
    home, sm = plan["cuda"]["home"], plan["triton"]["target"]
    listing = f"if test -x {home}/bin/cuobjdump; then {home}/bin/cuobjdump --list-elf $d/add.cubin; fi"
    run = host.run(
        f"d=$(mktemp -d) && cat > $d/add.cu <<'EOF'\n{ADD_CU}EOF\n"
        f"{home}/bin/nvcc -cubin -arch={sm} -o $d/add.cubin $d/add.cu && {listing}; rc=$?; rm -rf $d; exit $rc"
    )
    assert run.rc == 0, run.stderr[-1500:]
    # where the toolkit has cuobjdump, the cubin must say the arch too
    assert not run.stdout.strip() or f".{sm}.cubin" in run.stdout, run.stdout


def _triton_env(plan: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in plan["env"].items() if k.startswith("TRITON_PTXAS")}


def test_triton_compiles_for_the_arch(host: Any, plan: dict[str, Any]) -> None:
    """Ahead of time, with the service's ptxas settings; no GPU needed."""
    python = plan["python_env"]["venv"] + "/bin/python3"
    run = run_script(host, "triton/files/triton_aot.py", python, f"--cc {plan['triton']['cc']}", _triton_env(plan))
    assert run.rc == 0, run.stdout[-1500:] + run.stderr[-1500:]
    assert _last_json(run.stdout)["ok"]


@pytest.mark.usefixtures("gpus")
def test_triton_runs_on_every_gpu(host: Any, plan: dict[str, Any]) -> None:
    python = plan["python_env"]["venv"] + "/bin/python3"
    cc = plan["triton"]["cc"]
    run = run_script(host, "triton/files/triton_aot.py", python, f"--cc {cc} --run", _triton_env(plan))
    assert run.rc == 0, run.stdout[-1500:] + run.stderr[-1500:]
    gpus = _last_json(run.stdout)["gpus"]
    assert len(gpus) == plan["gpu"]["count"] and all(g["ok"] for g in gpus), gpus


@pytest.mark.usefixtures("gpus")
def test_flashinfer_builds_and_runs_on_every_gpu(host: Any, plan: dict[str, Any]) -> None:
    """Builds (or loads from its cache) FlashInfer's activation kernel for the arch and checks its result."""
    python = plan["python_env"]["venv"] + "/bin/python3"
    env = {k: plan["env"][k] for k in ("FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_WORKSPACE_BASE", "CUDA_HOME")}
    run = run_script(host, "flashinfer/files/flashinfer_build.py", python, "--modules activation --run", env)
    assert run.rc == 0, run.stdout[-1500:] + run.stderr[-1500:]
    result = _last_json(run.stdout)
    assert len(result["gpus"]) == plan["gpu"]["count"] and all(g["ok"] for g in result["gpus"]), result
