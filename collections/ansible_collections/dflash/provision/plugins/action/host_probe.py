"""The host probe: copy sources read on the control node in process, then one module call on the host."""

from __future__ import annotations

import os
from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.dflash.provision.plugins.module_utils.probe_models import SPEC as MODELS_SPEC
from ansible_collections.dflash.provision.plugins.module_utils.probe_models import probe


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        checks = dict(self._task.args.get("checks") or {})
        sourced: dict[str, dict[str, Any]] = {}
        for name, check in checks.items():
            if not isinstance(check, dict) or check.get("probe") != "models":
                continue
            args = dict(check.get("args") or {})
            copy_sources = args.pop("copy_sources", None) or {}
            marker = args.get("marker") or MODELS_SPEC["marker"]["default"]
            sources = {}
            for model, path in copy_sources.items():
                if not isinstance(path, str) or not os.path.isabs(path):
                    return {
                        **result,
                        "failed": True,
                        "msg": f"check {name}: the copy source of {model} must be an absolute path, got {path!r}",
                    }
                sources[model] = probe(os.path.normpath(path), None, None, marker)
            sourced[name] = sources
            checks[name] = {**check, "args": {**args, "sources": sources}}
        # the facts' module only where facts are asked for: setup's collectors cost the look a fifth of its time
        facts = self._task.args.get("gather_subset")
        answer = self._execute_module(
            module_name="dflash.provision.host_probe_facts" if facts else "dflash.provision.host_probe",
            module_args={"checks": checks, **({"gather_subset": facts} if facts else {})},
            task_vars=task_vars,
        )
        for name, sources in sourced.items():
            if name in answer.get("found", {}):
                answer["found"][name]["source_models"] = sources
        return {**result, **answer}
