"""Compile a small Triton kernel ahead of time for one GPU target, without needing that GPU.

Standalone: runs under the service venv's Python (which has Triton, not dflash-provision). The
ptxas it uses is whatever the environment says (TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH)
or Triton's bundled one; the cache is a fresh directory so that the compile really happens.
With --run, the kernel is also launched on every visible GPU and its result checked (needs torch
with CUDA). Prints one JSON line; exit 0 on success, 1 on failure.

Usage: python triton_aot.py --cc 103 [--run]
"""

import argparse
import json
import os
import sys
import tempfile
import time

import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def compile_for(cc: int) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
    src = ASTSource(fn=add_kernel, signature=signature, constexprs={"BLOCK": 128})
    start = time.monotonic()
    kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32))
    return {"seconds": round(time.monotonic() - start, 3), "cubin_bytes": len(kernel.asm["cubin"])}


def run_on_gpus() -> list[dict]:
    import torch

    results = []
    for index in range(torch.cuda.device_count()):
        with torch.cuda.device(index):
            x = torch.arange(4096, dtype=torch.float32, device="cuda")
            y = torch.full_like(x, 2.0)
            out = torch.empty_like(x)
            add_kernel[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
            torch.cuda.synchronize()
            ok = bool(torch.equal(out, x + 2.0))
            results.append({"gpu": index, "name": torch.cuda.get_device_name(index), "ok": ok})
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", type=int, required=True, help="compute capability without the dot, like 103")
    parser.add_argument("--run", action="store_true", help="also launch it on every visible GPU")
    args = parser.parse_args()
    # Triton prints its PTX dump on failure to stdout: keep stdout for the one JSON line.
    report = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    ptxas = {k: v for k, v in os.environ.items() if k.startswith("TRITON_PTXAS")}
    result = {"triton": triton.__version__, "cc": args.cc, "ptxas_env": ptxas}
    with tempfile.TemporaryDirectory(prefix="triton-aot-") as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        try:
            result.update(compile_for(args.cc), ok=True)
            if args.run:
                result["gpus"] = run_on_gpus()
                result["ok"] = bool(result["gpus"]) and all(g["ok"] for g in result["gpus"])
        except Exception as err:  # the compiler's own message is the point of the report
            message = str(err).strip().splitlines()
            result.update(ok=False, error=" ".join(line.strip() for line in message if line.strip())[-600:])
    print(json.dumps(result), file=report, flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
