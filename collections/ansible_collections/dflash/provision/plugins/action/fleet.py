"""Controller-side, once per play: the rules across hosts (provision's planning.check_fleet), over every play host's
resolved plan, so that plain ansible-playbook refuses what `provision plan` refuses."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

from provision import paths
from provision.model.deployment import RuleError
from provision.planning.planner import check_fleet
from provision.planning.types import Plan


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        hostvars = task_vars["hostvars"]
        names = list(hostvars)  # the inventory's hosts (hostvars also answers for an implicit localhost)
        plans = [
            Plan.model_validate(hostvars[host]["dflash_plan"])
            for host in task_vars.get("ansible_play_hosts_all", [])
            if "dflash_plan" in hostvars[host]
        ]

        def types_of(host: str) -> list[str]:
            return paths.host_types(hostvars[host].get("group_names", [])) if host in names else []

        try:
            check_fleet(plans, types_of)
        except RuleError as err:
            return {**result, "failed": True, "msg": f"inventory: {err.field}: {err.message}"}
        return {**result, "changed": False, "msg": f"{len(plans)} plan(s) agree across hosts"}
