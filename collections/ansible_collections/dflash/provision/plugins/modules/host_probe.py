#!/usr/bin/python
# One read-only look at everything the roles decide on, in one round trip per host: a settled host is
# known settled from this call alone, and each role whose part is converged is skipped at once.

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.dflash.provision.plugins.module_utils import (
    ownership,
    probe_cuda,
    probe_driver,
    probe_models,
    probe_venv,
)
from ansible_collections.dflash.provision.plugins.module_utils.host import dpkg_versions

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
  - Never changes the host; supports check mode.
options:
  checks:
    description: Name (a role's) to a dict with C(probe) (driver, cuda, venv, models or ownership) and C(args).
    type: dict
    required: true
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
found:
  description: Check name to its findings (the keys each probe kind reports; see the role that reads them).
  type: dict
  returned: always
"""

PROBES = {
    "driver": probe_driver,
    "cuda": probe_cuda,
    "venv": probe_venv,
    "models": probe_models,
    "ownership": ownership,
}


def main():
    module = AnsibleModule(argument_spec={"checks": {"type": "dict", "required": True}}, supports_check_mode=True)
    checks = {}
    for name, check in module.params["checks"].items():
        kind = check.get("probe") if isinstance(check, dict) else None
        if kind not in PROBES:
            module.fail_json(msg=f"check {name}: probe must be one of {', '.join(sorted(PROBES))}, got {kind!r}")
        validated = ArgumentSpecValidator(PROBES[kind].SPEC).validate(dict(check.get("args") or {}))
        if validated.error_messages:
            module.fail_json(msg=f"check {name} ({kind}): " + "; ".join(validated.error_messages))
        checks[name] = (PROBES[kind], validated.validated_parameters)
    # every check's packages in one dpkg-query call
    dpkg_versions(
        module,
        [
            name
            for _, params in checks.values()
            for key in ("packages", "repo_packages")
            for name in params.get(key) or []
        ],
    )
    # the guard first: a host apply would take over fails before anything else is read
    ordered = sorted(checks.items(), key=lambda item: item[1][0] is not ownership)
    module.exit_json(changed=False, found={name: probe.collect(module, params) for name, (probe, params) in ordered})


if __name__ == "__main__":
    main()
