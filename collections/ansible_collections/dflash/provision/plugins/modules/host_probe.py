#!/usr/bin/python
# One read-only look at everything the roles decide on, in one round trip per host: a settled host is
# known settled from this call alone, and each role whose part is converged is skipped at once.

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dflash.provision.plugins.module_utils.look import SPEC, look

DOCUMENTATION = r"""
module: host_probe
short_description: Read the whole state the roles converge, in one call, without changing anything
description:
  - Runs every named check in one module call and returns each one's findings under its name. A check is
    one kind of read (C(probe)) with its own options (C(args)), validated as a module validates its own.
  - C(driver) reads nvidia-smi, the loaded kernel module and (C(modinfo)) the one on disk, and driver
    package versions. C(cuda) reads the driver versions, build packages, NVIDIA's repository packages and
    source file, a pip-built prefix's marker, the toolkit home, the cuda alternative and nvcc's release.
    C(venv) reads the host Python's platform, a virtualenv's stamps, packages, managed files (SHA-1 and
    owner:group:mode), directories, paths, an account, units (active and enabled) and whether a key's
    environment file holds the key (never the key). C(models) reads model directories (config, index, every
    shard's header, sizes, who can read them) against a copy source's manifest. C(ownership) is the
    ownership guard's check (see M(dflash.provision.ownership)); a host where apply would take over anything
    it did not create fails, naming each.
  - The action plugin reads the C(models) checks' C(copy_sources) on the control node first, in process, and
    passes their manifests as C(sources); their findings come back as C(source_models).
  - With I(gather_subset), the action runs the same look as M(dflash.provision.host_probe_facts), which also
    gathers the host's facts as M(ansible.builtin.setup) does and returns them as C(ansible_facts): the play
    reaches the host once. Without it, the module ships without setup's collectors (a fifth of the look's time).
  - Never changes the host; supports check mode.
options:
  checks:
    description: Name (a role's) to a dict with C(probe) (driver, cuda, venv, models or ownership) and C(args).
    type: dict
    required: true
  gather_subset:
    description: >-
      The facts to gather as well, as setup's I(gather_subset) names them; none when empty.
    type: list
    elements: str
    default: []
author: dflash-provision developers
"""

EXAMPLES = r"""
- name: Look at the toolkit and the service venv at once
  dflash.provision.host_probe:
    checks:
      cuda_toolkit:
        probe: cuda
        args: {home: /usr/local/cuda-13.0, packages: [g++]}
      triton:
        probe: venv
        args: {venv: /opt/sglang-dflash/venv, files: [/usr/local/libexec/dflash-provision/triton_aot.py]}
  register: dflash_host_probe
"""

RETURN = r"""
ansible_facts:
  description: The facts of I(gather_subset), as setup returns them.
  type: dict
  returned: when gather_subset is given
found:
  description: Check name to its findings (the keys each probe kind reports; see the role that reads them).
  type: dict
  returned: always
"""


def main():
    module = AnsibleModule(
        argument_spec={**SPEC, "gather_subset": {"type": "list", "elements": "str", "default": []}},
        supports_check_mode=True,
    )
    if module.params["gather_subset"]:  # the action sends these to host_probe_facts; never ignored
        module.fail_json(msg="gather_subset: the facts come from dflash.provision.host_probe_facts")
    module.exit_json(changed=False, found=look(module))


if __name__ == "__main__":
    main()
