# The one look: every named check, each validated by its own probe's spec, in one module call. Shared by
# host_probe and host_probe_facts (the same look with setup's facts), which differ only in what they import.

from __future__ import annotations

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.dflash.provision.plugins.module_utils import (
    ownership,
    probe_cuda,
    probe_driver,
    probe_models,
    probe_venv,
)
from ansible_collections.dflash.provision.plugins.module_utils.host import dpkg_versions

PROBES = {
    "driver": probe_driver,
    "cuda": probe_cuda,
    "venv": probe_venv,
    "models": probe_models,
    "ownership": ownership,
}
SPEC = {"checks": {"type": "dict", "required": True}}


def look(module):
    """Each check's findings under its name; a check with bad arguments fails the module, naming it."""
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
    return {name: probe.collect(module, params) for name, (probe, params) in ordered}
