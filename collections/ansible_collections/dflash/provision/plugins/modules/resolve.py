# The work happens in the action plugin of the same name, on the control node; this file documents it.

DOCUMENTATION = r"""
module: resolve
short_description: Resolve a host's SGLang DFlash deployment through provision's models
description:
  - Reads the host's C(dflash_<section>) variables, C(dflash_set) and C(dflash_cli_set), validates them with the
    pydantic models of the C(provision) package and sets the C(dflash_plan) fact, exactly what
    C(provision plan --host HOST --json) prints.
  - Runs on the control node and never connects to the host.
  - In a run C(provision apply) started, the host's plan is the one apply validated and recorded before the run
    (the run record's C(plans/HOST.json), named by the control node's C(DFLASH_APPLY_PLANS), which no inventory or
    variable can set), taken as it is unless the unit is rendered for another systemd than apply rendered it for.
    Apply names it only where no C(-e) reaches the play (an extra variable could change what the play resolves).
    The plans of a run that has ended (ansible-runner wrote its exit code in the record) are refused.
options:
  systemd_version:
    description:
      - The host's systemd version, as the play read it (C(ansible_facts.systemd.version)). The unit is rendered
        for it (directives older versions do not know are left out) unless C(provision apply --set
        service.systemd_version=N) says otherwise. Without it the plan assumes the inventory's
        C(service.systemd_version), else 255.
    type: int
    required: false
author: dflash-provision developers
"""

EXAMPLES = r"""
- name: Resolve the deployment
  dflash.provision.resolve:
"""

RETURN = r"""
ansible_facts:
  description: >-
    C(dflash_plan), the resolved plan (hardware, toolkit, driver floor, env, argv, unit); C(dflash_standin_src);
    and the deploy play's role parameters (C(sglang_service_unit), C(python_env_venv), ...), each the value of the
    plan that provision/ansible/role_vars.py names.
  returned: success
  type: dict
"""
