"""Controller-side: resolve the host's deployment with provision's models (no connection to the host), or, in a
run `provision apply` started, take the plan apply validated and recorded for the host (provision.ansible.handoff)."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

from provision import paths
from provision.ansible.handoff import CLI_SET_VAR, HandoffError, apply_plan, apply_plans_dir
from provision.ansible.role_vars import role_vars
from provision.errors import InputError

# Ansible loads this plugin in its main process, which forks a worker per task. Outside apply, every host resolves
# here: the models load once, before the forks, rather than in each worker. Apply's runs need them only for a host
# whose unit is rendered again for its own systemd (pydantic's import: about 0.15 s).
if apply_plans_dir() is None:
    import provision.planning.resolve  # noqa: F401
    from provision.model import tables

    # and the tables every plan reads (compat.yml, the SGLang builds and their parsers), parsed once here too
    # rather than again in each worker that validates plans (the resolve's, the fleet check's)
    for table in (tables.compat, tables.builds, tables.parsers):
        table()


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
            given = apply_plan(host)
        except HandoffError as err:
            return {**result, "failed": True, "msg": str(err)}
        # apply's plan stands unless the play asks for the unit of another systemd than apply rendered it for
        wanted = cli_set.get("service.systemd_version")
        if given is None or (wanted is not None and wanted != given["systemd"]["version"]):
            from provision.planning.resolve import resolve_host

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
            given = plan.model_dump(mode="json")
        # where this control node keeps the SGLang stand-in, which hosts without GPUs run
        standin = str(paths.standin())
        # the roles' parameters as values, read off the plan here (provision.ansible.role_vars says why)
        facts = {**role_vars(given, standin), "dflash_plan": given, "dflash_standin_src": standin}
        return {**result, "changed": False, "ansible_facts": facts}
