"""Read an Ansible inventory with Ansible's own API, so the CLI sees what ansible-playbook sees."""

from __future__ import annotations

import io
import os
import re
import stat
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import yaml

from provision import paths
from provision.errors import InputError

# An inventory Ansible cannot parse must be an error, not a warning and an empty host list.
os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_FAILED", "True")
os.environ.setdefault("ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED", "True")
# Forced, not defaults: only the YAML plugin reads inventories (the ini plugin takes any text file, a key file
# included, for a host list; the script plugin runs executables). A key given twice is refused by check_files,
# which knows YAML's merge keys: Ansible's own check counts a key that overrides a merged one (`<<: *base`) as a
# duplicate, so it is told to keep quiet. The environment is inherited by the ansible-playbook that `apply` starts.
os.environ["ANSIBLE_DUPLICATE_YAML_DICT_KEY"] = "ignore"
os.environ["ANSIBLE_INVENTORY_ENABLED"] = "yaml"
# The configuration the play runs under (apply forces it on ansible-playbook): an ansible.cfg in the working
# directory, ~/.ansible.cfg or $ANSIBLE_CONFIG would otherwise change what plan resolves and not what apply does.
# (Inside a running ansible-playbook, Ansible is configured already and its own configuration stands.)
_OWN_PROCESS = "ansible.constants" not in sys.modules
if _OWN_PROCESS:
    os.environ["ANSIBLE_CONFIG"] = str(paths.ansible_config())
# group_vars and host_vars are read when a host's variables are asked for, never while the inventory is parsed
# (an ansible.cfg may say `stage = inventory`): check_vars_files checks them in between.
os.environ["ANSIBLE_VARS_PLUGIN_STAGE"] = "task"

import ansible.constants as C  # noqa: E402
from ansible.errors import AnsibleError  # noqa: E402
from ansible.inventory.manager import IGNORED, InventoryManager  # noqa: E402
from ansible.parsing.dataloader import DataLoader  # noqa: E402
from ansible.template import Templar  # noqa: E402
from ansible.vars.hostvars import HostVars as AnsibleHostVars  # noqa: E402
from ansible.vars.manager import VariableManager  # noqa: E402

if _OWN_PROCESS and C.CONFIG_FILE != os.environ["ANSIBLE_CONFIG"]:
    raise RuntimeError(f"Ansible read {C.CONFIG_FILE}, not provision's {os.environ['ANSIBLE_CONFIG']}")

from provision.model.deployment import RuleError  # noqa: E402
from provision.planning.planner import check_instances  # noqa: E402
from provision.planning.resolve import HostVars, origin_of, resolve_host  # noqa: E402
from provision.planning.types import Plan  # noqa: E402


def _ansible_message(err: BaseException) -> tuple[str, str]:
    """(file:line, the reason on one line) from an Ansible error or the first of its causes that knows."""
    cause: BaseException | None = err
    while cause is not None:
        where = origin_of(getattr(cause, "obj", None))
        if where:
            return where, " ".join(str(getattr(cause, "message", cause)).split())
        cause = cause.__cause__ or cause.__context__
    return "", " ".join(str(getattr(err, "message", err)).split())


# What aliases may add to a file, beyond the nodes it spells out: an inventory's aliases add a few hundred nodes,
# an alias bomb ("billion laughs") billions. The file's own nodes are bounded by MAX_FILE_BYTES.
MAX_NODES = 100_000
MAX_FILE_BYTES = 8 << 20
YAML_SUFFIXES = ("", *C.YAML_FILENAME_EXTENSIONS)
NOT_REGULAR = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}
# A host type is a group with its own playbook (apply runs it): a host has one, or Ansible merges two.


def _stat(path: Path, what: str) -> os.stat_result:
    """The entry's stat (through links), checked before anything opens it: opening a FIFO would block."""
    try:
        return path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise InputError(str(path), "", f"is a dangling symlink (to {os.readlink(path)}); {what}") from None
        raise InputError(str(path), "", f"does not exist; {what}") from None
    except OSError as err:
        raise InputError(str(path), "", f"cannot be read ({err.strerror}); {what}") from None


def _read(path: Path, st: os.stat_result, what: str) -> str:
    """A regular, readable file's text, or the refusal that names what it is instead."""
    if stat.S_ISDIR(st.st_mode):
        raise InputError(str(path), "", f"is a directory, not a regular file; {what}")
    if not stat.S_ISREG(st.st_mode):
        kind = NOT_REGULAR.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise InputError(str(path), "", f"is {kind}, not a regular file; {what}")
    if st.st_size > MAX_FILE_BYTES:
        raise InputError(str(path), "", f"is {st.st_size} bytes; an inventory file is at most {MAX_FILE_BYTES}")
    try:
        return path.read_text(errors="replace")
    except OSError as err:
        raise InputError(str(path), "", f"cannot be read ({err.strerror}); {what}") from None


def _check_aliases(path: Path, text: str) -> None:
    """Refuse a file whose aliases add more than MAX_NODES nodes once expanded, counted from the parser's events:
    nothing is expanded here. An alias adds the expanded size of its anchor's node, less the one alias node."""
    anchored: dict[str, int] = {}
    frames: list[list[Any]] = [[0, None]]  # [expanded nodes so far, anchor] per open collection
    added = 0
    try:
        for event in yaml.parse(text, Loader=yaml.CSafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                frames.append([1, event.anchor])
                continue
            if isinstance(event, yaml.CollectionEndEvent):
                size, anchor = frames.pop()
            elif isinstance(event, yaml.ScalarEvent):
                size, anchor = 1, event.anchor
            elif isinstance(event, yaml.AliasEvent):
                size, anchor = anchored.get(event.anchor, 1), None
                added += size - 1
            else:
                continue
            if anchor:
                anchored[anchor] = size
            frames[-1][0] += size
            if added > MAX_NODES:
                raise InputError(
                    f"{path}:{event.start_mark.line + 1}",
                    f"alias *{event.anchor}",
                    f"its aliases add more than {MAX_NODES} YAML nodes once expanded (an alias bomb?); the aliases "
                    f"of an inventory file may add at most {MAX_NODES}",
                )
    except yaml.YAMLError:
        return  # not YAML: Ansible's parser says where, with its own message


def _check_duplicate_keys(path: Path, text: str) -> None:
    """A key given twice in one mapping is refused; a key that overrides one merged in by `<<` is YAML's merge."""
    try:
        root = yaml.compose(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError:
        return  # not YAML: said elsewhere, with the parser's own message
    seen_nodes: set[int] = set()
    todo = [root] if root is not None else []
    while todo:
        node = todo.pop()
        if id(node) in seen_nodes:  # an alias is the same node again: walked once
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[str] = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if key.value in keys:
                        raise InputError(
                            f"{path}:{key.start_mark.line + 1}",
                            key.value,
                            "given twice in one mapping; give each key once (a key may override one merged in with <<)",
                        )
                    keys.add(key.value)
                todo += [key, value]
        elif isinstance(node, yaml.SequenceNode):
            todo += node.value


GROUP_KEYS = {"hosts", "vars", "children"}
NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def _not_inventory(path: Path, node: yaml.Node | None, reason: str) -> InputError:
    """Says where and why in words only: the file may be a secret, so none of its text is quoted."""
    where = f"{path}:{node.start_mark.line + 1}" if node is not None else str(path)
    allowed = "an inventory maps group names to hosts, vars and children"
    return InputError(where, "", f"is not an inventory: {reason}; {allowed}")


def _check_structure(path: Path, text: str) -> None:
    """A YAML inventory's shape, checked before Ansible reads it, whose errors and host lists would echo the text."""
    try:
        root = yaml.compose(text, Loader=yaml.CSafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = re.sub(r"'[^']*'|\"[^\"]*\"", "(...)", getattr(err, "problem", None) or "a syntax error")
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise InputError(where, "", f"cannot parse the inventory: not valid YAML: {problem}") from None
    if root is None:
        return  # empty: Ansible says it has no hosts
    if not isinstance(root, yaml.MappingNode):
        raise _not_inventory(path, root, "the top level is not a mapping")

    def mapping_or_null(node: yaml.Node, what: str) -> list[tuple[yaml.Node, yaml.Node]]:
        if isinstance(node, yaml.MappingNode):
            return node.value
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            return []
        raise _not_inventory(path, node, f"{what} is not a mapping")

    for name, group in root.value:
        if not (isinstance(name, yaml.ScalarNode) and NAME.fullmatch(name.value)):
            raise _not_inventory(path, name, "a top-level key is not a group name")
        for key, value in mapping_or_null(group, "a group"):
            if not isinstance(key, yaml.ScalarNode) or key.value not in GROUP_KEYS:
                raise _not_inventory(path, key, "a group has a key other than hosts, vars and children")
            if key.value == "children":
                for _, child in mapping_or_null(value, "children"):
                    mapping_or_null(child, "a child group")
            else:
                mapping_or_null(value, key.value)


def _entries(directory: Path, seen: set[tuple[int, int]]) -> list[str]:
    """The directory's names, once per directory: a link back up the tree would otherwise be walked forever."""
    st = directory.stat()
    if (st.st_dev, st.st_ino) in seen:
        raise InputError(str(directory), "", "links back to a directory above it; an inventory tree has no loops")
    seen.add((st.st_dev, st.st_ino))
    try:
        return sorted(os.listdir(directory))
    except OSError as err:
        raise InputError(str(directory), "", f"cannot be listed ({err.strerror})") from None


def _check_inventory_dir(directory: Path, seen: set[tuple[int, int]]) -> None:
    """The entries Ansible would try as inventory sources (it skips hidden, ignored and the vars trees)."""
    for name in _entries(directory, seen):
        if IGNORED.search(os.fsencode(name)):
            continue
        path = directory / name
        st = _stat(path, "an inventory directory holds YAML inventory files and directories")
        if stat.S_ISDIR(st.st_mode):
            _check_inventory_dir(path, seen)
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o111:
            raise InputError(
                str(path),
                "",
                "is executable: Ansible runs executables in an inventory directory as dynamic inventory scripts, "
                "which provision never does; remove the execute bit or move it out",
            )
        if path.suffix not in YAML_SUFFIXES:
            raise InputError(
                str(path),
                "",
                f"is not an inventory file: only YAML ({', '.join(C.YAML_FILENAME_EXTENSIONS)}) is read; "
                "move it out of the inventory directory",
            )
        text = _read(path, st, "an inventory file must be a regular file")
        _check_aliases(path, text)
        _check_duplicate_keys(path, text)
        _check_structure(path, text)


def _check_vars_entries(directory: Path, seen: set[tuple[int, int]]) -> None:
    """Every entry under group_vars/ or host_vars/ is a regular file or a directory, checked by stat alone: a FIFO
    would block whoever opens it, a socket or device is no vars file, a dangling link is a mistake."""
    for name in _entries(directory, seen):
        path = directory / name
        st = _stat(path, "a vars file must be a regular file, a vars directory a directory")
        if stat.S_ISDIR(st.st_mode):
            _check_vars_entries(path, seen)
        elif not stat.S_ISREG(st.st_mode):
            kind = NOT_REGULAR.get(stat.S_IFMT(st.st_mode), "not a regular file")
            raise InputError(str(path), "", f"is {kind}, not a regular file; group_vars and host_vars hold vars files")


def _vars_candidates(vars_dir: Path, name: str) -> list[Path]:
    """The paths Ansible's host_group_vars plugin tries for an entity, in its order (DataLoader.find_vars_files):
    NAME (a directory or a file), then NAME.yml, .yaml, .json; it reads the first that exists, ignores the rest."""
    return [vars_dir / f"{name}{ext}" for ext in YAML_SUFFIXES]


def _check_entity_vars(vars_dir: Path, kind: str, name: str, loader: DataLoader) -> None:
    """The vars files Ansible will load for one host or group: one candidate at most, each file bounded."""
    if "/" in name or "\0" in name or name in (".", ".."):
        raise InputError(
            str(vars_dir),
            f"{kind} {name}",
            f"Ansible looks up a {kind}'s variables as {vars_dir.name}/NAME, NAME.yml, ...: a {kind} name is one "
            "file name (no '/', no NUL, not '.' or '..')",
        )
    found = [p for p in _vars_candidates(vars_dir, name) if os.path.lexists(p)]
    if len(found) > 1:
        shown = [p.name + ("/" if p.is_dir() else "") for p in found]
        raise InputError(
            str(found[1]),
            "",
            f"and {shown[0]} both hold the variables of {kind} {name}; Ansible reads only {shown[0]} and ignores "
            f"the other; keep one",
        )
    what = "a vars file must be a regular file (a directory of vars files is named without an extension)"
    if found and found[0].name != name and found[0].is_dir():  # Ansible would read NAME.yml/ as a vars directory
        raise InputError(str(found[0]), "", f"is a directory, not a regular file; {what}")
    for file in loader.find_vars_files(str(vars_dir), name):
        path = Path(file)
        text = _read(path, _stat(path, what), what)
        _check_aliases(path, text)
        _check_duplicate_keys(path, text)


def check_vars_files(base: Path, manager: InventoryManager, loader: DataLoader) -> None:
    """The files of group_vars/ and host_vars/ next to the inventory that Ansible will load for its hosts and
    groups (the host_group_vars plugin's own rule), before anything loads them; other files there are never read."""
    entities = [("group_vars", "group", sorted(manager.groups)), ("host_vars", "host", sorted(manager.hosts))]
    for tree, kind, names in entities:
        vars_dir = base / tree
        if os.path.isdir(vars_dir):
            for name in names:
                if not name.startswith(os.sep):  # as host_group_vars: a 'chroot' host /path/to/root has no vars files
                    _check_entity_vars(vars_dir, kind, name, loader)


def check_files(path: Path) -> Path:
    """Every inventory file Ansible will read is a regular, bounded YAML file, and group_vars/ and host_vars/ hold
    only regular files and directories: refuse the rest by name. Returns the directory of the vars trees."""
    st = _stat(path, "pass an inventory directory or YAML file")
    seen: set[tuple[int, int]] = set()
    if stat.S_ISDIR(st.st_mode):
        _check_inventory_dir(path, seen)
        base = path
    else:
        text = _read(path, st, "pass an inventory directory or YAML file")
        _check_aliases(path, text)
        _check_duplicate_keys(path, text)
        _check_structure(path, text)
        base = path.parent
    for tree in ("group_vars", "host_vars"):
        vars_dir = base / tree
        if os.path.lexists(vars_dir):
            if not stat.S_ISDIR(_stat(vars_dir, f"{tree} must be a directory").st_mode):
                raise InputError(str(vars_dir), "", f"is not a directory; {tree} must be a directory of vars files")
            _check_vars_entries(vars_dir, seen)
    return base


DUPLICATE_KEY = re.compile(r"Found duplicate mapping key '(.*)'")


def _refusal(source: str, context: str, text: str) -> InputError:
    """An Ansible failure as an InputError; a duplicate key (ANSIBLE_DUPLICATE_YAML_DICT_KEY=error) names the key."""
    duplicate = DUPLICATE_KEY.search(text)
    if duplicate:
        return InputError(source, duplicate.group(1), "given twice in one mapping; give each key once")
    return InputError(source, "", f"{context}: {text}")


@contextmanager
def _quiet_ansible() -> Iterator[None]:
    """Ansible prints a warning per inventory plugin it tried; the error we raise says it once."""
    with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
        yield


class Inventory:
    def __init__(self, path: Path) -> None:
        if not os.path.lexists(path):
            raise InputError("--inventory", "", f"{path} does not exist; pass an inventory directory or file")
        base = check_files(path)
        self.path = path
        # Ansible also reads group_vars/ and host_vars/ beside the playbook (the loader's basedir, by default the
        # current directory): the playbooks' directory, as ansible-playbook does, never where the CLI was started
        self.loader = DataLoader()
        self.loader.set_basedir(str(paths.playbooks()))
        try:
            with _quiet_ansible():
                self.manager = InventoryManager(loader=self.loader, sources=[str(path)])
        except AnsibleError as err:
            raise self._unparsed(err) from None
        check_vars_files(base, self.manager, self.loader)
        self.variables = VariableManager(loader=self.loader, inventory=self.manager)
        # every host's variables, templated on access under that host's own: the play's `hostvars`
        self.all_hostvars = AnsibleHostVars(inventory=self.manager, variable_manager=self.variables, loader=self.loader)

    def _unparsed(self, err: AnsibleError) -> InputError:
        """Ansible only says which source failed (the reason went to warnings): re-read it for the reason."""
        failed = re.search(r"inventory source (\S+)$", str(err.message))
        if failed:
            try:
                self.loader.load_from_file(failed.group(1))
            except AnsibleError as yaml_err:
                source, text = _ansible_message(yaml_err)
                return _refusal(source or failed.group(1), "cannot parse the inventory", text)
        source, text = _ansible_message(err)
        return _refusal(source or str(self.path), "cannot parse the inventory", text)

    def host_types(self, host: str) -> list[str]:
        """The host's types: its groups that have a playbook of their own."""
        groups = self.manager.hosts[host].get_groups()
        return sorted(g.name for g in groups if g.name != "all" and (paths.playbooks() / f"{g.name}.yml").is_file())

    def _check_host(self, host: str) -> None:
        """One host type per host, and no dflash_* section that Ansible would pick from two groups by name order."""
        groups = [g for g in self.manager.hosts[host].get_groups() if g.name != "all"]
        types = self.host_types(host)
        if len(types) > 1:
            raise InputError(
                str(self.path), "groups", f"host {host} is in host types {' and '.join(types)}; a host has one type"
            )
        by_level: dict[tuple[int, int], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for group in groups:
            for key in self._group_keys(group.name) | set(group.get_vars()):
                if key.startswith("dflash_"):
                    by_level[(group.depth, group.priority)][key].append(group.name)
        for owners in by_level.values():
            for key, names in sorted(owners.items()):
                if len(names) > 1:
                    raise InputError(
                        str(self.path),
                        key,
                        f"host {host} gets it from groups {' and '.join(sorted(names))} at the same level, where "
                        "Ansible silently keeps the last by name; define it in one of them, or give one group a "
                        "higher ansible_group_priority",
                    )

    def _group_keys(self, group: str) -> set[str]:
        """The variable names a group's group_vars files define (Ansible reads them per host, when asked)."""
        base = self.path if self.path.is_dir() else self.path.parent
        keys: set[str] = set()
        for file in self.loader.find_vars_files(str(base / "group_vars"), group):
            try:
                # uncached: the loader's cache would hand the vars plugin this parse, not trusted as a template,
                # and plan would show `{{ ... }}` literally where the play renders it
                data = self.loader.load_from_file(file, cache="none", unsafe=True)
            except AnsibleError as err:
                source, text = _ansible_message(err)
                raise _refusal(source or file, "cannot parse the group's variables", text) from None
            if isinstance(data, dict):
                keys |= set(data)
        return keys

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
                for host in hosts:
                    self._check_host(host)
                return hosts
            raise InputError("--host", target, "the group has no hosts")
        # hosts, not get_host(): that also answers for an implicit localhost the inventory never names
        if target in self.manager.hosts:
            self._check_host(target)
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
                return self.variables.get_vars(host=self.manager.get_host(host), include_hostvars=True)
        except AnsibleError as err:
            source, text = _ansible_message(err)
            raise _refusal(source or str(self.path), f"cannot read variables of {host}", text) from None

    def connection(self, host: str) -> dict[str, str]:
        """The host's ansible_* connection variables, templated: how day-2 commands reach it, as Ansible does."""
        raw = self._raw_vars(host)
        templar = Templar(loader=self.loader, variables=raw)
        keys = ("ansible_host", "ansible_port", "ansible_user", "ansible_connection", "ansible_ssh_private_key_file",
                "ansible_ssh_common_args")  # fmt: skip
        return {k: str(templar.template(raw[k])) for k in keys if raw.get(k) is not None}

    def _resolved(self, host: str) -> tuple[dict[str, Any], Callable[[Any], Any]]:
        """The host's variables as Ansible resolves them for the play, and templating under them."""
        raw = self._raw_vars(host)
        templar = Templar(loader=self.loader, variables=raw)

        def template(value: Any) -> Any:
            try:
                return templar.template(value)
            except AnsibleError as err:
                _, text = _ansible_message(err)
                raise InputError(str(self.path), "", f"cannot template a variable of {host}: {text}") from None

        return raw, template

    def plan(self, host: str, cli_set: dict[str, Any], cli_text: dict[str, str] | None = None) -> Plan:
        """The host's plan through the play's own path (planning.resolve.resolve_host)."""
        raw, template = self._resolved(host)
        return resolve_host(host, raw, template, fallback=f"{self.path} (host {host})", cli_set=cli_set,
                            cli_text=cli_text)  # fmt: skip

    def hostvars(self, host: str, cli_set: dict[str, Any] | None = None) -> HostVars:
        """The host's variables as the resolver reads them (day-2 connection settings, the deployment alone)."""
        raw, template = self._resolved(host)
        return HostVars(host, raw, template, fallback=f"{self.path} (host {host})", cli_set=cli_set)

    def plans(self, target: str, cli_set: dict[str, Any], cli_text: dict[str, str] | None = None) -> list[Plan]:
        """cli_set: typed overrides (overrides.parse_set for `--set` text); cli_text: that text, for messages."""
        plans = [self.plan(host, cli_set, cli_text) for host in self.hosts_for(target)]
        try:
            check_instances(plans)
        except RuleError as err:
            raise InputError(str(self.path), err.field, err.message) from None
        for plan in plans:
            nodes = plan.config.multinode.nodes if plan.config.multinode else []
            kinds = {node: self.host_types(node) for node in nodes if node in self.manager.hosts}
            if len({tuple(k) for k in kinds.values()}) > 1:
                mixed = ", ".join(f"{node} ({'/'.join(k) or 'no type'})" for node, k in kinds.items())
                raise InputError(
                    str(self.path), "dflash_multinode.nodes", f"one instance spans one host type; got {mixed}"
                )
        return plans
