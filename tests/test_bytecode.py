"""Bytecode compiled once per play: files/compile_missing.py on its own, then two fresh b300 sandbox hosts applied
together, where one compiles each requirement set and the other unpacks what it compiled (roles/python_env,
tasks/install_set.yml). Needs what test_sandbox.py needs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.cli import main
from provision.sandbox import layout
from tests.conftest import ROOT
from tests.test_sandbox import pytestmark as sandbox_marks
from tests.test_stack import on

SCRIPT = ROOT / "roles" / "python_env" / "files" / "compile_missing.py"
VENV = "/opt/sglang-dflash/venv"
CHECKED_HASH = 3  # the pyc header's flags: hash-based, source checked


def _flags(pyc: Path) -> int:
    return int.from_bytes(pyc.read_bytes()[4:8], "little")


def test_compile_missing_compiles_what_has_no_bytecode_once(tmp_path: Path) -> None:
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    site = Path(subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())  # fmt: skip
    (site / "pkg" / "sub").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (site / "pkg" / "sub" / "mod.py").write_text("def f():\n    return 2\n")
    (site / "pkg" / "broken.py").write_text("def (:\n")  # does not compile: left without, as pip leaves it
    (site / "pkg" / "data.txt").write_text("not python\n")

    first = subprocess.run([python, SCRIPT], capture_output=True, text=True, check=True)
    written = sorted(first.stdout.split())
    # a venv without pip: the package's two compilable sources are all there is
    assert written == sorted(
        str((p.parent / "__pycache__" / f"{p.stem}.{sys.implementation.cache_tag}.pyc").relative_to(env))
        for p in (site / "pkg" / "__init__.py", site / "pkg" / "sub" / "mod.py")
    )
    for rel in written:
        assert _flags(env / rel) == CHECKED_HASH, rel
    assert not list((site / "pkg").glob("__pycache__/broken.*"))
    # nothing left to compile: a second run writes nothing
    assert subprocess.run([python, SCRIPT], capture_output=True, text=True, check=True).stdout == ""
    # the venv's Python uses the bytecode (python -v names the pyc, not the source)
    verbose = subprocess.run([python, "-v", "-c", "import pkg.sub.mod"], capture_output=True, text=True, check=True)
    assert f"code object from '{site / 'pkg' / 'sub' / '__pycache__'}" in verbose.stderr, verbose.stderr[-2000:]
    # a changed source makes its checked-hash bytecode invalid: Python compiles the source instead, never the stale
    (site / "pkg" / "sub" / "mod.py").write_text("def f():\n    return 3\n")
    out = subprocess.run([python, "-c", "import pkg.sub.mod as m; print(m.f())"], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip
    assert out.stdout.strip() == "3"


# What a host's venv holds, read by its own Python: each checked-hash pyc's SHA-1 (relative to the venv), the
# sources in site-packages without bytecode, and the pycs of any other kind.
READ = """
import hashlib, json, os, sys, sysconfig
from importlib.util import cache_from_source
found = {"checked": {}, "other": [], "missing": []}
for root in dict.fromkeys(sysconfig.get_path(n) for n in ("purelib", "platlib")):
    for d, _, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            if name.endswith(".pyc"):
                data = open(path, "rb").read()
                rel = os.path.relpath(path, sys.prefix)
                if int.from_bytes(data[4:8], "little") == 3:
                    found["checked"][rel] = hashlib.sha1(data).hexdigest()
                else:
                    found["other"].append(rel)
            elif name.endswith(".py") and not os.path.exists(cache_from_source(path)):
                found["missing"].append(os.path.relpath(path, sys.prefix))
print(json.dumps(found))
"""


def statuses(out: str, task: str) -> dict[str, str]:
    """Each host's status for one task, as `provision apply` prints it."""
    lines = out.splitlines()
    start = lines.index(f"  TASK {task}") + 1
    found = {}
    for line in lines[start:]:
        if not line.startswith("    ") or line.startswith("      "):
            break
        status, _, host = line.strip().partition(": ")
        found[host.split(" ")[0]] = status
    return found


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Iterator[tuple[str, dict[str, layout.SandboxHost]]]:
    """Two fresh b300 hosts applied together, with a control-node wheelhouse that holds the wheels (linked from the
    usual one where it has them) but no bytecode: the apply's output and the hosts."""
    wheels = tmp_path_factory.mktemp("wheelhouse")
    usual = Path.home() / ".cache" / "dflash-provision" / "wheels"
    for tar in usual.glob("*.tar") if usual.is_dir() else ():
        if not tar.name.endswith(".bytecode.tar"):
            os.link(tar, wheels / tar.name)
    assert main(["sandbox", "down"]) == 0
    assert main(["sandbox", "up", "--hosts", "b300:2"]) == 0
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "apply", "--host", "b300", "--sandbox", "--state-dir",
         str(tmp_path_factory.mktemp("runs")), "-e", f"python_env_wheelhouse={wheels}"],
        cwd=ROOT, capture_output=True, text=True, timeout=3000,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250"},  # a task name a line
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    yield proc.stdout, {h.name: h for h in layout.load_hosts()}
    main(["sandbox", "down"])


@sandbox_marks
@pytest.mark.parametrize("name", ["torch-triton", "flashinfer", "sglang"])
def test_one_host_compiles_each_set_and_the_other_unpacks_it(pair, name: str) -> None:
    out, hosts = pair
    kept = statuses(out, f"Keep on the control node, for the other hosts, the bytecode of {name}")
    unpacked = statuses(out, f"Unpack the bytecode compiled once for the play, of {name}")
    assert sorted(kept.values()) == ["changed", "skipped"], kept
    assert sorted(unpacked.values()) == ["changed", "skipped"], unpacked
    assert {h for h, s in kept.items() if s == "changed"} != {h for h, s in unpacked.items() if s == "changed"}
    assert set(kept) == set(unpacked) == set(hosts)


@sandbox_marks
def test_both_hosts_hold_the_same_complete_bytecode_and_python_uses_it(pair) -> None:
    out, hosts = pair
    found = {}
    for name, host in hosts.items():
        proc = on(host, f"{VENV}/bin/python -c {shlex.quote(READ)}")
        assert proc.returncode == 0, proc.stderr
        found[name] = json.loads(proc.stdout)
    first, second = found.values()
    # torch, Triton, FlashInfer, SGLang and their dependencies: thousands of modules, byte for byte the same
    assert len(first["checked"]) > 1000
    assert first["checked"] == second["checked"]
    # what is not checked-hash is what the venv came with (pip, from the host's ensurepip), never a set's
    assert all("/pip/" in rel or "/setuptools/" in rel or "_distutils_hack" in rel for rel in first["other"])
    # what has no bytecode is what does not compile, the same on both
    assert first["missing"] == second["missing"]
    # the host that unpacked loads from that bytecode: python -v names pycs, no source of the sets
    unpacker = next(h for h, s in statuses(out, "Unpack the bytecode compiled once for the play, of torch-triton")
                    .items() if s == "changed")  # fmt: skip
    proc = on(hosts[unpacker], f"{VENV}/bin/python -v -c 'import triton, jinja2' 2>&1")
    loaded = [line for line in proc.stdout.decode().splitlines() if line.startswith("# code object from")]
    assert any("/triton/__pycache__/" in line for line in loaded), loaded[:5]
    assert not [line for line in loaded if line.endswith(".py'") and "site-packages" in line], loaded
