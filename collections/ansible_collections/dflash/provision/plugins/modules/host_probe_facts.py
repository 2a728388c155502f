#!/usr/bin/python
# The one look of dflash.provision.host_probe and the host's facts in the same module call, so that the play
# reaches a host once: setup's collectors cost their import and shipping, which the roles' own looks skip.

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.facts import ansible_collector, default_collectors
from ansible.module_utils.facts.collector import CollectorNotFoundError, CycleFoundInFactDeps, UnresolvedFactDep
from ansible.module_utils.facts.namespace import PrefixFactNamespace
from ansible_collections.dflash.provision.plugins.module_utils.look import SPEC, look

DOCUMENTATION = r"""
module: host_probe_facts
short_description: The host probe's look and setup's facts in one call, without changing anything
description:
  - What the action of M(dflash.provision.host_probe) runs when given I(gather_subset): the same checks, and
    the facts of I(gather_subset) gathered with setup's own collectors and minimal subset, returned as
    C(ansible_facts) as M(ansible.builtin.setup) returns them.
  - Never changes the host; supports check mode.
options:
  checks:
    description: As M(dflash.provision.host_probe)'s.
    type: dict
    required: true
  gather_subset:
    description: The facts to gather, as setup's I(gather_subset) names them.
    type: list
    elements: str
    required: true
author: dflash-provision developers
"""

EXAMPLES = r"""
- name: Look at the host and gather the facts the roles read
  dflash.provision.host_probe:
    checks: "{{ dflash_host_checks }}"
    gather_subset: [min, systemd]
  register: dflash_host_probe
"""

RETURN = r"""
ansible_facts:
  description: The facts of I(gather_subset), as setup returns them.
  type: dict
  returned: always
found:
  description: As M(dflash.provision.host_probe)'s.
  type: dict
  returned: always
"""

# setup's own: what a subset gathers besides the named ones (ansible/modules/setup.py, minimal_gather_subset);
# tests/test_host_probe.py compares these facts with setup's
MINIMAL_GATHER_SUBSET = frozenset(
    ["apparmor", "caps", "cmdline", "date_time", "distribution", "dns", "env", "fips", "local", "lsb", "pkg_mgr"]
    + ["platform", "python", "selinux", "service_mgr", "ssh_pub_keys", "user"]
)


def main():
    module = AnsibleModule(
        argument_spec={**SPEC, "gather_subset": {"type": "list", "elements": "str", "required": True}},
        supports_check_mode=True,
    )
    try:
        collector = ansible_collector.get_ansible_collector(
            all_collector_classes=default_collectors.collectors,
            namespace=PrefixFactNamespace(namespace_name="ansible", prefix="ansible_"),
            gather_subset=module.params["gather_subset"],
            minimal_gather_subset=MINIMAL_GATHER_SUBSET,
        )
    except (TypeError, CollectorNotFoundError, CycleFoundInFactDeps, UnresolvedFactDep) as err:
        module.fail_json(msg=f"gather_subset: {err}")
    facts = collector.collect(module=module)
    module.exit_json(changed=False, found=look(module), ansible_facts=facts)


if __name__ == "__main__":
    main()
