"""`provision sandbox up|down|status|exec`: the local test hosts as a whole."""

from __future__ import annotations

import shlex
import subprocess
from importlib import resources
from pathlib import Path

import yaml

from provision import paths
from provision.errors import InputError
from provision.files import write_atomic
from provision.sandbox import machines, network, teardown
from provision.sandbox.base import ensure_base
from provision.sandbox.layout import (
    HOST_TYPES,
    STATE,
    SandboxHost,
    control_path,
    inventory_dir,
    key_file,
    known_hosts,
    load_hosts,
    save_hosts,
)
from provision.sandbox.lock import exclusive

SSH_OPTIONS = "-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes -o ControlPath={control_path}"


def parse_types(text: str) -> dict[str, int]:
    """`rtx6000,b300:3` -> {type: how many hosts}."""
    wanted: dict[str, int] = {}
    for item in (t.strip() for t in text.split(",")):
        host_type, _, count = item.partition(":")
        if host_type not in HOST_TYPES or not (count or "1").isdigit() or not 1 <= int(count or "1") <= 8:
            raise InputError(
                "--hosts", text, f"unknown item {item!r}; allowed: {', '.join(HOST_TYPES)}, each optionally :N (1-8)"
            )
        wanted[host_type] = int(count or "1")
    return wanted


def up(wanted: dict[str, int]) -> list[SandboxHost]:
    """Bring up the wanted hosts per type; hosts already running are kept as they are."""
    machines.require_state_dir()
    with exclusive("up"):
        hosts = load_hosts()
        if not machines.containers():  # never swap the lower layer under a running host
            ensure_base()
        for host_type, count in wanted.items():
            for number in range(1, count + 1):
                name = f"{host_type}-sbx" + (str(number) if number > 1 else "")
                if all(h.name != name for h in hosts):
                    used = {h.index for h in hosts}
                    index = next(i for i in range(1, 200) if i not in used)
                    hosts.append(SandboxHost(name=name, type=host_type, index=index))
        save_hosts(hosts)
        machines.ensure_key()
        network.ensure_bridge()
        network.ensure_apt_proxy()
        for host in hosts:
            network.ensure_netns(host)
            machines.boot(host)
        write_inventory(hosts)
        return hosts


def down() -> None:
    """Stop every host and remove what the sandbox made: processes, mounts, namespaces, veths, cgroups, bridge,
    apt proxy. Tries every step; raises (one SandboxError) only when something remains, naming it."""
    machines.require_state_dir()
    with exclusive("down"):
        teardown.down(load_hosts())


def status() -> list[tuple[SandboxHost, str]]:
    return [(h, machines.system_state(h) if machines.running(h) else "stopped") for h in load_hosts()]


def find(name: str) -> SandboxHost:
    hosts = load_hosts()
    for host in hosts:
        if name == host.name:
            return host
    names = ", ".join(h.name for h in hosts) or "none (run `provision sandbox up`)"
    raise InputError("HOST", name, f"unknown sandbox host; running: {names}")


def exec_in(name: str, command: list[str]) -> int:
    host = find(name)
    # ssh hands the remote shell one string: quote so that CMD... arrives as the same argv
    return subprocess.run([*machines.ssh_command(host), "--", shlex.join(command)]).returncode


def write_inventory(hosts: list[SandboxHost]) -> None:
    """Groups that mirror production's, the same group_vars (linked), and data/sandbox.yml's differences."""
    text = resources.files("provision").joinpath("data", "sandbox.yml").read_text()
    differences = yaml.safe_load(text.replace("{models}", str(paths.sandbox_models())))
    inv = inventory_dir()
    (inv / "group_vars").mkdir(parents=True, exist_ok=True)
    for source in sorted((paths.example_inventory() / "group_vars").glob("*.yml")):
        link = inv / "group_vars" / source.name
        if not link.is_symlink():
            link.symlink_to(source)
    ssh_options = SSH_OPTIONS.format(known_hosts=known_hosts(), control_path=control_path())
    doc = {
        "all": {
            "children": {
                "sandbox": {
                    "vars": {
                        "ansible_user": "root",
                        "ansible_ssh_private_key_file": str(key_file()),
                        "ansible_ssh_common_args": ssh_options,
                        "ansible_python_interpreter": "/usr/bin/python3",
                        **differences,
                    },
                    "children": {
                        t: {"hosts": {h.name: {"ansible_host": h.address} for h in hosts if h.type == t}}
                        for t in HOST_TYPES
                        if any(h.type == t for h in hosts)
                    },
                }
            }
        }
    }
    header = f"# Written by `provision sandbox up` ({STATE}); the hosts are local nspawn containers.\n"
    write_atomic(inv / "hosts.yml", header + yaml.safe_dump(doc, sort_keys=False), mode=0o644)


def inventory_for_cli() -> Path:
    inv = inventory_dir()
    if not (inv / "hosts.yml").exists():
        raise InputError("--sandbox", "", "no sandbox is up; run `provision sandbox up` first")
    return inv
