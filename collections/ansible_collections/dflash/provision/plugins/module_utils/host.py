# Reads the probes share: commands that may be missing, dpkg's verdict on a package, and nvidia-smi's
# driver versions, each asked the same way by every probe.

from __future__ import annotations


def run(module, args):
    """module.run_command that answers (127, "", "not found") for a missing executable."""
    try:
        return module.run_command(args)
    except OSError:  # run_command raises for a missing executable on some versions
        return 127, "", "not found"


# what dpkg said of each package in this module run: the host probe asks once for every check's packages
_DPKG = {}


def dpkg_versions(module, names):
    """The installed version of each package (empty when it is not installed), in one dpkg-query call."""
    ask = sorted({name for name in names if name not in _DPKG})
    if ask:
        # unknown names make dpkg-query exit 1 but it still reports the known ones
        _, out, _ = run(module, ["dpkg-query", "-W", "-f=${Package}|${Status}|${Version}\n", *ask])
        found = {}
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[1] == "install ok installed":
                found[parts[0]] = parts[2].strip()
        _DPKG.update({name: found.get(name, "") for name in ask})
    return {name: _DPKG[name] for name in names}


def missing(module, names):
    """The given packages that are not installed, in their order."""
    versions = dpkg_versions(module, names)
    return [name for name in names if not versions[name]]


def nvidia_smi(module):
    """(installed, rc, driver versions one per GPU, error text) from nvidia-smi's driver query."""
    smi = module.get_bin_path("nvidia-smi")
    if smi is None:
        return False, 127, [], "nvidia-smi is not installed"
    rc, out, err = run(module, [smi, "--query-gpu=driver_version", "--format=csv,noheader"])
    versions = [line.strip() for line in out.splitlines() if line.strip()] if rc == 0 else []
    return True, rc, versions, "" if rc == 0 else " ".join([out.strip(), err.strip()]).strip()
