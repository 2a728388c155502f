"""`provision sandbox up|down|status|exec`: the local test hosts."""

from __future__ import annotations

import argparse

from rich.console import Console

from provision.errors import InputError


def run(args: argparse.Namespace, console: Console) -> int:
    from provision.sandbox import manage

    if args.verb == "up":
        types = manage.parse_types(args.hosts)
        with console.status("bringing up sandbox hosts (the first run builds the Debian base tree)"):
            hosts = manage.up(types)
        for host in hosts:
            console.print(f"{host.name} ({host.type}) at {host.address}: running", highlight=False, markup=False)
        console.print(f"inventory: {manage.inventory_dir()}", highlight=False, markup=False)
    elif args.verb == "down":
        manage.down()
        console.print("sandbox down: no hosts, mounts, namespaces, cgroups or bridge left")
    elif args.verb == "status":
        rows = manage.status()
        for host, state in rows:
            console.print(f"{host.name} ({host.type}) {host.address}: {state}", highlight=False, markup=False)
        if not rows:
            console.print("no sandbox hosts")
    else:
        command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not command:
            raise InputError(
                "exec", args.name, "give a command after --, like: provision sandbox exec b300 -- uname -a"
            )
        return manage.exec_in(args.name, command)
    return 0
