# Reads the probes share: commands that may be missing, dpkg's verdict on a package, and nvidia-smi's
# driver versions, each asked the same way by every probe.

from __future__ import annotations


def run(module, args):
    """module.run_command that answers (127, "", "not found") for a missing executable."""
    try:
        return module.run_command(args)
    except OSError:  # run_command raises for a missing executable on some versions
        return 127, "", "not found"


def dpkg_version(module, name):
    """The installed version of a package; empty when it is not installed."""
    rc, out, _ = run(module, ["dpkg-query", "-W", "-f=${Status}|${Version}", name])
    if rc != 0 or not out.startswith("install ok installed|"):
        return ""
    return out.split("|", 1)[1].strip()


def dpkg_installed(module, name):
    return dpkg_version(module, name) != ""


def nvidia_smi(module):
    """(installed, rc, driver versions one per GPU, error text) from nvidia-smi's driver query."""
    smi = module.get_bin_path("nvidia-smi")
    if smi is None:
        return False, 127, [], "nvidia-smi is not installed"
    rc, out, err = run(module, [smi, "--query-gpu=driver_version", "--format=csv,noheader"])
    versions = [line.strip() for line in out.splitlines() if line.strip()] if rc == 0 else []
    return True, rc, versions, "" if rc == 0 else " ".join([out.strip(), err.strip()]).strip()
