# What the python_env, triton, sglang, flashinfer and sglang_service roles decide on: the host Python's
# platform (what wheels it takes), the virtualenv, the distributions installed in it and the stamps the
# roles left in it (what each install and check was made from), OS packages, managed files and
# directories, an account, units and a key's environment file. Read-only.

from __future__ import annotations

import glob
import os
import platform
import pwd
import re
import sys

from ansible_collections.dflash.provision.plugins.module_utils.file_state import report
from ansible_collections.dflash.provision.plugins.module_utils.host import missing, run

SPEC = {
    "venv": {"type": "path", "required": True},
    "packages": {"type": "list", "elements": "str", "default": []},
    "files": {"type": "list", "elements": "path", "default": []},
    "dirs": {"type": "list", "elements": "path", "default": []},
    "user": {"type": "str", "required": False},
    "paths": {"type": "list", "elements": "path", "default": []},
    "units": {"type": "list", "elements": "str", "default": []},
    "key_env": {
        "type": "dict",
        "required": False,
        # paths and a name, not the secret: the probe never reads the key into its result
        "no_log": False,
        "options": {
            "key_file": {"type": "path", "required": True, "no_log": False},
            "env_file": {"type": "path", "required": True},
            "var": {"type": "str", "required": True},
        },
    },
}


def _user_entry(name):
    try:
        entry = pwd.getpwnam(name) if name else None
    except KeyError:
        entry = None
    return f"{entry.pw_dir}:{entry.pw_shell}" if entry else ""


def _unit_states(module, names):
    """Each unit's "ActiveState:UnitFileState", in one systemctl call; empty where systemd has no answer."""
    states = {name: "" for name in names}
    if not names:
        return states
    rc, out, _ = run(
        module, ["systemctl", "show", "-p", "Id", "-p", "ActiveState", "-p", "UnitFileState", "--", *names]
    )
    if rc != 0:
        return states
    # one block of KEY=value lines per unit, in the order asked, blank lines between
    blocks = [
        dict(line.split("=", 1) for line in block.splitlines() if "=" in line) for block in out.strip().split("\n\n")
    ]
    for name, props in zip(names, blocks, strict=False):
        if props.get("ActiveState") and props.get("UnitFileState"):
            states[name] = "{}:{}".format(props["ActiveState"], props["UnitFileState"])
    return states


def _systemd_version(module, units):
    """The host's systemd (the unit is rendered for it), asked only where units are asked about."""
    if not units:
        return None
    rc, out, _ = run(module, ["systemctl", "--version"])
    words = out.split()
    return int(words[1]) if rc == 0 and len(words) > 1 and words[1].isdigit() else None


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def _key_env_in_sync(spec):
    if not spec:
        return False
    key, env = _read(spec["key_file"]), _read(spec["env_file"])
    return key is not None and env == "{}={}\n".format(spec["var"], key.strip())


def _stamps(venv):
    stamps = {}
    stamp_dir = os.path.join(venv, ".dflash")
    if os.path.isdir(stamp_dir):
        for name in sorted(os.listdir(stamp_dir)):
            with open(os.path.join(stamp_dir, name)) as handle:
                stamps[name] = handle.read()
    return stamps


def _installed(venv):
    """Each distribution installed in the venv (PEP 503 name to version), from its .dist-info directory's name."""
    found = {}
    for site in glob.glob(os.path.join(venv, "lib", "python*", "site-packages")):
        for entry in os.listdir(site):
            if entry.endswith(".dist-info") and "-" in entry:
                name, version = entry[: -len(".dist-info")].rsplit("-", 1)
                found[re.sub(r"[-_.]+", "-", name).lower()] = version
    return found


def collect(module, params):
    venv = params["venv"]
    return {
        "python": "{}.{}".format(*sys.version_info[:2]),
        "glibc": os.confstr("CS_GNU_LIBC_VERSION").split()[-1],
        "machine": platform.machine(),
        "venv_exists": os.access(os.path.join(venv, "bin", "python3"), os.X_OK),
        "stamps": _stamps(venv),
        # what is installed now, not what the last install recorded: a removed or replaced package is drift
        "installed": _installed(venv),
        "missing_packages": missing(module, params["packages"]),
        "user_entry": _user_entry(params["user"]),
        "unit_state": _unit_states(module, params["units"]),
        "systemd_version": _systemd_version(module, params["units"]),
        "key_env_in_sync": _key_env_in_sync(params["key_env"]),
        **report(files=params["files"], dirs=params["dirs"], paths=params["paths"]),
    }
