#!/usr/bin/env python3
"""GPU smoke workload: the calls a real SGLang server makes, each run and its result checked.

Shipped to hosts and run with the service's own Python (torch and triton, stdlib otherwise; nothing from
`provision`), inside the service's sandbox or the seccomp harness. The parent stays stdlib-only and runs each
check in a subprocess of this script, so a check killed by the sandbox (SIGSYS) cannot hide the others.

  python3 gpu_smoke.py                 # every check; one JSON object on stdout; exit 0 only if all pass
  python3 gpu_smoke.py --check ipc     # one check, in this process
Exit codes: 0 all passed, 1 a check failed, 2 usage, 3 no GPU or no torch (the JSON says why).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

EXIT_NO_GPU = 3
# torch reads the allocator config once, at its first CUDA allocation: set before torch is imported
EXPANDABLE = "expandable_segments:True"
CHILD_WAIT_S = 180.0


class CheckFailed(Exception):
    """A check ran but its result was wrong."""


class ChildKilled(Exception):
    """A process the check spawned died by a signal (the sandbox's SIGSYS, say)."""

    def __init__(self, where: str, signum: int) -> None:
        super().__init__(f"{where} killed by {signal_name(signum)}")
        self.signum = signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# --- checks: each runs in its own process, returns a detail string or raises -------------------------------


def check_matmul() -> str:
    """Allocate on every GPU and multiply in bf16, against a float64 product of the same inputs on the CPU."""
    import torch

    details = []
    for dev in range(torch.cuda.device_count()):
        gen = torch.Generator().manual_seed(dev)
        a = torch.randn(512, 768, generator=gen).to(torch.bfloat16)
        b = torch.randn(768, 384, generator=gen).to(torch.bfloat16)
        ref = a.double() @ b.double()  # exact enough: the bf16 inputs are representable in float64
        # a 1 GiB block first: the allocator, not only a few pages, must work
        block = torch.empty(1 << 30, dtype=torch.uint8, device=f"cuda:{dev}")
        block.fill_(7)
        if int(block[-1].item()) != 7:
            raise CheckFailed(f"cuda:{dev}: a 1 GiB block did not keep its value")
        del block
        got = (a.to(f"cuda:{dev}") @ b.to(f"cuda:{dev}")).double().cpu()
        # bf16 output keeps 8 significant bits: 2^-7 of the largest value bounds a correct product's error
        err = float((got - ref).abs().max())
        bound = float(ref.abs().max()) * 2**-7
        if not err <= bound:
            raise CheckFailed(f"cuda:{dev}: bf16 matmul off by {err:.4g} (bound {bound:.4g})")
        details.append(f"cuda:{dev} {torch.cuda.get_device_name(dev)} max err {err:.3g} <= {bound:.3g}")
    return "; ".join(details)


def _triton_add_kernel() -> Any:
    # module globals, not locals: Triton resolves a kernel's names in its globals, not in a closure
    global triton, tl
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    return add_kernel


def check_triton() -> str:
    """JIT-compile a vector add (a fresh cache, so ptxas really runs) and run it on every GPU."""
    # a fresh cache dir: a kernel cached by an earlier run would skip the compile this check is about
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpu-smoke-triton-")
    import torch

    add_kernel = _triton_add_kernel()
    n = 98_437  # not a multiple of the block: the mask is exercised
    details = []
    for dev in range(torch.cuda.device_count()):
        x = torch.rand(n, device=f"cuda:{dev}")
        y = torch.rand(n, device=f"cuda:{dev}")
        out = torch.full_like(x, float("nan"))
        with torch.cuda.device(dev):
            add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        torch.cuda.synchronize(dev)
        if not torch.equal(out, x + y):
            bad = int((out != x + y).sum())
            raise CheckFailed(f"cuda:{dev}: Triton vector add wrong in {bad} of {n} elements")
        details.append(f"cuda:{dev} ok")
    return f"triton {triton.__version__}, vector add of {n}: " + ", ".join(details)


def _ipc_child(inbox: Any, outbox: Any) -> None:
    """Receive a CUDA tensor from the parent, read it, add 1 in place."""
    try:
        import torch

        t = inbox.get(timeout=CHILD_WAIT_S)
        total = float(t.sum().item())
        t.add_(1)
        torch.cuda.synchronize()
        outbox.put(("ok", total))
    except Exception as exc:  # the parent reports it: the child's stderr is not the check's
        outbox.put(("error", f"{type(exc).__name__}: {exc}".strip().splitlines()[-1]))


def _wait_child(pending: dict[str, Any], outbox: Any) -> Any:
    """The next message from the children still owing one ({name: process}); raises ChildKilled if one died by a
    signal first (a Queue.get alone would hang on a killed child)."""
    import queue

    deadline = time.monotonic() + CHILD_WAIT_S
    while time.monotonic() < deadline:
        try:
            return outbox.get(timeout=0.5)
        except queue.Empty:
            for name, proc in pending.items():
                if proc.exitcode is not None and proc.exitcode < 0:
                    raise ChildKilled(name, -proc.exitcode) from None
                if proc.exitcode is not None:
                    try:  # a child flushes its queue before it exits: a last look, then it owes nothing
                        return outbox.get(timeout=2)
                    except queue.Empty:
                        raise CheckFailed(f"{name} exited {proc.exitcode} without a result") from None
    raise CheckFailed(f"no result from {', '.join(pending)} in {CHILD_WAIT_S:.0f} s")


def _ipc(expandable: bool) -> str:
    if expandable:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    import torch
    import torch.multiprocessing as mp

    shape = (1024, 1024)
    t = torch.ones(shape, device="cuda:0")
    segments = torch.cuda.memory_snapshot()
    expandable_seen = any(s.get("is_expandable") for s in segments)
    if expandable_seen != expandable:
        raise CheckFailed(f"allocator expandable segments {expandable_seen}, wanted {expandable}")
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_ipc_child, args=(inbox, outbox), daemon=True)
    proc.start()
    try:
        inbox.put(t)
        status, value = _wait_child({"the receiving process": proc}, outbox)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    if status != "ok":
        raise CheckFailed(f"the receiving process failed: {value}")
    want = float(shape[0] * shape[1])
    if value != want:
        raise CheckFailed(f"the receiving process read sum {value}, wanted {want}")
    torch.cuda.synchronize()
    if not bool((t == 2).all()):
        raise CheckFailed("the receiving process's in-place add is not visible to the sender")
    mode = "expandable segments (pidfd_getfd)" if expandable else "legacy cudaIpc handles"
    return f"{mode}: child read sum {value:.0f} and its +1 reached the parent"


def check_ipc() -> str:
    """A CUDA tensor sent to a spawned process with expandable segments on: the receiver calls pidfd_getfd."""
    return _ipc(expandable=True)


def check_ipc_legacy() -> str:
    """The same without expandable segments: legacy cudaIpc handles, no file descriptor crosses."""
    return _ipc(expandable=False)


def _nccl_rank(rank: int, world: int, store: str, outbox: Any) -> None:
    try:
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(rank)
        dist.init_process_group(
            "nccl", init_method=f"file://{store}", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
        )
        x = torch.full((1 << 20,), float(rank + 1), device=f"cuda:{rank}")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        got = float(x[0].item()), float(x[-1].item())
        dist.destroy_process_group()
        outbox.put((rank, "ok", got))
    except Exception as exc:
        outbox.put((rank, "error", f"{type(exc).__name__}: {exc}".strip().splitlines()[-1]))


def check_nccl() -> str:
    """torch.distributed over NCCL, one spawned process per GPU, an all_reduce whose sum is checked."""
    import torch
    import torch.multiprocessing as mp

    world = torch.cuda.device_count()
    want = float(world * (world + 1) // 2)
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-nccl-") as tmp:
        procs = [
            ctx.Process(target=_nccl_rank, args=(r, world, os.path.join(tmp, "store"), outbox), daemon=True)
            for r in range(world)
        ]
        for p in procs:
            p.start()
        results: dict[int, tuple[str, Any]] = {}
        try:
            while len(results) < world:
                pending = {f"NCCL rank {r}": p for r, p in enumerate(procs) if r not in results}
                rank, status, value = _wait_child(pending, outbox)
                results[rank] = (status, value)
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    for rank in range(world):
        status, value = results[rank]
        if status != "ok":
            raise CheckFailed(f"NCCL rank {rank}: {value}")
        if value != (want, want):
            raise CheckFailed(f"NCCL rank {rank}: all_reduce gave {value}, wanted {want}")
    version = torch.cuda.nccl.version()  # a tuple in torch 2.x, an int before
    version_s = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return f"NCCL {version_s}, {world} rank(s): all_reduce sum {want:g} on each"


CHECKS: dict[str, Callable[[], str]] = {
    "matmul": check_matmul,
    "triton": check_triton,
    "ipc": check_ipc,
    "ipc_legacy": check_ipc_legacy,
    "nccl": check_nccl,
}


def probe() -> dict[str, Any]:
    """GPU count and versions; {"skip": reason} when there is nothing to run on."""
    try:
        import torch
    except Exception as exc:
        return {"skip": f"no torch: {type(exc).__name__}: {exc}", "gpus": 0}
    gpus = torch.cuda.device_count()
    info: dict[str, Any] = {"gpus": gpus, "torch": torch.__version__, "cuda": torch.version.cuda}
    if gpus == 0:
        info["skip"] = f"torch {torch.__version__} sees no GPU"
    return info


# --- the parent: stdlib only, one subprocess per check ------------------------------------------------------


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def run_child(args: list[str], timeout: float) -> tuple[dict[str, Any], str]:
    """This script with args, in a subprocess: (its JSON result or a status made from how it ended, stderr)."""
    start = time.monotonic()
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return {"ok": False, "status": "timeout", "detail": f"no result in {timeout:.0f} s"}, err
    seconds = round(time.monotonic() - start, 2)
    if proc.returncode < 0:
        name = signal_name(-proc.returncode)
        res = {"ok": False, "status": "killed", "signal": name, "detail": f"killed by {name}"}
    else:
        try:
            res = json.loads(_last_line(proc.stdout))
        except ValueError:
            res = {"ok": False, "status": "failed", "detail": _last_line(proc.stderr) or f"exit {proc.returncode}"}
        if not isinstance(res, dict):
            res = {"ok": False, "status": "failed", "detail": f"unexpected output {res!r}"}
    res["seconds"] = seconds
    return res, proc.stderr


def run_all(names: list[str], timeout: float) -> tuple[dict[str, Any], int]:
    info, err = run_child(["--probe"], timeout)
    if info.get("status") in ("killed", "timeout", "failed"):
        # torch's import itself did not survive: that is a failure, not a host without GPUs
        return {"checks": {}, "gpus": None, "ok": False, "probe": info, "probe_stderr": err[-2000:]}, 1
    info.pop("seconds", None)
    if "skip" in info:
        return {"checks": {}, "ok": False, "skipped": info.pop("skip"), **info}, EXIT_NO_GPU
    checks: dict[str, Any] = {}
    for name in names:
        res, err = run_child(["--check", name], timeout)
        if not res.get("ok"):
            res["stderr_tail"] = err[-1500:]
        checks[name] = res
    ok = all(c.get("ok") for c in checks.values())
    return {"checks": checks, "ok": ok, **info}, 0 if ok else 1


def run_one(name: str) -> int:
    """One check in this process: one JSON line on stdout."""
    start = time.monotonic()
    try:
        detail = CHECKS[name]()
        res: dict[str, Any] = {"ok": True, "status": "ok", "detail": detail}
    except ChildKilled as exc:
        res = {"ok": False, "status": "killed", "signal": signal_name(exc.signum), "detail": str(exc)}
    except Exception as exc:
        traceback.print_exc()
        res = {"ok": False, "status": "failed", "detail": _last_line(f"{type(exc).__name__}: {exc}")}
    res["seconds"] = round(time.monotonic() - start, 2)
    print(json.dumps(res), flush=True)
    return 0 if res["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", choices=sorted(CHECKS), help="run one check in this process")
    ap.add_argument("--only", action="append", choices=sorted(CHECKS), help="run these checks only (repeatable)")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per check (default 300)")
    ap.add_argument("--json-out", help="also write the JSON report here")
    args = ap.parse_args(argv)
    if args.probe:
        print(json.dumps(probe()), flush=True)
        return 0
    if args.check:
        return run_one(args.check)
    report, rc = run_all(args.only or list(CHECKS), args.timeout)
    text = json.dumps(report, indent=1)
    print(text, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
