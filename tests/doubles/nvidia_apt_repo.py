"""A TEST DOUBLE of NVIDIA's CUDA apt repository, not NVIDIA's repository.

It copies the layout and the names of https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/
so that the cuda_toolkit role's `nvidia_repo` method runs unchanged against it, with only
`cuda_toolkit_repo_base_url` pointing here:

- a flat repository (`suites: /`) at <base>/debian12/x86_64/ with Packages(.gz), Release, Release.gpg and
  InRelease, signed by a gpg key made for the test run;
- `cuda-keyring_1.1-1_all.deb`, installing that public key at /usr/share/keyrings/cuda-archive-keyring.gpg and,
  as NVIDIA's does, /etc/apt/sources.list.d/cuda-debian12-x86_64.list pointing at NVIDIA's real URL (the role
  must remove it: the sandbox hosts cannot reach NVIDIA, so a left-over list fails apt-get update);
- `cuda-toolkit-X-Y` (depends on the slim pair), `cuda-nvcc-X-Y`, `cuda-cudart-dev-X-Y` and `cuda-cudart-X-Y`
  for 12.9 and 13.0, installing to /usr/local/cuda-X.Y in NVIDIA's layout (bin, nvvm, targets/x86_64-linux,
  include and lib64 links). cuda-cudart-X-Y's postinst registers the `cuda` and `cuda-X` alternatives with
  priority XY, as NVIDIA's packages are understood to do.

The files are NVIDIA's own, from the PyPI wheels the `pip` method uses (compat.yml's requirements for 13.0;
for 12.9, which compat.yml gives none, nvidia-cuda-nvcc-cu12 and nvidia-cuda-runtime-cu12). Contents are kept
to what compiling a .cu needs: nvcc, cicc, ptxas, fatbinary, cudafe++, the crt and cudart headers, libcudart.

What it does NOT prove about NVIDIA's real repository:
- PyPI has no nvcc or cicc for CUDA 12.x: the double's 12.9 `bin/nvcc` is a stand-in that answers `--version`
  in nvcc's format and refuses to compile. Its ptxas (12.9.86), headers and libcudart are real.
- The real packages' names beyond these, their versions, dependencies (cuda-toolkit-X-Y pulls in gigabytes:
  libraries, Nsight, ...), maintainer scripts and alternative priorities are not reproduced; nor their size
  and install time.
- NVIDIA's signing key, its rotation (cuda-keyring versions), the real Release file's fields, the CDN's
  behaviour (redirects, HTTPS, mirrors, rate limits) and the repository's availability.
- Whether NVIDIA publishes these exact package versions for debian12 at any given time.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass, field
from email.utils import formatdate
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from provision.model.tables import compat

DISTRO = "debian12/x86_64"
NVIDIA_URL = "https://developer.download.nvidia.com/compute/cuda/repos"
KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dflash-provision"
# The wheels PyPI has for 12.9 (compat.yml names none: they lack nvcc and cicc).
WHEELS_12_9 = ["nvidia-cuda-nvcc-cu12==12.9.86", "nvidia-cuda-runtime-cu12==12.9.79"]
TOOLKIT_VERSIONS = {"12.9": "12.9.1", "13.0": "13.0.2"}
NVCC_12_9_STANDIN = """#!/bin/sh
# Test double of NVIDIA's repository (tests/doubles/nvidia_apt_repo.py): PyPI ships no nvcc for CUDA 12.x.
case "$1" in
--version|-V)
  printf '%s\\n' 'nvcc: NVIDIA (R) Cuda compiler driver' 'Copyright (c) 2005-2025 NVIDIA Corporation' \\
    'Cuda compilation tools, release 12.9, V12.9.86' 'Build cuda_12.9.r12.9/compiler.36037853_0'
  exit 0;;
esac
echo "nvcc 12.9 of the test double cannot compile: PyPI ships no nvcc or cicc for CUDA 12.x" >&2
exit 1
"""


def _requirements(version: str) -> list[str]:
    if version == "12.9":
        return WHEELS_12_9
    wheels = compat().toolkits[version].pip
    assert wheels is not None, f"compat.yml names no wheels for CUDA {version}"
    return list(wheels.requirements)


def wheels(version: str) -> Path:
    """The wheel set for a toolkit: the roles' own download when complete, else one download into the test cache."""
    requirements = _requirements(version)
    marker = "\n".join(requirements) + "\n"
    for place in (CACHE / "wheels" / f"cuda-{version}", CACHE / "nvidia-repo-double" / "wheels" / f"cuda-{version}"):
        if (place / ".complete").exists() and (place / ".complete").read_text() == marker:
            return place
    dest = CACHE / "nvidia-repo-double" / "wheels" / f"cuda-{version}"
    part = dest.with_name(dest.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(part), *requirements],
        check=True, timeout=900,
    )  # fmt: skip
    (part / ".complete").write_text(marker)
    shutil.rmtree(dest, ignore_errors=True)
    part.rename(dest)
    return dest


def _unpack(wheel_dir: Path, into: Path) -> None:
    for wheel in sorted(wheel_dir.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(into)


def _version_of(wheel_dir: Path, dist: str) -> str:
    found = next(wheel_dir.glob(f"{dist}-*.whl"))
    return found.name.split("-")[1]


def _copy(src: Path, dst: Path, mode: int | None = None, skip: tuple[str, ...] = ()) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*skip))
    else:
        shutil.copy2(src, dst)
    if mode is not None:
        dst.chmod(mode)


def _deb(
    out: Path, name: str, version: str, tree: Path, depends: list[str], arch: str = "amd64", **scripts: str
) -> None:
    control = tree / "DEBIAN"
    control.mkdir(parents=True, exist_ok=True)
    lines = [f"Package: {name}", f"Version: {version}", f"Architecture: {arch}", "Maintainer: dflash-provision tests",
             "Section: devel", "Priority: optional"]  # fmt: skip
    if depends:
        lines.append("Depends: " + ", ".join(depends))
    lines.append(f"Description: {name} (test double of NVIDIA's package, from NVIDIA's PyPI wheels)")
    (control / "control").write_text("\n".join(lines) + "\n")
    for script, body in scripts.items():
        (control / script).write_text("#!/bin/sh\nset -e\n" + body)
        (control / script).chmod(0o755)
    deb = out / f"{name}_{version}_{arch}.deb"
    # gzip -1: built once per machine, served on a local bridge; size matters less than time
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(tree), str(deb)],
        check=True,
        capture_output=True,
    )


def build_toolkit_debs(version: str, out: Path, work: Path) -> None:
    """cuda-cudart-X-Y, cuda-cudart-dev-X-Y, cuda-nvcc-X-Y and cuda-toolkit-X-Y for one version, into out."""
    dashed, prefix = version.replace(".", "-"), f"usr/local/cuda-{version}"
    wheel_dir = wheels(version)
    src = work / f"src-{version}"
    _unpack(wheel_dir, src)
    major = version.split(".")[0]
    if version == "12.9":
        nvcc_root, rt_root = src / "nvidia" / "cuda_nvcc", src / "nvidia" / "cuda_runtime"
        rt_version, nvcc_version = _version_of(wheel_dir, "nvidia_cuda_runtime_cu12"), "12.9.86"
    else:
        nvcc_root = rt_root = src / "nvidia" / f"cu{major}"
        rt_version, nvcc_version = (
            _version_of(wheel_dir, "nvidia_cuda_runtime"),
            _version_of(wheel_dir, "nvidia_cuda_nvcc"),
        )
    target = "targets/x86_64-linux"

    cudart = work / f"cuda-cudart-{dashed}"
    lib = cudart / prefix / target / "lib"
    so = next((rt_root / "lib").glob("libcudart.so.*"))
    _copy(so, lib / so.name)
    for link, to in (("include", f"{target}/include"), ("lib64", f"{target}/lib")):
        (cudart / prefix).mkdir(parents=True, exist_ok=True)
        os.symlink(to, cudart / prefix / link)
    priority = version.replace(".", "")
    _deb(
        out, f"cuda-cudart-{dashed}", f"{rt_version}-1", cudart, [],
        postinst=(
            f"update-alternatives --install /usr/local/cuda cuda /{prefix} {priority}\n"
            f"update-alternatives --install /usr/local/cuda-{major} cuda-{major} /{prefix} {priority}\n"
        ),
        prerm=(
            'if [ "$1" = remove ]; then\n'
            f"  update-alternatives --remove cuda /{prefix}\n"
            f"  update-alternatives --remove cuda-{major} /{prefix}\nfi\n"
        ),
    )  # fmt: skip

    dev = work / f"cuda-cudart-dev-{dashed}"
    dev_lib = dev / prefix / target / "lib"
    # 13.x: the crt headers share the wheels' include directory; they go with nvcc (one owner per file)
    _copy(rt_root / "include", dev / prefix / target / "include", skip=("crt",))
    for archive in ("libcudart_static.a", "libcudadevrt.a"):
        _copy(rt_root / "lib" / archive, dev_lib / archive)
    dev_lib.mkdir(parents=True, exist_ok=True)
    os.symlink(so.name, dev_lib / "libcudart.so")
    _deb(out, f"cuda-cudart-dev-{dashed}", f"{rt_version}-1", dev, [f"cuda-cudart-{dashed} (= {rt_version}-1)"])

    nvcc = work / f"cuda-nvcc-{dashed}"
    bin_dir = nvcc / prefix / "bin"
    if version == "12.9":
        (bin_dir).mkdir(parents=True, exist_ok=True)
        (bin_dir / "nvcc").write_text(NVCC_12_9_STANDIN)
        (bin_dir / "nvcc").chmod(0o755)
        _copy(nvcc_root / "bin" / "ptxas", bin_dir / "ptxas", 0o755)
        _copy(nvcc_root / "nvvm", nvcc / prefix / "nvvm")
        # the crt headers and nvPTXCompiler.h come with nvcc in 12.x
        _copy(nvcc_root / "include", nvcc / prefix / target / "include")
    else:
        for tool in ("nvcc", "ptxas", "fatbinary", "cudafe++", "bin2c"):
            _copy(nvcc_root / "bin" / tool, bin_dir / tool, 0o755)
        _copy(nvcc_root / "bin" / "nvcc.profile", bin_dir / "nvcc.profile", 0o644)
        _copy(nvcc_root / "bin" / "crt", bin_dir / "crt")
        _copy(nvcc_root / "nvvm" / "bin" / "cicc", nvcc / prefix / "nvvm" / "bin" / "cicc", 0o755)
        _copy(nvcc_root / "nvvm" / "libdevice", nvcc / prefix / "nvvm" / "libdevice")
        _copy(nvcc_root / "include" / "crt", nvcc / prefix / target / "include" / "crt")
    _deb(out, f"cuda-nvcc-{dashed}", f"{nvcc_version}-1", nvcc, [])

    meta = work / f"cuda-toolkit-{dashed}"
    meta.mkdir()
    _deb(out, f"cuda-toolkit-{dashed}", f"{TOOLKIT_VERSIONS[version]}-1", meta,
         [f"cuda-nvcc-{dashed} (>= {nvcc_version})", f"cuda-cudart-dev-{dashed} (>= {rt_version})"])  # fmt: skip


def toolkit_debs() -> Path:
    """The toolkit packages of both versions, built once per machine (keyed by this file and the wheels)."""
    key = hashlib.sha256(Path(__file__).read_bytes())
    for version in TOOLKIT_VERSIONS:
        key.update(" ".join(sorted(p.name for p in wheels(version).glob("*.whl"))).encode())
    dest = CACHE / "nvidia-repo-double" / f"debs-{key.hexdigest()[:12]}"
    if (dest / ".complete").exists():
        return dest
    part = dest.with_name(dest.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="nvidia-repo-double-") as work:
        for version in TOOLKIT_VERSIONS:
            build_toolkit_debs(version, part, Path(work))
    (part / ".complete").write_text("")
    shutil.rmtree(dest, ignore_errors=True)
    part.rename(dest)
    return dest


class Gpg:
    """A throwaway signing key in its own gpg home (short path: gpg-agent's socket lives there)."""

    def __init__(self) -> None:
        self.home = tempfile.mkdtemp(prefix="dbl-gpg-", dir="/tmp")
        self._gpg(
            "--quick-generate-key", "NVIDIA CUDA test double <cudatools@nvidia.invalid>", "rsa3072", "sign", "never"
        )
        listing = self._gpg("--with-colons", "--list-secret-keys").stdout
        self.fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))

    def _gpg(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["gpg", "--homedir", self.home, "--batch", "--pinentry-mode", "loopback", "--passphrase", "", *args],
            check=True, capture_output=True, text=True,
        )  # fmt: skip

    def export(self, dest: Path) -> None:
        self._gpg("--output", str(dest), "--export", self.fingerprint)

    def sign(self, release: Path) -> None:
        self._gpg("--local-user", self.fingerprint, "--clearsign", "--output", str(release.with_name("InRelease")),
                  str(release))  # fmt: skip
        self._gpg("--local-user", self.fingerprint, "--armor", "--detach-sign", "--output",
                  str(release.with_name("Release.gpg")), str(release))  # fmt: skip

    def close(self) -> None:
        subprocess.run(["gpgconf", "--homedir", self.home, "--kill", "all"], capture_output=True)
        shutil.rmtree(self.home, ignore_errors=True)


def _keyring_deb(out: Path, gpg: Gpg, work: Path) -> None:
    tree = work / "cuda-keyring"
    (tree / "usr/share/keyrings").mkdir(parents=True)
    gpg.export(tree / KEYRING.lstrip("/"))
    (tree / KEYRING.lstrip("/")).chmod(0o644)
    lists = tree / "etc/apt/sources.list.d"
    lists.mkdir(parents=True)
    # as NVIDIA's keyring does: a list of its own for the real repository
    (lists / f"cuda-{DISTRO.replace('/', '-')}.list").write_text(
        f"deb [signed-by={KEYRING}] {NVIDIA_URL}/{DISTRO}/ /\n"
    )
    _deb(out, "cuda-keyring", "1.1-1", tree, [], arch="all")


def _index(repo: Path) -> None:
    stanzas = []
    for deb in sorted(repo.glob("*.deb")):
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
        data = deb.read_bytes()
        sums = [
            f"{n}: {hashlib.new(a, data).hexdigest()}"
            for n, a in (("MD5sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256"))
        ]
        stanzas.append(control.rstrip("\n") + f"\nFilename: ./{deb.name}\nSize: {len(data)}\n" + "\n".join(sums) + "\n")
    packages = "\n".join(stanzas).encode()
    (repo / "Packages").write_bytes(packages)
    (repo / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    lines = ["Origin: NVIDIA (test double)", "Label: NVIDIA CUDA (test double)", "Architecture: x86_64",
             f"Date: {formatdate(usegmt=True)}"]  # fmt: skip
    for field_name, algo in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256"), ("SHA512", "sha512")):
        lines.append(f"{field_name}:")
        for name in ("Packages", "Packages.gz"):
            content = (repo / name).read_bytes()
            lines.append(f" {hashlib.new(algo, content).hexdigest()} {len(content)} {name}")
    (repo / "Release").write_text("\n".join(lines) + "\n")


@dataclass
class NvidiaAptRepoDouble:
    """The double, served over HTTP on `address` until close(); `requests` records every path asked for."""

    root: Path
    address: str
    requests: list[str] = field(default_factory=list)
    _gpg: Gpg | None = None
    _server: ThreadingHTTPServer | None = None

    def start(self) -> NvidiaAptRepoDouble:
        repo = self.root / "compute" / "cuda" / "repos" / DISTRO
        repo.mkdir(parents=True)
        for deb in toolkit_debs().glob("*.deb"):
            os.link(deb, repo / deb.name) if deb.stat().st_dev == repo.stat().st_dev else shutil.copy2(deb, repo)
        self._gpg = Gpg()
        with tempfile.TemporaryDirectory(prefix="nvidia-repo-double-") as work:
            _keyring_deb(repo, self._gpg, Path(work))
        _index(repo)
        self._gpg.sign(repo / "Release")
        seen, lock = self.requests, threading.Lock()

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
                with lock:
                    seen.append(f"{self.command} {self.path}")

        self._server = ThreadingHTTPServer((self.address, 0), partial(Handler, directory=str(self.root)))
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def base_url(self) -> str:
        """The value for cuda_toolkit_repo_base_url (NVIDIA's: .../compute/cuda/repos)."""
        assert self._server is not None
        return f"http://{self.address}:{self._server.server_address[1]}/compute/cuda/repos"

    def fetched(self, name: str) -> int:
        """How many GET requests asked for a file of the repository (InRelease: one per apt-get update)."""
        return sum(1 for r in list(self.requests) if r == f"GET /compute/cuda/repos/{DISTRO}/{name}")

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._gpg is not None:
            self._gpg.close()
