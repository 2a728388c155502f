"""Fill a wheelhouse on the control node for hosts of one Python version and glibc: every wheel they install.

The python_env role runs this once per distinct requirement set for the whole play (on the control
node), then ships it as one tar (DIR.tar: one transfer, not one per file; wheels are compressed
already): hosts install with `--no-index` and need no network. Written atomically: the directory
(with its `.complete` stamp) and the tar appear complete or not at all.

Usage: python -m provision.ansible.wheelhouse --dest DIR --python 3.11 --glibc 2.36 [--no-deps]
       [--index-url URL] [--extra-index-url URL] -- REQUIREMENT...
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

STAMP = ".complete"


def platforms(glibc: str, machine: str) -> list[str]:
    """pip's --platform tags a host with this glibc accepts (manylinux_2_17 is the oldest in use)."""
    major, minor = (int(x) for x in glibc.split(".")[:2])
    tags = [f"manylinux_{major}_{m}_{machine}" for m in range(17, minor + 1)]
    return [*tags, f"manylinux2014_{machine}", f"linux_{machine}"]


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(line for line in proc.stderr.splitlines() if "is ignored" not in line)[-3000:]
        raise SystemExit(f"wheelhouse: pip {args[0]} failed:\n{tail}")


def fill(dest: Path, requirements: list[str], python: str, glibc: str, machine: str, deps: bool,
         indexes: list[str]) -> None:  # fmt: skip
    stamp = "\n".join([f"python {python} glibc {glibc} deps {deps}", *indexes, *requirements]) + "\n"
    if not ((dest / STAMP).is_file() and (dest / STAMP).read_text() == stamp):
        _download(dest, requirements, python, glibc, machine, deps, indexes, stamp)
    archive = dest.with_name(dest.name + ".tar")
    if not archive.is_file() or archive.stat().st_mtime < (dest / STAMP).stat().st_mtime:
        part = archive.with_name(archive.name + ".part")
        with tarfile.open(part, "w") as tar:
            tar.add(dest, arcname=dest.name)
        part.rename(archive)


def _download(dest: Path, requirements: list[str], python: str, glibc: str, machine: str, deps: bool,
              indexes: list[str], stamp: str) -> None:  # fmt: skip
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        # Source requirements (a git ref, a local tree) become wheels here: the hosts build nothing.
        source = [r for r in requirements if " @ " in r and not r.endswith(".whl")]
        binary = [r for r in requirements if r not in source]
        for req in source:
            _pip("wheel", "--no-deps", "--wheel-dir", str(part), *indexes, req)
        built = [str(p) for p in part.glob("*.whl")]
        target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
        for tag in platforms(glibc, machine):
            target += ["--platform", tag]
        _pip("download", "--dest", str(part), *target, *([] if deps else ["--no-deps"]), *indexes, *binary, *built)
        (part / STAMP).write_text(stamp)
        if dest.exists():
            shutil.rmtree(dest)
        part.rename(dest)
    finally:
        shutil.rmtree(part, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m provision.ansible.wheelhouse", description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, required=True)
    parser.add_argument("--python", required=True, help="the hosts' Python, like 3.11")
    parser.add_argument("--glibc", required=True, help="the hosts' glibc, like 2.36")
    parser.add_argument("--machine", default="x86_64")
    parser.add_argument("--no-deps", action="store_true")
    parser.add_argument("--index-url", default="")
    parser.add_argument("--extra-index-url", action="append", default=[])
    parser.add_argument("requirements", nargs="+")
    args = parser.parse_args(argv)
    indexes = [f"--index-url={args.index_url}"] if args.index_url else []
    indexes += [f"--extra-index-url={url}" for url in args.extra_index_url if url]
    fill(args.dest, args.requirements, args.python, args.glibc, args.machine, not args.no_deps, indexes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
