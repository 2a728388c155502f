"""The nvidia_driver role's behaviour, run through ansible-playbook against this machine in check mode.

Nothing here changes this machine: every run is `--check`, the install-off path is read-only, and
the install-on path refuses the control node before it reads or changes anything.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

BIN = Path(sys.executable).parent
PLAN = {
    "driver": {"branch": "R580", "min": "580.65.06", "reason": "CUDA 13.0 ships with R580 (>= 580.65.06)"},
    "gpu": {"arch": "10.3"},
}


def role_vars(plan: dict) -> dict:
    """The role parameters the playbooks pass from a host's plan."""
    driver = plan["driver"]
    return {"nvidia_driver_branch": driver["branch"], "nvidia_driver_min": driver["min"],
            "nvidia_driver_reason": driver["reason"], "nvidia_driver_arch": plan["gpu"]["arch"]}  # fmt: skip


PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:50 UTC 2025\n"
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)\n"


OS_FILES = {"Debian": "Debian-12.yml", "Ubuntu": "Ubuntu-24.04.yml"}  # the role's first_found vars files


def no_nvidia_smi_here() -> bool:
    return subprocess.run(["sh", "-c", "command -v nvidia-smi"], capture_output=True).returncode != 0


@pytest.fixture
def play(tmp_path: Path):
    """Run the role once against `localhost` (connection local) or another inventory, in check mode."""
    playbook = tmp_path / "nvidia_driver.yml"
    playbook.write_text(
        yaml.safe_dump([{"name": "Driver", "hosts": "all", "gather_facts": False, "roles": ["nvidia_driver"]}])
    )

    def _play(
        extra: dict | None = None,
        hosts: dict | None = None,
        plan: dict | None = None,
        check: bool = True,
        *args: str,
    ) -> tuple[int, str]:
        inventory = tmp_path / "hosts.yml"
        inventory.write_text(
            yaml.safe_dump(
                {
                    "all": {
                        "hosts": hosts or {"localhost": {"ansible_connection": "local"}},
                        # modules run under this interpreter (discovery finds a broken pyenv shim here)
                        "vars": {"ansible_python_interpreter": sys.executable},
                    }
                }
            )
        )
        extra_vars = {**role_vars(plan or PLAN), **(extra or {})}
        proc = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(inventory), *(["--check"] if check else []),
             "-e", json.dumps(extra_vars), *args, str(playbook)],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                 "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        )  # fmt: skip
        return proc.returncode, proc.stdout + proc.stderr

    return _play


def recap(out: str, host: str = "localhost") -> dict[str, int]:
    line = re.search(rf"^{re.escape(host)}\s+:\s+(.*)$", out, re.M)
    assert line, out
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", line.group(1))}


def test_install_off_without_nvidia_smi_reports_the_skip_and_changes_nothing(play) -> None:
    if not no_nvidia_smi_here():
        pytest.skip("this machine has nvidia-smi")
    rc, out = play()
    assert rc == 0, out
    assert "driver check skipped: nvidia-smi is not installed" in out
    assert "driver install off (nvidia_driver_install=false): cuda_toolkit checks the floor" in out
    assert recap(out)["changed"] == 0 and recap(out)["failed"] == 0


@pytest.mark.parametrize(
    ("proc_text", "arch", "passes"),
    [(PROPRIETARY, "10.3", False), (PROPRIETARY, "12.0", False), (OPEN, "10.3", True), (PROPRIETARY, "9.0", True)],
    ids=["proprietary-b300", "proprietary-rtx6000", "open-b300", "proprietary-hopper"],
)
def test_install_off_checks_the_loaded_kernel_module_flavor(
    play, tmp_path: Path, proc_text: str, arch: str, passes: bool
) -> None:
    """A stand-in for /proc/driver/nvidia/version: Blackwell must run the open kernel modules."""
    version = tmp_path / "version"
    version.write_text(proc_text)
    rc, out = play({"nvidia_driver_proc_version": str(version)}, plan={**PLAN, "gpu": {"arch": arch}})
    assert recap(out)["changed"] == 0
    if passes:
        assert rc == 0, out
        assert "kernel modules: " + ("open" if "Open" in proc_text else "proprietary") + " (580.65.06)" in out
    else:
        assert rc != 0
        assert "the loaded NVIDIA kernel module is the proprietary one" in out
        assert f"compute capability {arch} (Blackwell) is supported only on the open kernel modules" in out


@pytest.mark.parametrize(
    "hosts",
    [
        {"localhost": {"ansible_connection": "local"}},
        # ssh to a loopback address is the control node too (and port 9 is closed: nothing connects)
        {"gpu-test": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9}},
    ],
    ids=["localhost-local", "loopback-ssh"],
)
def test_install_on_refuses_the_control_node(play, hosts: dict) -> None:
    host = next(iter(hosts))
    rc, out = play({"nvidia_driver_install": True, "nvidia_driver_reboot": True}, hosts=hosts)
    assert rc != 0
    assert f"refusing to install an NVIDIA driver on {host}: it is the control node" in out
    assert "never gets a driver and is never rebooted" in out
    # refused before anything else ran: no probe, no repository, no packages, no reboot
    for task in ("Look at the driver", "Add NVIDIA's repository", "Install the driver packages", "Reboot"):
        assert f"TASK [nvidia_driver : {task}" not in out, out
    assert recap(out, host)["changed"] == 0


def test_syntax_check(play) -> None:
    rc, out = play(None, None, None, False, "--syntax-check")
    assert rc == 0, out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"nvidia_driver_branch": "abc"}, "value of nvidia_driver_branch must be one of: R570, R575, R580"),
        ({"nvidia_driver_kernel_modules": "closed"}, "nvidia_driver_kernel_modules must be one of: open, proprietary"),
        ({"nvidia_driver_reboot": "maybe"}, "argument 'nvidia_driver_reboot' is of type str and we were unable"),
        ({"nvidia_driver_reboot_timeout": "soon"}, "argument 'nvidia_driver_reboot_timeout' is of type str"),
        ({"nvidia_driver_version": "570.86.10"}, "nvidia_driver_version must be a driver version of branch R580"),
        ({"nvidia_driver_version": "580.1.1"}, "580.1.1 is below the driver floor 580.65.06"),
        ({"nvidia_driver_branch": "R570"}, "R570 is below the driver floor 580.65.06"),
        ({"nvidia_driver_kernel_modules": "proprietary"}, "10.3 (Blackwell) runs only on NVIDIA's open kernel modules"),
        ({"nvidia_driver_arch": "sm_103"}, "nvidia_driver_arch must be a compute capability like 10.3 or 12.0"),
    ],
    ids=[
        "branch", "flavor", "reboot", "timeout", "version-branch", "version-floor", "branch-floor",
        "blackwell-proprietary", "arch",
    ],
)  # fmt: skip
def test_bad_values_fail_with_a_clear_message(play, extra: dict, message: str) -> None:
    rc, out = play(extra)
    assert rc != 0
    assert message in " ".join(out.split()), out
    assert recap(out)["changed"] == 0


@pytest.mark.parametrize(
    ("distribution", "branch", "extra", "packages"),
    [
        ("Ubuntu", "R580", {}, ["nvidia-driver-pinning-580", "linux-headers-6.8.0-60-generic", "nvidia-open-580"]),
        ("Debian", "R580", {}, ["nvidia-driver-pinning-580", "linux-headers-6.8.0-60-generic", "nvidia-open-580"]),
        ("Ubuntu", "R595", {}, ["nvidia-driver-pinning-595", "linux-headers-6.8.0-60-generic", "nvidia-open"]),
        ("Ubuntu", "R580", {"nvidia_driver_version": "580.95.05", "nvidia_driver_kernel_headers": False},
         ["nvidia-driver-pinning-580.95.05", "nvidia-open-580"]),
        ("Debian", "580", {"nvidia_driver_kernel_modules": "proprietary", "nvidia_driver_apt_pin": False},
         ["linux-headers-6.8.0-60-generic", "cuda-drivers-580"]),
        ("Ubuntu", "R580", {"nvidia_driver_packages": ["nvidia-driver-580-open"], "nvidia_driver_apt_pin": False},
         ["linux-headers-6.8.0-60-generic", "nvidia-driver-580-open"]),
    ],
)  # fmt: skip
def test_package_names_per_distribution(
    tmp_path: Path, distribution: str, branch: str, extra: dict, packages: list[str]
) -> None:
    """The vars maps alone (no host): what the install would ask apt for."""
    role = ROOT / "roles" / "nvidia_driver"
    playbook = tmp_path / "names.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Names",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "vars_files": [
                        str(role / "defaults" / "main.yml"),
                        str(role / "vars" / "main.yml"),
                        str(role / "vars" / OS_FILES[distribution]),
                    ],
                    "tasks": [
                        {"ansible.builtin.debug": {"msg": "PACKAGES={{ nvidia_driver_all_packages | to_json }}"}}
                    ],
                }
            ]
        )
    )
    extra_vars = {
        **role_vars({**PLAN, "driver": {**PLAN["driver"], "branch": branch}}),
        "ansible_facts": {"distribution": distribution, "kernel": "6.8.0-60-generic"},
        **extra,
    }
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", json.dumps(extra_vars), str(playbook)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        # a host list (-i localhost,): provision itself, once imported in this process, allows YAML inventories only
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_INVENTORY_ENABLED": "host_list"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(r"PACKAGES=(\[.*?\])", proc.stdout)
    assert found, proc.stdout
    assert json.loads(found.group(1).replace('\\"', '"')) == packages
