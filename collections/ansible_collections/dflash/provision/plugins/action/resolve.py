"""Controller-side: resolve the host's deployment with provision's models (no connection to the host)."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

from provision import paths
from provision.errors import InputError
from provision.planning.resolve import CLI_SET_VAR, resolve_host


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        host = task_vars["inventory_hostname"]
        # `provision apply --set`, typed once by the CLI: data, never templated (the CLI showed it as text)
        cli_set = dict(task_vars.get(CLI_SET_VAR) or {})
        # the host's own systemd, once the play has read it: the unit is rendered for that version
        reported = self._task.args.get("systemd_version")
        if reported is not None and "service.systemd_version" not in cli_set:
            cli_set["service.systemd_version"] = int(reported)
        try:
            plan = resolve_host(
                host,
                task_vars,
                self._templar.template,
                fallback=f"inventory (host {host})",
                cli_set=cli_set,
                inventory_dir=str(task_vars.get("inventory_dir") or ""),
            )
        except InputError as err:
            return {**result, "failed": True, "msg": str(err)}
        facts = {
            "dflash_plan": plan.model_dump(mode="json"),
            # where this control node keeps the SGLang stand-in, which hosts without GPUs run
            "dflash_standin_src": str(paths.standin()),
        }
        return {**result, "changed": False, "ansible_facts": facts}
