#!/usr/bin/python
# One read-only look at everything the nvidia_driver role decides on, in a single round trip.

from __future__ import annotations

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dflash.provision.plugins.module_utils.host import dpkg_version, nvidia_smi, run

DOCUMENTATION = r"""
module: driver_probe
short_description: Read the NVIDIA driver that runs, the one the next boot loads, and its packages
description:
  - Reports what nvidia-smi says (or why it cannot), the loaded kernel module's version and flavor (open or
    proprietary), optionally the module on disk (C(modinfo nvidia), what the next boot loads) and the installed
    versions of the given packages. Never changes the host; supports check mode.
options:
  proc_version:
    description: Where the loaded kernel module reports its version and flavor.
    type: path
    default: /proc/driver/nvidia/version
  modinfo:
    description: Also read the kernel module on disk.
    type: bool
    default: false
  packages:
    description: Packages whose installed version to report.
    type: list
    elements: str
    default: []
author: dflash-provision developers
"""

EXAMPLES = r"""
- name: Probe the driver
  dflash.provision.driver_probe:
    modinfo: true
    packages: [nvidia-driver-pinning-580, nvidia-open-580]
"""

RETURN = r"""
smi_installed:
  description: Whether nvidia-smi could be run.
  type: bool
  returned: always
smi_ok:
  description: Whether nvidia-smi answered (exit 0).
  type: bool
  returned: always
smi_error:
  description: Its output when it failed (at most 300 characters), else empty.
  type: str
  returned: always
versions:
  description: One driver version per GPU; empty when nvidia-smi did not answer.
  type: list
  returned: always
loaded:
  description: Whether a kernel module is loaded (proc_version exists).
  type: bool
  returned: always
loaded_open:
  description: Whether the loaded module is the open one.
  type: bool
  returned: always
loaded_version:
  description: The loaded module's version, empty when none is loaded.
  type: str
  returned: always
disk_version:
  description: The version of the module on disk (modinfo), empty when not asked or absent.
  type: str
  returned: always
disk_open:
  description: Whether the module on disk is the open one (its license is Dual MIT/GPL).
  type: bool
  returned: always
packages:
  description: Package to installed version; empty for one not installed.
  type: dict
  returned: always
"""


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def main():
    module = AnsibleModule(
        argument_spec={
            "proc_version": {"type": "path", "default": "/proc/driver/nvidia/version"},
            "modinfo": {"type": "bool", "default": False},
            "packages": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    installed, rc, versions, error = nvidia_smi(module)
    proc_text = _read(module.params["proc_version"])
    loaded = re.search(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]+)", proc_text)
    modinfo_text = ""
    if module.params["modinfo"]:
        mrc, out, _ = run(module, ["modinfo", "nvidia"])
        modinfo_text = out if mrc == 0 else ""
    disk = re.search(r"(?m)^version:\s+(\S+)", modinfo_text)
    module.exit_json(
        changed=False,
        smi_installed=installed,
        smi_ok=installed and rc == 0,
        smi_error=error[:300],
        versions=versions,
        loaded=bool(proc_text) and os.path.exists(module.params["proc_version"]),
        loaded_open="Open Kernel Module" in proc_text,
        loaded_version=loaded.group(1) if loaded else "",
        disk_version=disk.group(1) if disk else "",
        disk_open="Dual MIT/GPL" in modinfo_text,
        packages={name: dpkg_version(module, name) for name in module.params["packages"]},
    )


if __name__ == "__main__":
    main()
