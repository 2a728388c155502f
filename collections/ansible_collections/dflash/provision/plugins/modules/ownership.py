#!/usr/bin/python
# The ownership guard: apply changes only what it created. A manifest on the host lists what apply
# created (or claimed while it was absent); a managed path, or the directory of its own that it lies
# in, that exists and is neither in the manifest nor adopted is refused, by name, before anything changes.

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dflash.provision.plugins.module_utils.ownership import (
    SPEC,
    collect,
    load_manifest,
    record,
    write_manifest,
)

DOCUMENTATION = r"""
module: ownership
short_description: Refuse to take over paths and accounts that apply did not create; record those it creates
description:
  - C(state=check) (read-only, also in check mode) looks at each managed path, the directory of its own it
    lies in, the unit's name in every directory of systemd's unit search path, and the service account.
    Any of them that exists without being in the manifest (what apply created) or adopted fails the host,
    naming each. It reports what is absent, which apply may create and then owns.
  - C(state=record) adds the given paths and account to the manifest (written atomically), with the type and
    owner each has now (a path not created yet is recorded as claimed with the planned type).
  - A path inside a directory in the manifest or adopted is apply's own as well.
options:
  state:
    description: check, or record.
    type: str
    choices: [check, record]
    default: check
  manifest:
    description: The manifest's file.
    type: path
    default: /var/lib/dflash-provision/owned.json
  paths:
    description: >-
      The managed paths (the plan's managed_paths), each with path, type, owner, mode, field and own_dir.
      For record, the paths to record.
    type: list
    elements: dict
    default: []
  unit:
    description: The service's unit name (NAME.service); its files and drop-ins in systemd's search path are checked.
    type: str
    required: false
  user:
    description: The service account (check), or the account to record (record).
    type: str
    required: false
  adopt:
    description: Paths and the account name the user allows apply to take over (service.adopt).
    type: list
    elements: str
    default: []
author: dflash-provision developers
"""

EXAMPLES = r"""
- name: Refuse to take over what apply did not create
  dflash.provision.ownership:
    paths: "{{ dflash_plan.managed_paths }}"
    unit: sglang-dflash.service
    user: sglang
    adopt: []
  register: guard
"""

RETURN = r"""
absent:
  description: >-
    The managed paths and own directories that do not exist yet (apply creates them and owns them), and those
    claimed by an earlier run and not recorded as created yet: what to record.
  type: list
  returned: always
account_absent:
  description: Whether the service account does not exist yet.
  type: bool
  returned: always
refused:
  description: One line per path or account apply would take over.
  type: list
  returned: always
"""


def main():
    module = AnsibleModule(
        argument_spec={"state": {"type": "str", "choices": ["check", "record"], "default": "check"}, **SPEC},
        supports_check_mode=True,
    )
    params = module.params
    if params["state"] == "check":
        module.exit_json(changed=False, **collect(module, params))
    manifest = load_manifest(module, params["manifest"])
    changed = record(params, manifest)
    if changed and not module.check_mode:
        write_manifest(params["manifest"], manifest)
    module.exit_json(changed=changed, absent=[], account_absent=False, refused=[])


if __name__ == "__main__":
    main()
