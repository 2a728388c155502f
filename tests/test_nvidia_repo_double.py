"""cuda_toolkit's `nvidia_repo` method on a fresh sandbox host, against a TEST DOUBLE of NVIDIA's apt repository.

NVIDIA's repository is out of reach here; tests/doubles/nvidia_apt_repo.py builds one with its layout and names
from NVIDIA's PyPI toolkit wheels, signs it with a key made for the run and serves it on the sandbox bridge for
this module only. The role reaches it through its own variables (cuda_toolkit_repo_base_url as an extra var);
nothing in the role's defaults changes. What the double does not prove about NVIDIA's repository is in its
docstring. Only the `cuda` tag runs, on one b300 host, with `cuda.method=nvidia_repo`.

Needs what test_sandbox.py needs, and gpg (gnupg) and dpkg-deb on the control node.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.cli import main
from provision.sandbox import layout
from tests.doubles.nvidia_apt_repo import KEYRING, NvidiaAptRepoDouble
from tests.test_sandbox import pytestmark as sandbox_requirements
from tests.test_stack import DATA, nvcc_cubin, on, recap

pytestmark = [
    sandbox_requirements,
    pytest.mark.skipif(not all(shutil.which(t) for t in ("gpg", "dpkg-deb")), reason="needs gpg and dpkg-deb"),
]

PROVISION = str(Path(sys.executable).parent / "provision")
HOST = "b300-sbx"
SOURCE = "/etc/apt/sources.list.d/cuda.sources"
KEYRING_LIST = "/etc/apt/sources.list.d/cuda-debian12-x86_64.list"


@pytest.fixture(scope="module")
def host() -> Iterator[layout.SandboxHost]:
    # a fresh host of its own: what earlier modules left up is not fresh
    assert main(["sandbox", "down"]) == 0
    assert main(["sandbox", "up", "--hosts", "b300"]) == 0
    (found,) = layout.load_hosts()
    # the sandbox's apt proxy serves Debian only (port 80); the double is reached directly, as a site's
    # proxy configuration would exempt an internal mirror
    proc = on(found, f"echo 'Acquire::http::Proxy::{layout.GATEWAY} \"DIRECT\";' > /etc/apt/apt.conf.d/02double-direct")
    assert proc.returncode == 0, proc.stderr
    yield found
    assert main(["sandbox", "down"]) == 0


@pytest.fixture(scope="module")
def double(host: layout.SandboxHost, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NvidiaAptRepoDouble]:
    # on the bridge's address (it exists once the sandbox is up), for this module only
    repo = NvidiaAptRepoDouble(tmp_path_factory.mktemp("nvidia-repo-double"), layout.GATEWAY).start()
    yield repo
    repo.close()


@pytest.fixture(scope="module")
def apply(host: layout.SandboxHost, tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("runs")

    def _apply(version: str, base_url: str, *extra: str) -> tuple[int, str]:
        proc = subprocess.run(
            [PROVISION, "apply", "--host", "b300", "--sandbox", "--state-dir", str(state), "--tags", "cuda",
             "--set", "cuda.method=nvidia_repo", "--set", f"cuda.version={version}",
             "--set", f"sglang.torch_cuda={version}", "-e", f"cuda_toolkit_repo_base_url={base_url}", *extra],
            capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        return proc.returncode, proc.stdout + proc.stderr

    return _apply


def sh(host: layout.SandboxHost, script: str) -> str:
    proc = on(host, script)
    assert proc.returncode == 0, (script, proc.stdout.decode() + proc.stderr.decode())
    return proc.stdout.decode()


UNTOUCHED = (
    f"! dpkg -s g++ >/dev/null 2>&1 && ! dpkg -s cuda-keyring >/dev/null 2>&1 && test ! -e {SOURCE}"
    f" && test ! -e {KEYRING} && test ! -e /usr/local/cuda-12.9 && test ! -e /usr/local/cuda"
    " && ! update-alternatives --query cuda >/dev/null 2>&1"
)


def test_double_check_mode_on_a_fresh_host_changes_nothing(host, double, apply) -> None:
    rc, out = apply("12.9", double.base_url, "--check")
    assert rc == 0, out
    assert recap(out)[HOST][3] == 0
    assert "check mode: would update apt's lists and install cuda-keyring, cuda-toolkit-12-9" in out
    sh(host, UNTOUCHED)
    assert double.fetched("InRelease") == 0  # no apt-get update in a dry run


def test_double_unreachable_repository_fails_naming_the_url_before_touching_anything(host, double, apply) -> None:
    # nothing listens on the discard port of the bridge's address
    dead = f"http://{layout.GATEWAY}:9/compute/cuda/repos"
    rc, out = apply("12.9", dead)
    assert rc != 0
    assert f"cannot reach NVIDIA's repository: {dead}/debian12/x86_64/Release: " in out, out[-3000:]
    assert f"{dead}/debian12/x86_64/cuda-keyring_1.1-1_all.deb" in out
    # changed, unreachable, failed: the one change is the ownership guard's claim in provision's own manifest
    # (what apply is about to create, so that a run stopped halfway can be run again); the toolkit touched nothing
    assert recap(out)[HOST][1:] == (1, 0, 1)
    sh(host, UNTOUCHED)


def test_double_first_apply_installs_keyring_source_toolkit_and_pins_the_alternative(host, double, apply) -> None:
    before = double.fetched("InRelease")
    rc, out = apply("12.9", double.base_url)
    assert rc == 0, out[-4000:]
    assert recap(out)[HOST][1] > 0
    # one apt-get update: the source is new
    assert double.fetched("InRelease") - before == 1
    state = sh(
        host,
        "dpkg-query -W -f='${Package} ${Status}\\n' cuda-keyring cuda-toolkit-12-9 cuda-nvcc-12-9 cuda-cudart-dev-12-9;"
        f" cat {SOURCE}; test ! -e {KEYRING_LIST} && echo no-keyring-list; ls /etc/apt/sources.list.d/;"
        f" test -s {KEYRING} && echo keyring-present; readlink -f /usr/local/cuda;"
        " update-alternatives --query cuda | grep -E '^(Status|Value):'",
    )
    for package in ("cuda-keyring", "cuda-toolkit-12-9", "cuda-nvcc-12-9", "cuda-cudart-dev-12-9"):
        assert f"{package} install ok installed" in state
    assert f"URIs: {double.base_url}/debian12/x86_64/\n" in state
    assert f"Signed-By: {KEYRING}\n" in state and "Suites: /\n" in state
    assert "no-keyring-list" in state and "keyring-present" in state
    assert "Status: manual\nValue: /usr/local/cuda-12.9" in state
    assert "\n/usr/local/cuda-12.9\n" in state
    # the role's own check: nvcc reports 12.9 (the double's stand-in; its ptxas is NVIDIA's)
    assert "release 12.9, V12.9.86" in sh(host, "/usr/local/cuda/bin/nvcc --version")


def test_double_reapply_is_unchanged_and_does_not_update_apt(host, double, apply) -> None:
    before = double.fetched("InRelease"), len(double.requests)
    rc, out = apply("12.9", double.base_url)
    assert rc == 0, out[-4000:]
    assert recap(out)[HOST] == (recap(out)[HOST][0], 0, 0, 0)
    # not even the reachability check: everything is installed and the source is as wanted
    assert (double.fetched("InRelease"), len(double.requests)) == before


def test_double_12_9_ptxas_assembles_sm_103a(host, double) -> None:
    """The 12.9 packages carry NVIDIA's ptxas 12.9.86 (PyPI has no 12.x nvcc): it knows B300's target."""
    proc = on(
        host,
        "set -e; cat > /tmp/add.ptx; /usr/local/cuda-12.9/bin/ptxas -arch=sm_103a -o /tmp/add-129.cubin /tmp/add.ptx;"
        " /usr/local/cuda-12.9/bin/ptxas --version | grep release",
        stdin=(DATA / "add.ptx").read_bytes(),
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert "V12.9.86" in proc.stdout.decode()


def test_double_moving_to_13_0_installs_it_and_repins_without_removing_12_9(host, double, apply) -> None:
    before = double.fetched("InRelease")
    rc, out = apply("13.0", double.base_url)
    assert rc == 0, out[-4000:]
    assert recap(out)[HOST][1] > 0
    # the source did not change and apt's lists know cuda-toolkit-13-0: no apt-get update
    assert double.fetched("InRelease") == before
    state = sh(
        host,
        "dpkg-query -W -f='${Package} ${Status}\\n' cuda-toolkit-12-9 cuda-toolkit-13-0;"
        " update-alternatives --query cuda | grep -E '^(Status|Value|Alternative):'; readlink -f /usr/local/cuda;"
        " test -x /usr/local/cuda-12.9/bin/ptxas && echo 12.9-kept",
    )
    assert "cuda-toolkit-12-9 install ok installed" in state and "cuda-toolkit-13-0 install ok installed" in state
    assert "Status: manual\nValue: /usr/local/cuda-13.0" in state
    assert "Alternative: /usr/local/cuda-12.9" in state and "Alternative: /usr/local/cuda-13.0" in state
    assert "\n/usr/local/cuda-13.0\n" in state and "12.9-kept" in state
    rc, out = apply("13.0", double.base_url)
    assert rc == 0, out[-4000:]
    assert recap(out)[HOST][1] == 0
    assert double.fetched("InRelease") == before


@pytest.mark.parametrize("sm", ["sm_103a", "sm_120a"])
def test_double_nvcc_13_0_builds_blackwell_cubins(host, double, tmp_path: Path, sm: str) -> None:
    nvcc, listing = nvcc_cubin(host, sm, tmp_path, "/usr/local/cuda/bin/nvcc")
    assert nvcc == "/usr/local/cuda-13.0/bin/nvcc"
    assert f".{sm}.cubin" in listing


def test_double_a_changed_source_updates_apt_once(host, double, apply) -> None:
    """The same repository under another URL (a mirror): the source changes, so apt-get update runs, once."""
    mirror_root = double.root / "mirror"
    if not mirror_root.exists():
        mirror_root.symlink_to(".")
    mirror = double.base_url.replace("/compute/", "/mirror/compute/")
    before = sum(1 for r in double.requests if r.endswith("/mirror/compute/cuda/repos/debian12/x86_64/InRelease"))
    rc, out = apply("13.0", mirror)
    assert rc == 0, out[-4000:]
    assert recap(out)[HOST][1] >= 1
    after = sum(1 for r in double.requests if r.endswith("/mirror/compute/cuda/repos/debian12/x86_64/InRelease"))
    assert after - before == 1
    assert f"URIs: {mirror}/debian12/x86_64/\n" in sh(host, f"cat {SOURCE}")
