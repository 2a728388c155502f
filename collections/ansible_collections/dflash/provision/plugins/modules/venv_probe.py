#!/usr/bin/python
# One read-only look at everything the python_env, sglang and triton roles decide on, in one round trip.

from __future__ import annotations

import grp
import os
import platform
import pwd
import sys

from ansible.module_utils.basic import AnsibleModule

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
    description: Files whose SHA-1 to report (the roles' helper scripts), so unchanged ones are not copied.
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
user_entry:
  description: The account's "home:shell", empty when it does not exist (or none was asked for).
  type: str
  returned: always
dir_state:
  description: Path to "owner:group:mode" (like sglang:sglang:0750) of each given directory; empty for a missing one.
  type: dict
  returned: always
"""


def _dir_state(path):
    if not os.path.isdir(path):
        return ""
    info = os.stat(path)
    return f"{pwd.getpwuid(info.st_uid).pw_name}:{grp.getgrgid(info.st_gid).gr_name}:{info.st_mode & 0o7777:04o}"


def _user_entry(name):
    try:
        entry = pwd.getpwnam(name) if name else None
    except KeyError:
        entry = None
    return f"{entry.pw_dir}:{entry.pw_shell}" if entry else ""


def main():
    module = AnsibleModule(
        argument_spec={
            "venv": {"type": "path", "required": True},
            "packages": {"type": "list", "elements": "str", "default": []},
            "files": {"type": "list", "elements": "path", "default": []},
            "dirs": {"type": "list", "elements": "path", "default": []},
            "user": {"type": "str", "required": False},
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
    missing = []
    for name in module.params["packages"]:
        rc, out, _ = module.run_command(["dpkg-query", "-W", "-f=${Status}", name])
        if rc != 0 or "install ok installed" not in out:
            missing.append(name)
    module.exit_json(
        changed=False,
        python="{}.{}".format(*sys.version_info[:2]),
        glibc=os.confstr("CS_GNU_LIBC_VERSION").split()[-1],
        machine=platform.machine(),
        venv_exists=os.access(os.path.join(venv, "bin", "python3"), os.X_OK),
        stamps=stamps,
        missing_packages=missing,
        file_sha1={path: module.sha1(path) or "" for path in module.params["files"]},
        user_entry=_user_entry(module.params["user"]),
        dir_state={path: _dir_state(path) for path in module.params["dirs"]},
    )


if __name__ == "__main__":
    main()
