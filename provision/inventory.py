"""Read an Ansible inventory with Ansible's own API, so the CLI sees what ansible-playbook sees."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from provision.errors import InputError

# An inventory Ansible cannot parse must be an error, not a warning and an empty host list.
os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_FAILED", "True")
os.environ.setdefault("ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED", "True")

from ansible.errors import AnsibleError  # noqa: E402
from ansible.inventory.manager import InventoryManager  # noqa: E402
from ansible.parsing.dataloader import DataLoader  # noqa: E402
from ansible.template import Templar  # noqa: E402
from ansible.vars.manager import VariableManager  # noqa: E402

from provision.config import RuleError  # noqa: E402
from provision.plan import Plan, check_instances  # noqa: E402
from provision.resolve import HostVars, origin_of, plan_host  # noqa: E402


def _ansible_message(err: BaseException) -> tuple[str, str]:
    """(file:line, the reason on one line) from an Ansible error or the first of its causes that knows."""
    cause: BaseException | None = err
    while cause is not None:
        where = origin_of(getattr(cause, "obj", None))
        if where:
            return where, " ".join(str(getattr(cause, "message", cause)).split())
        cause = cause.__cause__ or cause.__context__
    return "", " ".join(str(getattr(err, "message", err)).split())


@contextmanager
def _quiet_ansible() -> Iterator[None]:
    """Ansible prints a warning per inventory plugin it tried; the error we raise says it once."""
    with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
        yield


class Inventory:
    def __init__(self, path: Path) -> None:
        if not path.exists():
            raise InputError("--inventory", "", f"{path} does not exist; pass an inventory directory or file")
        self.path = path
        self.loader = DataLoader()
        try:
            with _quiet_ansible():
                self.manager = InventoryManager(loader=self.loader, sources=[str(path)])
        except AnsibleError as err:
            raise self._unparsed(err) from None
        self.variables = VariableManager(loader=self.loader, inventory=self.manager)

    def _unparsed(self, err: AnsibleError) -> InputError:
        """Ansible only says which source failed (the reason went to warnings): re-read it for the reason."""
        failed = re.search(r"inventory source (\S+)$", str(err.message))
        if failed:
            try:
                self.loader.load_from_file(failed.group(1))
            except AnsibleError as yaml_err:
                source, text = _ansible_message(yaml_err)
                return InputError(source or failed.group(1), "", f"cannot parse the inventory: {text}")
        source, text = _ansible_message(err)
        return InputError(source or str(self.path), "", f"cannot parse the inventory: {text}")

    @property
    def host_names(self) -> list[str]:
        return [h.name for h in self.manager.get_hosts()]

    @property
    def group_names(self) -> list[str]:
        return [g for g in self.manager.groups if g not in ("all", "ungrouped")]

    def hosts_for(self, target: str) -> list[str]:
        """The hosts a --host value names: a host, or every host of a group."""
        if target in self.manager.groups:
            hosts = [h.name for h in self.manager.groups[target].get_hosts()]
            if hosts:
                return hosts
            raise InputError("--host", target, "the group has no hosts")
        if self.manager.get_host(target) is not None:
            return [target]
        raise InputError(
            "--host",
            target,
            f"unknown host or group; hosts: {', '.join(self.host_names) or 'none'}; "
            f"groups: {', '.join(self.group_names) or 'none'}",
        )

    def groups_of(self, host: str) -> list[str]:
        return sorted(g.name for g in self.manager.get_host(host).get_groups() if g.name != "all")

    def _raw_vars(self, host: str) -> dict[str, Any]:
        try:
            with _quiet_ansible():
                return self.variables.get_vars(host=self.manager.get_host(host), include_hostvars=False)
        except AnsibleError as err:
            source, text = _ansible_message(err)
            raise InputError(source or str(self.path), "", f"cannot read variables of {host}: {text}") from None

    def connection(self, host: str) -> dict[str, str]:
        """The host's ansible_* connection variables, templated: how day-2 commands reach it, as Ansible does."""
        raw = self._raw_vars(host)
        templar = Templar(loader=self.loader, variables=raw)
        keys = ("ansible_host", "ansible_port", "ansible_user", "ansible_connection", "ansible_ssh_private_key_file",
                "ansible_ssh_common_args")  # fmt: skip
        return {k: str(templar.template(raw[k])) for k in keys if raw.get(k) is not None}

    def addresses(self) -> dict[str, str]:
        return {h.name: str(h.vars.get("ansible_host", h.name)) for h in self.manager.get_hosts()}

    def hostvars(self, host: str, cli_set: dict[str, Any]) -> HostVars:
        raw = self._raw_vars(host)
        templar = Templar(loader=self.loader, variables=raw)

        def template(value: Any) -> Any:
            try:
                return templar.template(value)
            except AnsibleError as err:
                _, text = _ansible_message(err)
                raise InputError(str(self.path), "", f"cannot template a variable of {host}: {text}") from None

        return HostVars(host, raw, template, fallback=f"{self.path} (host {host})", cli_set=cli_set)

    def plans(self, target: str, cli_set: dict[str, Any]) -> list[Plan]:
        addresses = self.addresses()
        plans = [
            plan_host(self.hostvars(host, cli_set), self.groups_of(host), addresses) for host in self.hosts_for(target)
        ]
        try:
            check_instances(plans)
        except RuleError as err:
            raise InputError(str(self.path), err.field, err.message) from None
        return plans
