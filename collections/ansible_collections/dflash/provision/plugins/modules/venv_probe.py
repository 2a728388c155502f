#!/usr/bin/python
# One read-only look at everything the python_env, sglang, triton and sglang_service roles decide on,
# in one round trip.

from __future__ import annotations

import os
import platform
import pwd
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dflash.provision.plugins.module_utils.file_state import dir_state, file_state, path_state
from ansible_collections.dflash.provision.plugins.module_utils.host import dpkg_installed, run

DOCUMENTATION = r"""
module: venv_probe
short_description: Read a service virtualenv's state and the host's Python platform, without changing anything
description:
  - Reports the host Python's version, glibc and machine (what wheels it takes), whether the virtualenv
    exists, the stamps the roles left in its C(.dflash) directory (what each install was made from, the
    verdicts of checks), and which of the given OS packages are missing. Never changes the host.
options:
  venv:
    description: The virtualenv's directory.
    type: path
    required: true
  packages:
    description: OS packages that must be installed.
    type: list
    elements: str
    default: []
  files:
    description: >-
      Files whose SHA-1 and owner, group and mode to report (the roles' helper scripts, the unit, the
      records), so settled ones are not copied and drifted ones are.
    type: list
    elements: path
    default: []
  user:
    description: An account whose home and shell to report.
    type: str
    required: false
  dirs:
    description: Directories whose owner, group and mode to report, so settled ones are not touched.
    type: list
    elements: path
    default: []
  paths:
    description: Files or directories whose owner, group and mode to report (like a key file's 0600).
    type: list
    elements: path
    default: []
  units:
    description: systemd units whose active and enablement state to report.
    type: list
    elements: str
    default: []
  key_env:
    description: >-
      An environment file that must hold C(var)=the stripped content of C(key_file). Only whether it
      does is reported, never the key.
    type: dict
    required: false
    suboptions:
      key_file: {description: The secret's file., type: path, required: true}
      env_file: {description: The environment file that carries it., type: path, required: true}
      var: {description: The variable's name., type: str, required: true}
author: dflash-provision developers
"""

EXAMPLES = r"""
- name: Probe the service venv
  dflash.provision.venv_probe:
    venv: /opt/sglang-dflash/venv
    packages: [python3-venv]
"""

RETURN = r"""
python:
  description: The host Python's major.minor, like 3.11.
  type: str
  returned: always
glibc:
  description: The host's glibc version, like 2.36.
  type: str
  returned: always
machine:
  description: The host's machine, like x86_64.
  type: str
  returned: always
venv_exists:
  description: Whether the virtualenv's python3 exists.
  type: bool
  returned: always
stamps:
  description: Stamp name to content, from the virtualenv's .dflash directory.
  type: dict
  returned: always
missing_packages:
  description: The given packages that are not installed.
  type: list
  returned: always
file_sha1:
  description: Path to SHA-1 of each given file; empty for a missing one.
  type: dict
  returned: always
file_state:
  description: Path to "owner:group:mode" (like root:root:0644) of each given file; empty for a missing one.
  type: dict
  returned: always
user_entry:
  description: The account's "home:shell", empty when it does not exist (or none was asked for).
  type: str
  returned: always
dir_state:
  description: Path to "owner:group:mode" (like sglang:sglang:0750) of each given directory; empty for a missing one.
  type: dict
  returned: always
path_state:
  description: Path to "owner:group:mode" of each given path of any kind; empty for a missing one.
  type: dict
  returned: always
unit_state:
  description: Unit to "ActiveState:UnitFileState" (like active:enabled); empty where systemd has no answer.
  type: dict
  returned: always
systemd_version:
  description: The host's systemd version (systemctl --version), where units were asked about; else null.
  type: int
  returned: always
key_env_in_sync:
  description: Whether key_env's environment file holds its key file's secret (false when either is missing).
  type: bool
  returned: always
"""


def _user_entry(name):
    try:
        entry = pwd.getpwnam(name) if name else None
    except KeyError:
        entry = None
    return f"{entry.pw_dir}:{entry.pw_shell}" if entry else ""


def _unit_state(module, name):
    rc, out, _ = run(module, ["systemctl", "show", "-p", "ActiveState", "-p", "UnitFileState", "--value", name])
    values = out.split()
    return ":".join(values) if rc == 0 and len(values) == 2 else ""


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


def main():
    module = AnsibleModule(
        argument_spec={
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
                # paths and a name, not the secret: the module never reads the key into its result
                "no_log": False,
                "options": {
                    "key_file": {"type": "path", "required": True, "no_log": False},
                    "env_file": {"type": "path", "required": True},
                    "var": {"type": "str", "required": True},
                },
            },
        },
        supports_check_mode=True,
    )
    venv = module.params["venv"]
    stamps = {}
    stamp_dir = os.path.join(venv, ".dflash")
    if os.path.isdir(stamp_dir):
        for name in sorted(os.listdir(stamp_dir)):
            with open(os.path.join(stamp_dir, name)) as handle:
                stamps[name] = handle.read()
    missing = [name for name in module.params["packages"] if not dpkg_installed(module, name)]
    module.exit_json(
        changed=False,
        python="{}.{}".format(*sys.version_info[:2]),
        glibc=os.confstr("CS_GNU_LIBC_VERSION").split()[-1],
        machine=platform.machine(),
        venv_exists=os.access(os.path.join(venv, "bin", "python3"), os.X_OK),
        stamps=stamps,
        missing_packages=missing,
        file_sha1={path: module.sha1(path) or "" for path in module.params["files"]},
        file_state={path: file_state(path) for path in module.params["files"]},
        user_entry=_user_entry(module.params["user"]),
        dir_state={path: dir_state(path) for path in module.params["dirs"]},
        path_state={path: path_state(path) for path in module.params["paths"]},
        unit_state={name: _unit_state(module, name) for name in module.params["units"]},
        systemd_version=_systemd_version(module, module.params["units"]),
        key_env_in_sync=_key_env_in_sync(module.params["key_env"]),
    )


if __name__ == "__main__":
    main()
