"""Compile every source in this Python's site-packages that has no bytecode yet, as checked-hash bytecode,
and print each bytecode file written, relative to sys.prefix (the venv), one per line.

Run by the venv's own Python after `pip install --no-compile`: it compiles what that install (or an earlier
one cut short) left without bytecode and nothing else, on every CPU the process may use (pip compiles on
one). Checked-hash bytecode records the source's hash, not its mtime, so Python uses it on any host where the
source is the same and ignores it where it is not. A source that does not compile is left without, as pip
leaves it.
"""

import multiprocessing
import os
import py_compile
import sys
import sysconfig
from concurrent.futures import ProcessPoolExecutor
from importlib.util import cache_from_source

MODE = py_compile.PycInvalidationMode.CHECKED_HASH
# enough to make compiling short on a many-core host, few enough to stay small beside a running server
MAX_WORKERS = 32


def missing() -> list[str]:
    found = []
    for root in dict.fromkeys(sysconfig.get_path(name) for name in ("purelib", "platlib")):
        for directory, _, files in os.walk(root):
            for name in files:
                source = os.path.join(directory, name)
                if name.endswith(".py") and not os.path.exists(cache_from_source(source)):
                    found.append(source)
    return found


def compile_one(source: str) -> str | None:
    try:
        return py_compile.compile(source, doraise=True, invalidation_mode=MODE)
    except (py_compile.PyCompileError, OSError):
        return None


def main() -> None:
    sources = missing()
    workers = min(len(os.sched_getaffinity(0)), MAX_WORKERS)
    if workers > 1 and len(sources) > 1:
        # fork: run with -c, this module cannot be imported again by a spawned or forkserver worker
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            written = list(pool.map(compile_one, sources, chunksize=64))
    else:
        written = [compile_one(source) for source in sources]
    for target in written:
        if target:
            print(os.path.relpath(target, sys.prefix))


if __name__ == "__main__":
    main()
