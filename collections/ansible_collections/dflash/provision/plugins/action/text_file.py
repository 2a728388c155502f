"""A managed text file in one round trip: src is read here, on the control node, and goes to the host as content."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        src = args.pop("src", None)
        if (src is None) == (args.get("content") is None):
            return {**result, "failed": True, "msg": "text_file takes exactly one of src and content"}
        if src is not None:
            try:
                with open(self._find_needle("files", src), encoding="utf-8") as handle:
                    args["content"] = handle.read()
            except (AnsibleError, OSError, UnicodeDecodeError) as err:
                return {**result, "failed": True, "msg": f"text_file src {src}: {err}"}
        answer = self._execute_module(module_name="dflash.provision.text_file", module_args=args, task_vars=task_vars)
        return {**result, **answer}
