"""Runs SGLang's bench_serving for the sweep where it imports; sent to the host on ssh's stdin, so stdlib only.

    python3 - probe [--placeholder] < bench_driver.py
    python3 - run [--placeholder] --warmup N -- BENCH_SERVING_ARGS... < bench_driver.py

`run` is bench_serving's own code (sglang.benchmark.serving.cli_main) on its own arguments; the driver then
reads back the line that run appended to its --output-file. One thing is added: each measured request's
output tokens and its meta_info spec_accept_length (SGLang's completion_tokens / spec_verify_ct), kept by
wrapping bench_serving's request function, because its output file has only the server's accept length,
which is cumulative since boot. Warm-up requests (all finished before the measured run starts) are left out.

--placeholder: where torchvision cannot be imported (PyPI's builds need a CUDA torch, so a CPU-only host has
none), a placeholder module stands in for it. SGLang imports torchvision for multimodal configs only; the
text datasets a sweep uses never call it, and anything that did would raise. The report says so.

The last line of stdout is `DFLASH-BENCH {json}`: the version, the placeholders, and for `run` the output-file
line and the per-request figures.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import types
from collections.abc import Sequence
from typing import Any

MARKER = "DFLASH-BENCH "
PLACEHOLDER_NOTE = "torchvision: a placeholder (no CPU build within reach); bench_serving's text datasets never call it"


class _Placeholder:
    """Any attribute of the placeholder module: attribute access works, a call raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name} is a placeholder for torchvision (provision/sweep/bench_driver.py)")


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


class _TorchvisionPlaceholder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Sequence[str] | None, target: types.ModuleType | None = None) -> Any:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _PlaceholderModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        # transformers parses the version of any torchvision it finds
        module.__version__ = "0.0.0+placeholder"  # type: ignore[attr-defined]


def load_bench_serving(placeholder: bool) -> tuple[Any, list[str], str]:
    """sglang.benchmark.serving, the placeholders it needed, and SGLang's version."""
    used: list[str] = []
    if placeholder:
        try:
            import torchvision  # noqa: F401
        except Exception:  # noqa: BLE001 - missing, or its compiled ops fail to load against this torch
            sys.modules.pop("torchvision", None)
            sys.meta_path.insert(0, _TorchvisionPlaceholder())
            used.append(PLACEHOLDER_NOTE)
    import sglang.benchmark.serving as serving
    import sglang.version

    return serving, used, str(sglang.version.__version__)


def report(payload: dict[str, Any]) -> None:
    sys.stdout.flush()
    print("\n" + MARKER + json.dumps(payload), flush=True)


def run(argv: list[str], warmup: int, placeholder: bool) -> int:
    serving, used, version = load_bench_serving(placeholder)
    output_file = argv[argv.index("--output-file") + 1]
    backend = argv[argv.index("--backend") + 1]
    finished: list[Any] = []
    request = serving.ASYNC_REQUEST_FUNCS[backend]

    async def recorded(request_func_input: Any, pbar: Any = None) -> Any:  # bench_serving passes both by name
        output = await request(request_func_input=request_func_input, pbar=pbar)
        finished.append(output)
        return output

    serving.ASYNC_REQUEST_FUNCS[backend] = recorded
    sys.argv = ["sglang.bench_serving", *argv]
    serving.cli_main()
    with open(output_file) as handle:
        line = handle.read().splitlines()[-1]
    measured = finished[warmup:]
    requests = [[o.output_len, o.spec_accept_length] for o in measured if o.success]
    report({"version": version, "placeholders": used, "result": json.loads(line), "requests": requests})
    return 0


def main(args: list[str]) -> int:
    mode, rest = args[0], args[1:]
    placeholder = "--placeholder" in rest[: rest.index("--") if "--" in rest else len(rest)]
    if mode == "probe":
        _, used, version = load_bench_serving(placeholder)
        report({"version": version, "placeholders": used})
        return 0
    if mode == "run":
        warmup = int(rest[rest.index("--warmup") + 1])
        return run(rest[rest.index("--") + 1 :], warmup, placeholder)
    print(f"usage: bench_driver.py probe|run ...; got {mode!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
