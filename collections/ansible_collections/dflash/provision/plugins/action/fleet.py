"""Controller-side, once per play: the rules across hosts (provision's planning.check_fleet), over every play host's
resolved plan, so that plain ansible-playbook refuses what `provision plan` refuses. In a run `provision apply`
started, where every host's plan is the one apply validated, apply checked these rules already, across all the hosts
it planned: a superset of the play's, and each rule that holds across a set of hosts holds across any part of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible.plugins.action import ActionBase

from provision import paths
from provision.ansible.handoff import HandoffError, apply_plan, apply_plans_dir


def _broken_rule(plans: list[dict[str, Any]], types_of: Callable[[str], list[str]]) -> str | None:
    """The first rule the plans break, as the play says it; the models load here only (see the resolve action)."""
    from provision.model.deployment import RuleError
    from provision.planning.planner import check_fleet
    from provision.planning.types import Plan

    try:
        check_fleet([Plan.model_validate(plan) for plan in plans], types_of)
    except RuleError as err:
        return f"inventory: {err.field}: {err.message}"
    return None


def _as_apply_validated(plans: dict[str, Any]) -> bool:
    try:
        return apply_plans_dir() is not None and all(apply_plan(host) == plan for host, plan in plans.items())
    except HandoffError:
        return False


if apply_plans_dir() is None:  # the models load once, in Ansible's main process (see the resolve action)
    import provision.planning.planner  # noqa: F401


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        hostvars = task_vars["hostvars"]
        names = list(hostvars)  # the inventory's hosts (hostvars also answers for an implicit localhost)
        plans = {
            host: hostvars[host]["dflash_plan"]
            for host in task_vars.get("ansible_play_hosts_all", [])
            if "dflash_plan" in hostvars[host]
        }
        if _as_apply_validated(plans):
            return {**result, "changed": False, "msg": f"{len(plans)} plan(s) as provision apply checked them"}

        def types_of(host: str) -> list[str]:
            return paths.host_types(hostvars[host].get("group_names", [])) if host in names else []

        broken = _broken_rule(list(plans.values()), types_of)
        if broken:
            return {**result, "failed": True, "msg": broken}
        return {**result, "changed": False, "msg": f"{len(plans)} plan(s) agree across hosts"}
