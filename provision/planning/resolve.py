"""Host variables -> validated Deployment -> Plan, shared by the CLI and the Ansible action plugin.

Every error names where the value came from: the inventory file and line (Ansible's origin tags),
the `dflash_set` entry, or the `--set` option.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pydantic import ValidationError

from provision import paths
from provision.ansible.handoff import CLI_SET_VAR
from provision.ansible.origin import origin_of, origin_path
from provision.errors import InputError
from provision.model import overrides
from provision.model.deployment import Deployment, RuleError
from provision.model.translate import first_error, kind
from provision.planning.planner import build_plan
from provision.planning.types import Plan

PREFIX = "dflash_"
SECTIONS = tuple(Deployment.model_fields)
SET_VAR = "dflash_set"
# Variables the tool sets itself (the playbooks, `provision apply`, the plan fact): an inventory that
# sets one would be read by ansible-playbook and not by `provision plan`, so it is refused.
# The play's look at the host (dflash_host_checks, dflash_host_probe, dflash_probe_stale) is among them: an
# inventory must not be able to tell the roles a host is settled.
RESERVED_VARS = (
    CLI_SET_VAR,
    "dflash_plan",
    "dflash_host_type",
    "dflash_standin_src",
    "dflash_host_checks",
    "dflash_host_probe",
    "dflash_probe_stale",
)
OTHER_VARS = (SET_VAR, *RESERVED_VARS)


class HostVars:
    """One host's raw (untemplated) variables and how to template them."""

    def __init__(
        self,
        host: str,
        raw: Mapping[str, Any],
        template: Callable[[Any], Any],
        fallback: str,
        cli_set: Mapping[str, Any] | None = None,
        cli_source: str = "--set",
        inventory_dir: str | None = None,
        cli_text: Mapping[str, str] | None = None,
    ) -> None:
        """cli_set: overrides already typed (parsed once from `--set` text by overrides.parse_set, or JSON);
        cli_text: the text as typed, for messages. inventory_dir: where the inventory's files are, when `raw`
        also holds play and extra vars (the Ansible plugin); None when every raw variable comes from the
        inventory (the CLI)."""
        self.host = host
        self.inventory_dir = inventory_dir
        self.raw = raw
        self.template = template
        self.fallback = fallback
        self.cli_source = cli_source
        self.cli_set = dict(cli_set or {})
        overrides.check_overlaps(self.cli_set, cli_source)
        for key in self.cli_set:
            overrides.check_key(key, cli_source)
        # as typed, for messages
        self.cli_given = {k: (cli_text or {}).get(k, json.dumps(v)) for k, v in self.cli_set.items()}

    def _tools_own(self, name: str) -> bool:
        """Whether one of the tool's own playbooks defines the variable (the deploy play's vars, seen where it
        resolves again): no inventory sets those, whatever their names. A group_vars or host_vars file beside the
        playbooks is an inventory's, not the tool's."""
        path = origin_path(self.raw[name])
        return bool(path) and os.path.dirname(os.path.realpath(path)) == os.path.realpath(paths.playbooks())

    def _check_names(self) -> None:
        known = [PREFIX + s for s in SECTIONS] + list(OTHER_VARS)
        for name in self.raw:
            if name.startswith(PREFIX) and name not in known and not self._tools_own(name):
                source = origin_of(self.raw[name]) or self.fallback
                raise InputError(source, name, f"unknown variable; known: {', '.join(known)}")
        for name in RESERVED_VARS:
            if name not in self.raw:
                continue
            source = origin_of(self.raw[name])
            path = origin_path(self.raw[name])
            in_inventory = bool(self.inventory_dir and path and path.startswith(self.inventory_dir.rstrip("/") + "/"))
            if self.inventory_dir is None or in_inventory:
                raise InputError(
                    source or self.fallback, name, f"is set by provision itself; put overrides in {SET_VAR}"
                )

    def _host_set(self) -> dict[str, Any]:
        raw = self.raw.get(SET_VAR)
        if raw is None:
            return {}
        source = origin_of(raw) or self.fallback
        value = self.template(raw)
        if not isinstance(value, Mapping):
            raise InputError(
                source,
                SET_VAR,
                f"must be a mapping of dotted keys to values, like {{serve.port: 30001}}; got {kind(value)}",
            )
        overrides.check_overlaps([str(k) for k in value], source)
        for key in value:
            overrides.check_key(str(key), source)
        return {str(k): v for k, v in value.items()}  # typed by YAML already: never read a second time

    def data(self) -> dict[str, Any]:
        self._check_names()
        data: dict[str, Any] = {}
        for section in SECTIONS:
            raw = self.raw.get(PREFIX + section)
            if raw is None:
                continue
            value = self.template(raw)
            if not isinstance(value, Mapping):
                source = origin_of(raw) or self.fallback
                raise InputError(source, PREFIX + section, f"must be a mapping, got {kind(value)}")
            data[section] = dict(value)
        return overrides.apply(overrides.apply(data, self._host_set()), self.cli_set)

    def from_cli(self, field: str) -> str | None:
        """The --set key that gives `field` (or a section above it), if one does."""
        parts = field.split(".")
        above = (".".join(parts[:i]) for i in range(len(parts), 0, -1))
        below = (k for k in self.cli_set if k.startswith(field + "."))  # serve.env.NAME for serve.env
        return next((k for k in above if k in self.cli_set), None) or next(below, None)

    def blame(self, field: str, related: tuple[str, ...] = ()) -> tuple[str, str]:
        """(source, field as the user wrote it) for a dotted config field. A rule across fields is
        blamed on whichever of them a --set gave: that is the value that changed."""
        for candidate in (field, *related):
            key = self.from_cli(candidate)
            if key is not None:
                return f"{self.cli_source} {key}={self.cli_given[key]}", candidate
        host_set = self.raw.get(SET_VAR)
        if isinstance(host_set, Mapping):
            for candidate in (field, *related):  # like --set: whichever of them dflash_set gave
                parts = candidate.split(".")
                for key in [".".join(parts[:i]) for i in range(len(parts), 0, -1)]:
                    if key in host_set:  # the field below the key as well: dflash_set[serve].port
                        shown = f"{SET_VAR}[{key}]{candidate[len(key) :]}"
                        return (origin_of(host_set[key]) or origin_of(host_set) or self.fallback), shown
        for candidate in (field, *related):
            steps = candidate.split(".")
            node: Any = self.raw.get(PREFIX + steps[0])
            source = origin_of(node)
            for step in steps[1:]:
                if not isinstance(node, Mapping) or step not in node:
                    node = None
                    break
                node = node[step]
                source = origin_of(node) or source
            if node is not None:
                return source or self.fallback, PREFIX + candidate
        # given nowhere: the value is the default, so no file line holds it
        return self.fallback, f"{PREFIX}{field} (the default)"

    def deployment(self) -> Deployment:
        data = self.data()
        try:
            return Deployment.model_validate(data)
        except RuleError as err:
            raise self.error(err.field, err.message, err.related) from None
        except ValidationError as err:
            field, message = first_error(err, Deployment)
            raise self.error(field, message) from None

    def error(self, field: str, message: str, related: tuple[str, ...] = ()) -> InputError:
        source, shown = self.blame(field, related)
        return InputError(source, shown, message)

    def inert_notes(self, dep: Deployment) -> list[str]:
        """Settings without effect: refused when a --set gave them (the user asked for a change that
        would change nothing), a note in the plan when the inventory holds them."""
        notes = []
        for field, why in dep.inert():
            source, shown = self.blame(field)
            if self.from_cli(field):
                raise InputError(source, shown, f"has no effect: {why}; remove it")
            notes.append(f"{source}: {shown} has no effect: {why}")
        return notes


def plan_host(hostvars: HostVars, groups: list[str], addresses: Mapping[str, str]) -> Plan:
    dep = hostvars.deployment()
    notes = hostvars.inert_notes(dep)
    try:
        return build_plan(dep, hostvars.host, groups, addresses, notes)
    except RuleError as err:
        raise hostvars.error(err.field, err.message, err.related) from None


class Addresses(Mapping[str, str]):
    """Inventory host -> the address it is reached at (its templated ansible_host, else its name), read from the
    play's `hostvars` only when a multi-node plan asks: host_vars/ files and templates count, as for Ansible."""

    def __init__(self, hostvars: Mapping[str, Mapping[str, Any]], template: Callable[[Any], Any]) -> None:
        self.hostvars = hostvars
        self.template = template

    def __getitem__(self, name: str) -> str:
        if name not in self:
            raise KeyError(name)
        return str(self.template(self.hostvars[name].get("ansible_host", name)))

    def __contains__(self, name: object) -> bool:
        # by listing: Ansible's hostvars answers for an implicit localhost the inventory never names
        return any(name == known for known in self.hostvars)

    def __iter__(self) -> Iterator[str]:
        return iter(self.hostvars)

    def __len__(self) -> int:
        return len(self.hostvars)


def resolve_host(
    host: str,
    variables: Mapping[str, Any],
    template: Callable[[Any], Any],
    *,
    fallback: str,
    cli_set: Mapping[str, Any] | None = None,
    cli_text: Mapping[str, str] | None = None,
    cli_source: str = "--set",
    inventory_dir: str | None = None,
) -> Plan:
    """One host's plan from the variables Ansible resolved for it (the play's task_vars, or the CLI's
    VariableManager.get_vars with hostvars): the one path `provision plan` and the play's resolve both take."""
    hostvars = HostVars(host, variables, template, fallback, cli_set, cli_source, inventory_dir, cli_text)
    groups = sorted(g for g in variables.get("group_names", []) if g != "all")
    return plan_host(hostvars, groups, Addresses(variables.get("hostvars", {}), template))
