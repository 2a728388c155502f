# What the nvidia_driver role decides on: what nvidia-smi says (or why it cannot), the loaded kernel
# module's version and flavor, optionally the module on disk (what the next boot loads) and the installed
# versions of the driver packages. Read-only.

from __future__ import annotations

import os
import re

from ansible_collections.dflash.provision.plugins.module_utils.host import dpkg_versions, nvidia_smi, run

SPEC = {
    "proc_version": {"type": "path", "default": "/proc/driver/nvidia/version"},
    "modinfo": {"type": "bool", "default": False},
    "packages": {"type": "list", "elements": "str", "default": []},
    # linux-headers-<the running kernel> as well: the caller names packages before it knows the kernel
    "kernel_headers": {"type": "bool", "default": False},
}


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def collect(module, params):
    installed, rc, versions, error = nvidia_smi(module)
    proc_text = _read(params["proc_version"])
    loaded = re.search(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]+)", proc_text)
    modinfo_text = ""
    if params["modinfo"]:
        mrc, out, _ = run(module, ["modinfo", "nvidia"])
        modinfo_text = out if mrc == 0 else ""
    disk = re.search(r"(?m)^version:\s+(\S+)", modinfo_text)
    return {
        "smi_installed": installed,
        "smi_ok": installed and rc == 0,
        "smi_error": error[:300],
        "versions": versions,
        "loaded": bool(proc_text) and os.path.exists(params["proc_version"]),
        "loaded_open": "Open Kernel Module" in proc_text,
        "loaded_version": loaded.group(1) if loaded else "",
        "disk_version": disk.group(1) if disk else "",
        "disk_open": "Dual MIT/GPL" in modinfo_text,
        "packages": dpkg_versions(
            module, params["packages"] + (["linux-headers-" + os.uname().release] if params["kernel_headers"] else [])
        ),
    }
