"""Day-2 commands on a host through one Fabric connection, reached the way Ansible reaches it.

The inventory's connection variables map so:
  ansible_host, ansible_port, ansible_user, ansible_ssh_private_key_file
      -> fabric.Connection(host, port, user, connect_kwargs={"key_filename": ...})
  ansible_ssh_common_args, ansible_ssh_extra_args (`-o Key=Value`, `-J jump`)
      -> an ssh_config that Fabric reads itself (ProxyCommand and ProxyJump become its gateway, ConnectTimeout, ...).
      UserKnownHostsFile and StrictHostKeyChecking go to paramiko, since Fabric would accept any host key: the
      known_hosts files are loaded and an unknown key is refused (ssh's BatchMode answer to `ask`), unless checking
      is no/off/accept-new (then a new key is accepted for this process, never written). ControlPath, ControlMaster
      and ControlPersist are OpenSSH's connection sharing: paramiko has none and needs none (one transport per host
      serves every command of a run), so they are dropped, as is BatchMode (paramiko never prompts).
  ansible_become, ansible_become_user, ansible_become_password
      -> sudo. The playbooks become root (`become: true`), so day-2 does too unless the inventory says
      ansible_become: false; a login that already is the become user runs without sudo. Without a become password,
      `sudo -n` (fails at once where a password is wanted); with one, Fabric's Connection.sudo answers the prompt.
  ansible_connection: local -> invoke's local runner, the same interface.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import getpass
import shlex
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean
from fabric import Config, Connection
from invoke.context import Context
from invoke.exceptions import AuthFailure
from invoke.runners import Result
from paramiko import AutoAddPolicy, RejectPolicy, SSHConfig, SSHException

from provision.errors import InputError
from provision.inventory.reader import Inventory

# not in Inventory.connection(): read here with the host's other variables
MORE_VARS = ("ansible_become", "ansible_become_user", "ansible_become_password", "ansible_become_method",
               "ansible_ssh_extra_args")  # fmt: skip
UNREACHABLE = 255  # ssh's own exit code when it cannot reach the host; the callers report it like a failed command
DROPPED_OPTIONS = {"controlpath", "controlmaster", "controlpersist", "batchmode"}
ANSIBLE_CONNECT_TIMEOUT_S = 10  # Ansible's default `timeout`


def _ssh_config(name: str, args: str) -> SSHConfig:
    """`-o Key=Value`, `-o Key Value`, `-oKey=Value` and `-J jump` as an ssh_config for every host, followed by the
    user's and the system's ssh_config files, which ssh (so Ansible) reads after its command line's options."""
    lines, words = [], shlex.split(args)
    while words:
        word = words.pop(0)
        if word in ("-o", "-J") and not words:
            raise InputError(f"inventory (host {name})", "ansible_ssh_common_args", f"{word} without a value")
        if word == "-J":
            lines.append(f"ProxyJump {words.pop(0)}")
        elif word.startswith("-o"):
            option = word[2:] or words.pop(0)
            key, _, value = option.replace("=", " ", 1).partition(" ")
            if key.lower() not in DROPPED_OPTIONS:
                lines.append(f"{key} {value.strip()}")
        else:
            raise InputError(
                f"inventory (host {name})",
                "ansible_ssh_common_args",
                f"{word}: day-2 commands connect through Fabric, which takes ssh options as -o Key=Value and -J only",
            )
    files = [Path(p).expanduser() for p in ("~/.ssh/config", "/etc/ssh/ssh_config")]
    text = "Host *\n" + "".join(f"  {line}\n" for line in lines)
    return SSHConfig.from_text(text + "".join(f"\n{f.read_text()}\n" for f in files if f.is_file()))


@dataclass
class Remote:
    name: str
    runner: Connection | Context  # both run() and sudo() with invoke's keywords
    sudo_user: str | None  # None: run as the login user
    sudo_password: str | None

    @property
    def local(self) -> bool:
        return not isinstance(self.runner, Connection)

    @classmethod
    def from_vars(cls, name: str, conn: dict[str, str]) -> Remote:
        become = boolean(conn.get("ansible_become", True), strict=False)
        method = conn.get("ansible_become_method", "sudo")
        if become and method != "sudo":
            raise InputError(f"inventory (host {name})", "ansible_become_method",
                             f"{method}: day-2 commands become the become user through sudo only")  # fmt: skip
        become_user = conn.get("ansible_become_user", "root")
        password = conn.get("ansible_become_password")
        overrides = {"sudo": {"password": password}, "timeouts": {"connect": ANSIBLE_CONNECT_TIMEOUT_S}}
        if conn.get("ansible_connection") == "local":
            login = getpass.getuser()
            runner = Context(Config(overrides=overrides))
            return cls(name, runner, become_user if become and become_user != login else None, password)
        args = " ".join(conn.get(k, "") for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args"))
        config = Config(ssh_config=_ssh_config(name, args), overrides=overrides)
        key = conn.get("ansible_ssh_private_key_file")
        connection = Connection(
            conn.get("ansible_host", name),
            user=conn.get("ansible_user"),
            port=int(conn["ansible_port"]) if "ansible_port" in conn else None,
            config=config,
            connect_kwargs={"key_filename": [key]} if key else {},
        )
        _check_host_keys(connection)
        login = connection.user
        return cls(name, connection, become_user if become and become_user != login else None, password)

    def run(self, script: str, stdin: str | None = None, timeout: float | None = None, **kwargs: Any) -> Result:
        """Run a shell script on the host; a non-zero exit, or no connection (255), is returned, never raised."""
        if stdin is not None:
            # in the command line, not on invoke's in_stream, which writes a byte per 10 ms (the switch script: 100 s);
            # the remote shell's argument may reach 128 KiB
            script = f"echo {base64.b64encode(stdin.encode()).decode()} | base64 -d | sh -c {shlex.quote(script)}"
        options: dict[str, Any] = {"warn": True, "hide": True, "timeout": timeout, "in_stream": False, **kwargs}
        try:
            if self.sudo_user is None:
                return self.runner.run(script, **options)
            as_user = f"sh -c {shlex.quote(script)}"
            if self.sudo_password is None:  # -n: fail at once where sudo wants a password, never wait for one
                return self.runner.run(f"sudo -n -H -u {shlex.quote(self.sudo_user)} {as_user}", **options)
            return self.runner.sudo(as_user, user=self.sudo_user, **options)  # Fabric answers sudo's prompt
        except (SSHException, OSError) as err:
            return Result(command=script, exited=UNREACHABLE, stderr=f"cannot reach {self.name}: {err}")
        except AuthFailure:
            return Result(command=script, exited=1, stderr=f"sudo on {self.name} refused ansible_become_password")

    @contextlib.contextmanager
    def forward(self, address: str, port: int) -> Iterator[int]:
        """A local port forwarded over the connection to address:port as the host reaches it; yields the port."""
        assert isinstance(self.runner, Connection), "a local connection needs no forward"
        with socket.socket() as probe:  # a free port: Fabric's listener binds the number it is given
            probe.bind(("127.0.0.1", 0))
            local = probe.getsockname()[1]
        self.runner.open()
        with self.runner.forward_local(local, port, remote_host=address, local_host="127.0.0.1"):
            deadline = time.monotonic() + 10
            while True:  # Fabric starts its listener in a thread and returns before it is bound
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", local), timeout=1):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cannot forward 127.0.0.1:{local} to {self.name}'s {address}:{port}")
                time.sleep(0.05)
            yield local

    def stream(self, script: str, follow: bool) -> int:
        """Run with the output passed straight through (logs). Following runs on a pty, where Ctrl-C reaches it."""
        return self.run(script, hide=False, pty=follow).return_code


def _check_host_keys(connection: Connection) -> None:
    """Host keys as ssh checks them (Fabric itself accepts any): on the connection and on each jump host."""
    hop: Any = connection
    while isinstance(hop, Connection):
        files = hop.ssh_config.get("userknownhostsfile", "~/.ssh/known_hosts").split()
        for path in (Path(f).expanduser() for f in files):
            if path.is_file():  # as ssh: a missing file knows no hosts; "system" keys are never written back
                hop.client.load_system_host_keys(str(path))
        accept = hop.ssh_config.get("stricthostkeychecking", "yes").lower() in ("no", "off", "accept-new")
        hop.client.set_missing_host_key_policy(AutoAddPolicy() if accept else RejectPolicy())
        hop = hop.gateway


@functools.cache
def for_host(inventory: Inventory, host: str) -> Remote:
    """The host's one Remote for this process: every day-2 command and the sweep's tunnel share its connection."""
    connection = inventory.connection(host)
    hostvars = inventory.hostvars(host)
    more = {k: str(hostvars.template(hostvars.raw[k])) for k in MORE_VARS if hostvars.raw.get(k) is not None}
    return Remote.from_vars(host, {**connection, **more})
