"""Bytecode compiled once per play: files/compile_missing.py on its own, then two fresh b300 sandbox hosts applied
together, where one compiles each requirement set and the other unpacks what it compiled (roles/python_env,
tasks/install_set.yml). Needs what test_sandbox.py needs."""

from __future__ import annotations

import contextlib
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


# Which of the sources named on stdin (relative to the venv) compile after all.
COMPILES = """
import json, os, sys
compiled = []
for rel in json.load(sys.stdin):
    path = os.path.join(sys.prefix, rel)
    try:
        compile(open(path, "rb").read(), path, "exec")
    except (SyntaxError, ValueError):
        continue
    compiled.append(rel)
print(json.dumps(compiled))
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


def wheelhouse(tmp_path_factory) -> Path:
    """A control-node wheelhouse that holds the wheels (linked from the usual one where it has them) but no
    bytecode."""
    wheels = tmp_path_factory.mktemp("wheelhouse")
    usual = Path.home() / ".cache" / "dflash-provision" / "wheels"
    for tar in usual.glob("*.tar") if usual.is_dir() else ():
        if not tar.name.endswith(".bytecode.tar"):
            os.link(tar, wheels / tar.name)
    return wheels


def apply(tmp_path_factory, wheels: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provision", "apply", "--host", "b300", "--sandbox", "--state-dir",
         str(tmp_path_factory.mktemp("runs")), "-e", f"python_env_wheelhouse={wheels}"],
        cwd=ROOT, capture_output=True, text=True, timeout=3000,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250"},  # a task name a line
    )  # fmt: skip


@contextlib.contextmanager
def two_fresh_hosts() -> Iterator[dict[str, layout.SandboxHost]]:
    """Two fresh b300 hosts, taken down afterwards whatever happened (a failed assert leaves none behind for the
    modules after this one)."""
    assert main(["sandbox", "down"]) == 0
    try:
        assert main(["sandbox", "up", "--hosts", "b300:2"]) == 0
        yield {h.name: h for h in layout.load_hosts()}
    finally:
        main(["sandbox", "down"])


def only_uncompilable_left(host: layout.SandboxHost, missing: list[str]) -> None:
    """What is left without bytecode is only what the venv's Python cannot compile (torch ships a 3.12-only file)."""
    proc = on(host, f"{VENV}/bin/python -c {shlex.quote(COMPILES)}", json.dumps(missing).encode())
    assert proc.returncode == 0 and json.loads(proc.stdout) == [], proc.stdout + proc.stderr


def venv_bytecode(host: layout.SandboxHost) -> dict:
    proc = on(host, f"{VENV}/bin/python -c {shlex.quote(READ)}")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Iterator[tuple[str, dict[str, layout.SandboxHost]]]:
    """Two fresh b300 hosts applied together, with no bytecode on the control node: the apply's output and the
    hosts."""
    wheels = wheelhouse(tmp_path_factory)
    with two_fresh_hosts() as hosts:
        proc = apply(tmp_path_factory, wheels)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        yield proc.stdout, hosts


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
    first, second = (venv_bytecode(host) for host in hosts.values())
    # torch, Triton, FlashInfer, SGLang and their dependencies: thousands of modules, byte for byte the same
    assert len(first["checked"]) > 1000
    assert first["checked"] == second["checked"]
    # what is not checked-hash is what the venv came with (pip, from the host's ensurepip), never a set's
    assert all("/pip/" in rel or "/setuptools/" in rel or "_distutils_hack" in rel for rel in first["other"])
    # what has no bytecode is what does not compile, the same on both
    assert first["missing"] == second["missing"]
    only_uncompilable_left(next(iter(hosts.values())), first["missing"])
    # the host that unpacked loads from that bytecode: python -v names pycs, no source of the sets
    unpacker = next(h for h, s in statuses(out, "Unpack the bytecode compiled once for the play, of torch-triton")
                    .items() if s == "changed")  # fmt: skip
    proc = on(hosts[unpacker], f"{VENV}/bin/python -v -c 'import triton, jinja2' 2>&1")
    loaded = [line for line in proc.stdout.decode().splitlines() if line.startswith("# code object from")]
    assert any("/triton/__pycache__/" in line for line in loaded), loaded[:5]
    assert not [line for line in loaded if line.endswith(".py'") and "site-packages" in line], loaded


@sandbox_marks
def test_one_host_asks_the_parser_for_both_and_both_remember_its_answer(pair) -> None:
    out, hosts = pair
    asked = statuses(out, "Ask the build's parser, on one host of those that agree")
    # the same venv and command on both: one asks, the other takes its answer
    assert sorted(asked.values()) == ["ok", "skipped"], asked
    assert set(asked) == set(hosts)
    remembered = {on(host, f"cat {VENV}/.dflash/sglang-argcheck").stdout for host in hosts.values()}
    assert len(remembered) == 1 and json.loads(remembered.pop())["args"], remembered


# The host Python's sitecustomize (Debian's, under /etc) gains an exit for a `python -c` in the service venv that a
# shell started: the install's compile_missing.py (ensurepip's `python -c` is started by Python). The original is
# kept in /root to put back. Prints the file changed.
BREAK_COMPILE = (
    "f=$(readlink -f \"$(python3 -c 'import sitecustomize; print(sitecustomize.__file__)')\")"
    ' && cp "$f" /root/sitecustomize.orig'
    " && printf '%s\\n' 'import os, sys'"
    f' \'if sys.prefix == "{VENV}" and sys.argv == ["-c"]'
    ' and open("/proc/%d/comm" % os.getppid()).read().strip() == "bash":\' \'    os._exit(3)\''
    ' >> "$f" && echo "$f"'
)


@sandbox_marks
def test_where_the_compiling_host_fails_the_other_compiles_everything_itself(tmp_path_factory) -> None:
    """The first host fails to compile after the play chose it to (its Python's sitecustomize ends the venv's
    `python -c`, which runs only compile_missing.py there): the other host finds no bytecode on the control node
    and compiles all of it itself, and its apply goes on to the end. Once the failure is gone, the next apply
    completes the first host: pip finds the set installed already, and the missing bytecode is still compiled."""
    wheels = wheelhouse(tmp_path_factory)
    with two_fresh_hosts() as hosts:
        first, second = sorted(hosts)  # play order: the inventory's
        refuse = on(hosts[first], BREAK_COMPILE)
        assert refuse.returncode == 0, refuse.stderr
        sitecustomize = refuse.stdout.decode().strip()
        proc = apply(tmp_path_factory, wheels)
        out = proc.stdout
        assert proc.returncode != 0, out[-3000:]
        assert statuses(out, "Install into the venv torch-triton")[first] == "failed", out[-3000:]
        assert statuses(out, "Unpack the bytecode compiled once for the play, of torch-triton") == {second: "skipped"}
        compiled = "Compile what is still without bytecode, and record what was installed, of torch-triton"
        assert statuses(out, compiled) == {second: "changed"}
        assert not list(wheels.glob("*.bytecode.tar*")), "nothing was fetched from the failed host"
        found = venv_bytecode(hosts[second])
        assert len(found["checked"]) > 1000
        only_uncompilable_left(hosts[second], found["missing"])
        assert on(hosts[second], "systemctl is-active sglang-dflash").stdout.strip() == b"active"

        assert on(hosts[first], f"cp /root/sitecustomize.orig {shlex.quote(sitecustomize)}").returncode == 0
        again = apply(tmp_path_factory, wheels)
        assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
        assert venv_bytecode(hosts[first])["missing"] == found["missing"]
