"""Broken inventories: refused with exit 2 and one line naming the file, never a hang, never an echo of a secret."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.test_bad_input import assert_refused

SECRET = "hunter2-SECRET-4f9c"

BOMB = "".join(f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else ', '.join(['lol'] * 9)}]\n" for i in range(10))

# Each case edits a copy of the inventory and gives the extra CLI arguments (default: --host b300-test).
Edit = Callable[[Path], list[str] | None]


def _append(rel: str, text: str) -> Edit:
    def edit(inv: Path) -> None:
        with (inv / rel).open("a") as handle:
            handle.write(text)

    return edit


def _hosts(text: str) -> Edit:
    def edit(inv: Path) -> None:
        (inv / "hosts.yml").write_text(text)

    return edit


def _replace(rel: str, make: Callable[[Path], None]) -> Edit:
    def edit(inv: Path) -> None:
        (inv / rel).unlink()
        make(inv / rel)

    return edit


def _unix_socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the socket file stays


def _file(rel: str, text: str, mode: int = 0o644) -> Edit:
    def edit(inv: Path) -> None:
        (inv / rel).parent.mkdir(parents=True, exist_ok=True)
        (inv / rel).write_text(text)
        (inv / rel).chmod(mode)

    return edit


def _host_in(*groups: str) -> str:
    children = "".join(f"    {g}:\n      hosts:\n        b300-test:\n" for g in groups)
    return f"all:\n  vars: {{ansible_host: 127.0.0.1, ansible_port: 9}}\n  children:\n{children}"


DOTTED = "b300-01.example.invalid"


def _named(host: str, *makes: Callable[[Path], object], group: str = "b300") -> Edit:
    """The inventory's one host named `host` (in `group`), host_vars/ present, then each make(inventory) applied."""

    def edit(inv: Path) -> list[str]:
        (inv / "hosts.yml").write_text(
            f"all:\n  vars: {{ansible_host: 127.0.0.1, ansible_port: 9}}\n  children:\n"
            f"    {group}:\n      hosts:\n        {host!r}:\n"
            + (f"    b300:\n      children:\n        {group}:\n" if group != "b300" else "")
        )
        (inv / "host_vars").mkdir(exist_ok=True)
        for make in makes:
            make(inv)
        return ["--host", host]

    return edit


def _write(rel: str, text: str) -> Callable[[Path], None]:
    def make(inv: Path) -> None:
        (inv / rel).parent.mkdir(parents=True, exist_ok=True)
        (inv / rel).write_text(text)

    return make


def _args(*argv: str) -> Edit:
    def edit(inv: Path) -> list[str]:
        return list(argv)

    return edit


# (id, edit, what the one line must name)
CASES: list[tuple[str, Edit, list[str]]] = [
    # duplicate YAML keys: Ansible would keep the last one
    ("dup-host", _append("hosts.yml", "        b300-test:\n"), ["hosts.yml:", "b300-test", "given twice"]),
    ("dup-group", _append("hosts.yml", "    b300:\n      hosts: {}\n"), ["hosts.yml:", "b300", "given twice"]),
    (
        "dup-section-group-vars",
        _append("group_vars/b300.yml", "dflash_serve:\n  tp: 1\n"),
        ["group_vars/b300.yml:", "dflash_serve", "given twice"],
    ),
    (
        "dup-nested-key-group-vars",
        _append("group_vars/b300.yml", "dflash_extra:\n  tp: 1\n  tp: 2\n"),
        ["group_vars/b300.yml:", "tp", "given twice"],
    ),
    (
        "dup-section-all",
        _append("group_vars/all.yml", "dflash_model: {}\n"),
        ["group_vars/all.yml:", "dflash_model", "given twice"],
    ),
    # one host, two places at one precedence level
    ("two-host-types", _hosts(_host_in("rtx6000", "b300")), ["groups", "b300 and rtx6000", "one type"]),
    ("b300-and-h200", _hosts(_host_in("b300", "h200")), ["dflash_", "b300 and h200", "ansible_group_priority"]),
    (
        "section-in-two-sibling-groups",
        lambda inv: [
            _hosts(_host_in("b300", "fast"))(inv),
            (inv / "group_vars" / "fast.yml").write_text("dflash_serve: {tp: 4}\n"),
        ][0],
        ["dflash_serve", "b300 and fast", "same level"],
    ),
    (
        "group-vars-file-and-dir",
        _file("group_vars/b300/more.yml", "dflash_serve: {tp: 4}\n"),
        ["group_vars/b300", "both hold the variables of group b300", "keep one"],
    ),
    (
        "group-vars-yml-and-yaml",
        lambda inv: (inv / "group_vars" / "b300.yaml").write_text("dflash_serve: {tp: 4}\n") and None,
        ["group_vars/b300.y", "both hold the variables of group b300"],
    ),
    # --host names something the inventory does not hold
    ("host-localhost", _args("--host", "localhost"), ["--host", "localhost", "unknown host or group", "b300-test"]),
    ("host-127", _args("--host", "127.0.0.1"), ["--host", "127.0.0.1", "unknown host or group"]),
    ("host-unknown", _args("--host", "b300-tset"), ["--host", "b300-tset", "unknown host or group", "groups:"]),
    ("host-pattern", _args("--host", "b300*"), ["--host", "b300*", "unknown host or group"]),
    # alias bombs: refused from the parser's events, before anything expands them
    ("bomb-group-vars", _append("group_vars/b300.yml", BOMB), ["group_vars/b300.yml:", "alias *l", "at most"]),
    (
        "bomb-hosts",
        _hosts("all:\n  vars:\n" + "".join("    " + line for line in BOMB.splitlines(keepends=True))),
        ["hosts.yml:", "alias *l", "at most"],
    ),
    # files that are not regular: never opened (a FIFO would block the open)
    ("fifo-group-vars", _replace("group_vars/b300.yml", os.mkfifo), ["group_vars/b300.yml", "a FIFO", "regular"]),
    ("socket-group-vars", _replace("group_vars/b300.yml", _unix_socket), ["group_vars/b300.yml", "a socket"]),
    (
        "dangling-group-vars",
        _replace("group_vars/b300.yml", lambda p: p.symlink_to("/nonexistent/b300.yml")),
        ["group_vars/b300.yml", "dangling symlink"],
    ),
    (
        "dir-as-group-vars-file",
        _replace("group_vars/b300.yml", lambda p: p.mkdir()),
        ["group_vars/b300.yml", "is a directory", "named without an extension"],
    ),
    (
        "device-as-group-vars-file",
        _replace("group_vars/b300.yml", lambda p: p.symlink_to("/dev/zero")),
        ["group_vars/b300.yml", "a device"],
    ),
    ("fifo-hosts-file", lambda inv: os.mkfifo(inv / "more.yml"), ["more.yml", "a FIFO"]),
    (
        "dangling-host-vars",
        lambda inv: _file("host_vars/.keep", "")(inv) or (inv / "host_vars" / "b300-test.yml").symlink_to(inv / "gone"),
        ["host_vars/b300-test.yml", "dangling symlink"],
    ),
    ("link-loop", lambda inv: (inv / "loop").symlink_to(inv), ["loop", "links back"]),
    ("host-vars-not-dir", _file("host_vars", "dflash_serve: {}\n"), ["host_vars", "not a directory"]),
    # dotted host and group names: exactly the files Ansible's host_group_vars reads for them are checked
    (
        "dotted-host-vars-fifo",
        _named(DOTTED, lambda inv: os.mkfifo(inv / "host_vars" / DOTTED)),
        [f"host_vars/{DOTTED}", "a FIFO", "regular"],
    ),
    (
        "dotted-host-vars-bomb",
        _named(DOTTED, _write(f"host_vars/{DOTTED}.yml", BOMB)),
        [f"host_vars/{DOTTED}.yml:", "alias *l", "at most"],
    ),
    (
        "dotted-host-vars-dir-bomb",
        _named(DOTTED, _write(f"host_vars/{DOTTED}/more/x.yaml", BOMB)),
        [f"host_vars/{DOTTED}/more/x.yaml:", "alias *l"],
    ),
    (
        "dotted-host-vars-file-and-dir",
        _named(DOTTED, _write(f"host_vars/{DOTTED}.yml", "a: 1\n"), _write(f"host_vars/{DOTTED}/b.yml", "b: 1\n")),
        [f"host_vars/{DOTTED}.yml", f"and {DOTTED}/ both hold the variables of host {DOTTED}", "reads only"],
    ),
    (
        "dotted-host-vars-no-suffix-and-json",
        _named(DOTTED, _write(f"host_vars/{DOTTED}", "a: 1\n"), _write(f"host_vars/{DOTTED}.json", "{}\n")),
        [f"host_vars/{DOTTED}.json", f"both hold the variables of host {DOTTED}"],
    ),
    (
        "dotted-group-vars-yml-and-json",
        _named(
            "b300-test",
            _write("group_vars/fast.v2.yml", "a: 1\n"),
            _write("group_vars/fast.v2.json", "{}\n"),
            group="fast.v2",
        ),
        ["group_vars/fast.v2.json", "both hold the variables of group fast.v2"],
    ),
    (
        "socket-deep-in-host-vars",
        _named(
            "b300-test",
            lambda inv: _write("host_vars/other/deep/.keep", "")(inv) or _unix_socket(inv / "host_vars/other/deep/s"),
        ),
        ["host_vars/other/deep/s", "a socket"],
    ),
    # a name Ansible would look up outside host_vars/ (host_vars/../../x.yml)
    ("host-name-dot-dot", _named("../../x"), ["host_vars", "host ../../x", "one file name"]),
    ("host-name-slash", _named("a/b"), ["host_vars", "host a/b", "no '/'"]),
    # executables and files of unknown type in the inventory directory
    ("executable", _file("dynamic", "#!/bin/sh\necho '{}'\n", 0o755), ["dynamic", "executable", "never"]),
    ("executable-yml", _file("more.yml", "all: {}\n", 0o755), ["more.yml", "executable"]),
    ("ini-file", _file("hosts.ini", "[b300]\nb300-test\n"), ["hosts.ini", "not an inventory file", "YAML"]),
]


def _cli(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess, so that a hang is a failed test (timeout), not a stuck suite."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "provision", *argv], capture_output=True, text=True, timeout=20, env=full_env, cwd=cwd
    )


@pytest.mark.parametrize(("edit", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_inventory(inventory: Path, edit: Edit, expected: list[str]) -> None:
    argv = edit(inventory) or ["--host", "b300-test"]
    proc = _cli("plan", "--inventory", str(inventory), *argv)
    assert_refused(proc.returncode, proc.stdout, proc.stderr, expected)


def test_only_the_vars_files_ansible_loads_are_read(inventory: Path) -> None:
    # no group `nobody`, no host `ghost`: Ansible never opens these, and neither does the check
    _write("group_vars/nobody.yml", BOMB)(inventory)
    _write("host_vars/ghost.yml", BOMB)(inventory)
    proc = _cli("plan", "--json", "--inventory", str(inventory), "--host", "b300-test")
    assert proc.returncode == 0, proc.stderr


def test_dotted_host_vars_are_what_ansible_reads(inventory: Path) -> None:
    # the checked file is the one Ansible loads: its key reaches the resolver, which names the file
    _named(DOTTED, _write(f"host_vars/{DOTTED}.yml", "dflash_service: {colour: blue}\n"))(inventory)
    proc = _cli("plan", "--json", "--inventory", str(inventory), "--host", DOTTED)
    assert_refused(proc.returncode, proc.stdout, proc.stderr, [f"host_vars/{DOTTED}.yml:1", "colour", "unknown key"])


def _plain_hosts(count: int) -> str:
    """A plain inventory: no anchors, no aliases, six YAML nodes per host."""
    hosts = "".join(
        f"        h{i:05d}.example.invalid: {{ansible_host: 10.0.0.1, ansible_port: 22}}\n" for i in range(count)
    )
    return f"all:\n  children:\n    b300:\n      hosts:\n{hosts}"


def test_a_large_plain_inventory_is_no_alias_bomb(tmp_path: Path) -> None:
    # 120,000 nodes of its own: more than MAX_NODES, none added by an alias
    from provision.inventory.reader import MAX_NODES, _check_aliases

    text = _plain_hosts(20_000)
    nodes = (yaml.ScalarEvent, yaml.CollectionStartEvent)
    assert sum(isinstance(e, nodes) for e in yaml.parse(text, Loader=yaml.CSafeLoader)) > MAX_NODES
    _check_aliases(tmp_path / "hosts.yml", text)


def test_an_alias_bomb_in_a_large_inventory_is_refused(tmp_path: Path) -> None:
    from provision.errors import InputError
    from provision.inventory.reader import _check_aliases

    bomb = "".join("    " + line for line in BOMB.splitlines(keepends=True))
    with pytest.raises(InputError, match="alias \\*l"):
        _check_aliases(tmp_path / "hosts.yml", _plain_hosts(20_000) + "  vars:\n" + bomb)


def test_aliases_count_what_they_add(tmp_path: Path) -> None:
    from provision.errors import InputError
    from provision.inventory.reader import MAX_NODES, _check_aliases

    # one anchored list of 1,000 scalars: each alias adds 1,000 nodes
    anchor = f"base: &b [{', '.join(['x'] * 1000)}]\n"
    _check_aliases(tmp_path / "ok.yml", anchor + "".join(f"k{i}: *b\n" for i in range(MAX_NODES // 1001)))
    with pytest.raises(InputError, match="add more than"):
        _check_aliases(tmp_path / "bad.yml", anchor + "".join(f"k{i}: *b\n" for i in range(MAX_NODES // 1000 + 1)))


def test_empty_provision_inventory_is_not_the_current_directory(tmp_path: Path) -> None:
    # an inventory-looking current directory that must not be read
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    b300-test:\n")
    proc = _cli("plan", "--host", "b300-test", env={"PROVISION_INVENTORY": ""}, cwd=tmp_path)
    assert_refused(proc.returncode, proc.stdout, proc.stderr, ["PROVISION_INVENTORY", "is empty", "unset it"])


def test_empty_inventory_option(run) -> None:
    assert_refused(*run("plan", "--host", "b300-test", "--inventory", ""), ["--inventory", "is empty"])


def test_provision_inventory_names_the_inventory(inventory: Path) -> None:
    proc = _cli("plan", "--json", "--host", "b300-test", env={"PROVISION_INVENTORY": str(inventory)}, cwd=inventory)
    assert proc.returncode == 0, proc.stderr


SECRET_FILES = {
    "ssh-key": f"-----BEGIN OPENSSH PRIVATE KEY-----\n{SECRET}\n-----END OPENSSH PRIVATE KEY-----\n",
    "shadow": f"root:$6${SECRET}:19000:0:99999:7:::\nbin:*:19000:0:99999:7:::\n",
    "env.yml": f"API_KEY: {SECRET}\n",
    "hosts-as-text.yml": f"all:\n  hosts: {SECRET}\n",
    "vars-as-text.yml": f"all:\n  hosts:\n    b300-test:\n  vars: {SECRET}\n",
    "token.json": f'{{"token": "{SECRET}"}}\n',
    "broken.yml": f"token: [{SECRET}, '{SECRET}\n",
    "group-list.yml": f"- {SECRET}\n",
}


@pytest.mark.parametrize("name", SECRET_FILES)
def test_not_an_inventory_echoes_nothing(run, tmp_path: Path, name: str) -> None:
    secret_file = tmp_path / name
    secret_file.write_text(SECRET_FILES[name])
    rc, out, err = run("plan", "--host", "b300-test", "--inventory", str(secret_file))
    assert_refused(rc, out, err, [str(secret_file)])
    assert SECRET not in out + err


def test_secret_directory_echoes_nothing(run, tmp_path: Path) -> None:
    (tmp_path / "id_ed25519").write_text(SECRET_FILES["ssh-key"])
    (tmp_path / "id_ed25519.pub").write_text(f"ssh-ed25519 {SECRET}\n")
    rc, out, err = run("plan", "--host", "b300-test", "--inventory", str(tmp_path))
    assert_refused(rc, out, err, ["id_ed25519"])
    assert SECRET not in out + err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_unreadable_group_vars(run, inventory: Path) -> None:
    (inventory / "group_vars" / "b300.yml").chmod(0)
    assert_refused(*run("plan", "--host", "b300-test", "--inventory", str(inventory)), ["b300.yml", "cannot be read"])


def test_the_current_directory_vars_are_not_read(inventory: Path, tmp_path: Path) -> None:
    # ansible-playbook reads group_vars/ beside the playbook; the CLI's reader must not read the caller's instead
    cwd = tmp_path / "elsewhere"
    _write("group_vars/all.yml", "dflash_service: {colour: blue}\n")(cwd)
    os.mkfifo(cwd / "group_vars" / "b300.yml")  # would block whoever opens it
    proc = _cli("plan", "--json", "--inventory", str(inventory), "--host", "b300-test", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
