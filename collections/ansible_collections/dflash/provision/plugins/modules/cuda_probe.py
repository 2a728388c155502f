#!/usr/bin/python
# One read-only look at everything the cuda_toolkit role decides on, in a single round trip.

from __future__ import annotations

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dflash.provision.plugins.module_utils.host import dpkg_installed, nvidia_smi, run

DOCUMENTATION = r"""
module: cuda_probe
short_description: Read what the cuda_toolkit role decides on, without changing anything
description:
  - Reports the GPU driver versions (or why there are none), which of the given packages are missing,
    what a pip-built toolkit prefix was built from, where the toolkit home points, the cuda alternative,
    and the release nvcc reports. Never changes the host; supports check mode.
options:
  packages:
    description: OS packages that must be installed.
    type: list
    elements: str
    default: []
  home:
    description: The toolkit home (a directory or a link).
    type: path
    required: true
  marker:
    description: File holding what a pip-built prefix was built from.
    type: path
    required: false
  repo_packages:
    description:
      - Packages from NVIDIA's repository (the keyring, the toolkit); which are missing, and which of the
        missing ones apt has no candidate for (its lists predate the source).
    type: list
    elements: str
    default: []
  source:
    description: An apt deb822 source file whose URIs to report.
    type: path
    required: false
author: dflash-provision developers
"""

EXAMPLES = r"""
- name: Probe the toolkit
  dflash.provision.cuda_probe:
    packages: [g++]
    home: /usr/local/cuda-13.0
    marker: /opt/dflash-provision/toolkits/cuda-13.0/.dflash-requirements
    repo_packages: [cuda-keyring, cuda-toolkit-13-0]
    source: /etc/apt/sources.list.d/cuda.sources
"""

RETURN = r"""
driver_versions:
  description: One driver version per GPU; empty when there is no driver.
  type: list
  returned: always
driver_missing_reason:
  description: Why no driver was read (empty when one was).
  type: str
  returned: always
missing_packages:
  description: The given packages that are not installed.
  type: list
  returned: always
repo_packages_missing:
  description: The given repo_packages that are not installed.
  type: list
  returned: always
repo_packages_unknown:
  description: The missing repo_packages apt has no candidate for.
  type: list
  returned: always
source_uris:
  description: The URIs of the source file, empty when it is absent.
  type: list
  returned: always
built_from:
  description: Content of the marker file, empty when absent.
  type: str
  returned: always
home_link:
  description: Where the home link points, empty when it is not a link (see home_is_dir).
  type: str
  returned: always
home_is_dir:
  description: Whether the home is a real directory (not a link).
  type: bool
  returned: always
alternative:
  description: The value of the cuda alternative, empty when there is none.
  type: str
  returned: always
alternatives:
  description: The registered cuda alternatives.
  type: list
  returned: always
nvcc_release:
  description: The release nvcc at the home reports (like 13.0), empty when there is no nvcc.
  type: str
  returned: always
"""


def _has_candidate(module, name):
    rc, out, _ = run(module, ["apt-cache", "policy", name])
    found = re.search(r"^\s*Candidate: (.*)$", out, re.M) if rc == 0 else None
    return bool(found) and found.group(1).strip() != "(none)"


def main():
    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "list", "elements": "str", "default": []},
            "home": {"type": "path", "required": True},
            "marker": {"type": "path", "required": False},
            "repo_packages": {"type": "list", "elements": "str", "default": []},
            "source": {"type": "path", "required": False},
        },
        supports_check_mode=True,
    )
    home, marker = module.params["home"], module.params["marker"]
    result = {"changed": False}

    installed, _, versions, error = nvidia_smi(module)
    reason = "" if versions else error if not installed else f"nvidia-smi failed: {error[:200]}"
    result.update(driver_versions=versions, driver_missing_reason=reason)

    result["missing_packages"] = [name for name in module.params["packages"] if not dpkg_installed(module, name)]
    repo_missing = [name for name in module.params["repo_packages"] if not dpkg_installed(module, name)]
    result["repo_packages_missing"] = repo_missing
    # apt-get update is needed only for what apt's lists do not know yet
    result["repo_packages_unknown"] = [name for name in repo_missing if not _has_candidate(module, name)]

    uris = []
    source = module.params["source"]
    if source and os.path.isfile(source):
        with open(source) as handle:
            for line in handle:
                if line.lower().startswith("uris:"):
                    uris.extend(line.split(":", 1)[1].split())
    result["source_uris"] = uris

    built_from = ""
    if marker and os.path.isfile(marker):
        with open(marker) as handle:
            built_from = handle.read()
    result["built_from"] = built_from

    result["home_link"] = os.readlink(home) if os.path.islink(home) else ""
    result["home_is_dir"] = os.path.isdir(home) and not os.path.islink(home)

    rc, out, _ = run(module, ["update-alternatives", "--query", "cuda"])
    value = re.search(r"^Value: (.*)$", out, re.M) if rc == 0 else None
    result["alternative"] = value.group(1).strip() if value else ""
    result["alternatives"] = re.findall(r"^Alternative: (.*)$", out, re.M) if rc == 0 else []

    release = ""
    nvcc = os.path.join(home, "bin", "nvcc")
    if os.access(nvcc, os.X_OK):
        rc, out, _ = run(module, [nvcc, "--version"])
        found = re.search(r"release (\d+\.\d+),", out) if rc == 0 else None
        release = found.group(1) if found else ""
    result["nvcc_release"] = release

    module.exit_json(**result)


if __name__ == "__main__":
    main()
