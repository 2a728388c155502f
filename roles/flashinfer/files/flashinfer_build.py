#!/usr/bin/env python3
"""Build FlashInfer JIT kernel modules into FlashInfer's own cache, on a host without a GPU.

Runs under the host venv's python (the one that has flashinfer-python), not under dflash-provision.

    FLASHINFER_CUDA_ARCH_LIST="10.3" FLASHINFER_WORKSPACE_BASE=/srv/fi CUDA_HOME=/opt/cuda-13.0/nvidia/cu13 \
    MAX_JOBS=2 python flashinfer_build.py --modules activation,norm [--check]

Prints one JSON line: {"flashinfer", "arch_list", "cache_dir", "aot_dir", "max_jobs",
"modules": [{"name", "spec", "so", "built", "seconds", "aot"}]} ("aot" with --install-aot; MAX_JOBS is sized to
cores and memory unless set)
(--check: "cached" instead of "built"/"seconds"); exits 1 with a message on stderr on failure.
The service finds a module cached when it runs with the same FLASHINFER_WORKSPACE_BASE (or $HOME), the same venv
path and the same CUDA_HOME: FlashInfer re-runs ninja on every load, and ninja rebuilds on any changed command line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

# Kimi K2 / DeepSeek-V3 MLA shapes: kv_lora_rank 512, qk_rope_head_dim 64, qk_nope 128 + rope 64 = 192, v 128.
MLA_CKV, MLA_KPE, MLA_QK, MLA_VO = 512, 64, 192, 128


def _specs(name: str) -> list[Any]:
    """Map our module names to the JitSpecs that FlashInfer 0.7.2's own wrappers ask for at run time."""
    import torch
    from flashinfer.jit import activation, attention, cascade, norm, page, rope, sampling

    bf16, i32 = torch.bfloat16, torch.int32
    table: dict[str, Callable[[], list[Any]]] = {
        "activation": lambda: [activation.gen_act_and_mul_module("silu")],
        "norm": lambda: [norm.gen_norm_module()],
        "sampling": lambda: [sampling.gen_sampling_module()],
        "rope": lambda: [rope.gen_rope_module()],
        "page": lambda: [page.gen_page_module()],
        "cascade": lambda: [cascade.gen_cascade_module()],
        # BatchMLAPagedAttentionWrapper, backend fa2 (what "auto" picks first on SM12x, and for some plans on SM10x).
        "batch_mla": lambda: [attention.gen_batch_mla_module("fa2", bf16, bf16, bf16, i32, MLA_CKV, MLA_KPE, False)],
        # BatchPrefillWithRaggedKVCacheWrapper (MLA prefill) with fa2: get_batch_prefill_module builds the "primary".
        "batch_prefill_mla": lambda: [
            attention.modules._gen_batch_prefill_primary_module(
                "fa2", bf16, bf16, bf16, i32, MLA_QK, MLA_VO, 0, False, False, False
            )
        ],
        # SGLang uses backend="cutlass" for the ragged prefill on SM100-family GPUs (nvcc-built, SM10x/11x only).
        "fmha_cutlass_mla": lambda: [
            attention.gen_fmha_cutlass_sm100a_module(bf16, bf16, bf16, i32, MLA_QK, MLA_VO, 0, False, False)
        ],
    }
    if name not in table:
        raise SystemExit(f"flashinfer_build: unknown module {name!r}; known: {','.join(table)}")
    return table[name]()


KNOWN = "activation,norm,sampling,rope,page,cascade,batch_mla,batch_prefill_mla,fmha_cutlass_mla"


def _fail(message: str) -> NoReturn:
    print(f"flashinfer_build: {message}", file=sys.stderr)
    raise SystemExit(1)


def _prepare_environment() -> Path:
    """Check the environment before flashinfer is imported: it reads these variables at import time."""
    if not os.environ.get("FLASHINFER_CUDA_ARCH_LIST"):
        # Without it FlashInfer asks torch for the GPUs; with no GPU it gets none and refuses to build.
        _fail('FLASHINFER_CUDA_ARCH_LIST is required (e.g. "10.3" or "12.0")')
    cuda_home = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")
    if not (cuda_home / "bin" / "nvcc").exists():
        _fail(f"no nvcc at {cuda_home}/bin/nvcc: set CUDA_HOME to the toolkit (e.g. PREFIX/nvidia/cu13)")
    os.environ["CUDA_HOME"] = str(cuda_home)
    # FlashInfer runs a bare "ninja"; the ninja wheel puts it next to the venv's python, which may not be on PATH.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    if shutil.which("ninja") is None:
        _fail("ninja not found: install the ninja wheel into this venv")
    return cuda_home


def _link_stubs(cuda_home: Path, workspace: Path) -> None:
    """Let the link step's "-lcudart -lcuda" resolve on a host with no driver and a PyPI toolkit.

    FlashInfer links with "-L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda". The PyPI toolkit has only
    lib/libcudart.so.13 (no lib64, no libcudart.so) and no driver stub; a GPU-less host has no libcuda.so. The libraries
    go on LIBRARY_PATH (read by gcc, not part of the command) so the build.ninja stays what the service itself would
    write, and ninja there sees nothing to redo.
    """
    stubs = workspace / ".cache" / "flashinfer-link-stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    for lib_dir in (cuda_home / "lib64", cuda_home / "lib"):
        candidates = sorted(lib_dir.glob("libcudart.so.*"))
        if candidates:
            cudart = stubs / "libcudart.so"
            if not cudart.exists():
                cudart.symlink_to(candidates[0])
            break
    else:
        _fail(f"no libcudart.so.* under {cuda_home}/lib64 or lib: install the cudart toolkit component")
    libcuda = stubs / "libcuda.so"
    if not libcuda.exists():
        # An empty library named like the driver: the kernels reach the driver through cudart, so nothing binds to it.
        source = stubs / "libcuda_stub.c"
        source.write_text("/* link-time stand-in for the CUDA driver */\n")
        compiler = os.environ.get("CC", "cc")
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(libcuda), str(source)], check=True
        )
    os.environ["LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(stubs), os.environ.get("LIBRARY_PATH")]))


def _ninja_up_to_date(spec: Any) -> bool:
    """True when the cached module is what this environment would build and ninja has nothing to do."""
    from flashinfer.jit.cpp_ext import generate_ninja_build_for_op

    if not (spec.jit_library_path.exists() and spec.ninja_path.exists()):
        return False
    if spec.embedded_cubin_factory is None:
        expected = generate_ninja_build_for_op(
            name=spec.name,
            sources=spec.sources,
            extra_cflags=spec.extra_cflags,
            extra_cuda_cflags=spec.extra_cuda_cflags,
            extra_ldflags=spec.extra_ldflags,
            extra_include_dirs=spec.extra_include_dirs,
            needs_device_linking=spec.needs_device_linking,
            extra_cuda_cflags_by_source=spec.extra_cuda_cflags_by_source,
        )
        if spec.ninja_path.read_text() != expected:
            return False  # FlashInfer would rewrite build.ninja, and ninja would rebuild.
    dry = subprocess.run(
        ["ninja", "-n", "-C", str(spec.build_dir), "-f", str(spec.ninja_path)],
        capture_output=True,
        text=True,
    )
    return dry.returncode == 0 and "no work to do" in dry.stdout


def _size_jobs() -> int:
    """MAX_JOBS unless set: one nvcc per core, but no more than memory allows (about 1 GB each, measured; 1.5 kept)."""
    if os.environ.get("MAX_JOBS"):
        return int(os.environ["MAX_JOBS"])
    available_kb = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                available_kb = int(line.split()[1])
    jobs = max(1, min(os.cpu_count() or 1, int(available_kb / 1024 / 1024 / 1.5)))
    os.environ["MAX_JOBS"] = str(jobs)
    return jobs


def _install_aot(spec: Any, so: Path) -> str:
    """Put the built module where FlashInfer loads AOT modules from: found there, it is used with no ninja check,
    so it stays valid when copied to another host of the same arch (paths and mtimes do not matter)."""
    from flashinfer.jit import env as jit_env

    target = jit_env.FLASHINFER_AOT_DIR / spec.name / f"{spec.name}.so"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(so, target)
    return str(target)


def _run_on_gpus() -> list[dict[str, Any]]:
    """Launch the activation kernel on every visible GPU and compare with torch's own result."""
    import torch
    from flashinfer.activation import silu_and_mul

    results = []
    for index in range(torch.cuda.device_count()):
        x = torch.randn(64, 2 * 512, device=f"cuda:{index}", dtype=torch.float16)
        expected = torch.nn.functional.silu(x[:, :512]) * x[:, 512:]
        ok = bool(torch.allclose(silu_and_mul(x), expected, atol=1e-2, rtol=1e-2))
        results.append({"gpu": index, "name": torch.cuda.get_device_name(index), "ok": ok})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modules", required=True, help=f"comma-separated, from: {KNOWN}")
    parser.add_argument("--check", action="store_true", help="only report whether each module is cached; no compile")
    parser.add_argument("--install-aot", action="store_true", help="also install the built modules as AOT modules")
    parser.add_argument("--run", action="store_true", help="then run the activation kernel on every GPU and check it")
    args = parser.parse_args()
    jobs = _size_jobs()
    names = [n.strip() for n in args.modules.split(",") if n.strip()]

    cuda_home = _prepare_environment()
    import flashinfer
    from flashinfer.jit import env as jit_env

    results: list[dict[str, Any]] = []
    try:
        if not args.check:
            _link_stubs(cuda_home, jit_env.FLASHINFER_BASE_DIR)
        for name in names:
            for spec in _specs(name):
                if args.check:
                    so_path = str(spec.jit_library_path)
                    results.append({"name": name, "spec": spec.name, "so": so_path, "cached": _ninja_up_to_date(spec)})
                    continue
                so: Path = spec.jit_library_path
                before = so.stat().st_mtime_ns if so.exists() else None
                start = time.monotonic()
                # build(), not build_and_load(): loading dlopens the .so, which needs libcuda.so.1 (a GPU driver).
                spec.build()
                after = so.stat().st_mtime_ns if so.exists() else None
                if after is None:
                    _fail(f"{spec.name}: ninja finished but {so} is missing")
                entry = {
                    "name": name,
                    "spec": spec.name,
                    "so": str(so),
                    "built": after != before,
                    "seconds": round(time.monotonic() - start, 1),
                }
                if args.install_aot:
                    entry["aot"] = _install_aot(spec, so)
                results.append(entry)
        gpus = _run_on_gpus() if args.run else None
    except SystemExit:
        raise
    except Exception as error:  # JIT errors (nvcc output included) become one clear line for Ansible.
        _fail(f"{type(error).__name__}: {error}")

    print(
        json.dumps(
            {
                "flashinfer": flashinfer.__version__,
                "arch_list": os.environ["FLASHINFER_CUDA_ARCH_LIST"],
                "cache_dir": str(jit_env.FLASHINFER_JIT_DIR),
                "aot_dir": str(jit_env.FLASHINFER_AOT_DIR),
                "max_jobs": jobs,
                "modules": results,
                **({"gpus": gpus} if gpus is not None else {}),
            }
        )
    )


if __name__ == "__main__":
    main()
