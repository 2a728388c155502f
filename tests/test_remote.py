"""Day-2 connections (provision/remote/connection.py): built from the inventory's variables exactly, host keys
checked as ssh checks them. No sandbox: an in-process paramiko server stands in for a host's sshd."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from fabric import Connection
from invoke.context import Context, MockContext
from invoke.runners import Result

from provision.errors import InputError
from provision.inventory.reader import Inventory
from provision.remote.connection import Remote, for_host

INVENTORY = """
all:
  vars:
    keys: /srv/keys
  hosts:
    gpu1:
      ansible_host: 10.0.0.5
      ansible_port: 2222
      ansible_user: deploy
      ansible_ssh_private_key_file: "{{ keys }}/id_ed25519"
      ansible_ssh_common_args: >-
        -o UserKnownHostsFile=KNOWN_HOSTS -o StrictHostKeyChecking=yes -o ControlPath=/tmp/cm-%C
      ansible_become_user: sglang
    gpu2:
      ansible_host: 10.0.0.6
      ansible_user: root
      ansible_ssh_extra_args: -o ProxyCommand="nc -x proxy:1080 %h %p"
    gpu3:
      ansible_host: 10.0.0.7
      ansible_user: ops
      ansible_become: false
      ansible_ssh_common_args: -J jump.example
    control:
      ansible_connection: local
"""


@pytest.fixture
def inventory(tmp_path: Path) -> Inventory:
    known = tmp_path / "known_hosts"
    key = paramiko.RSAKey.generate(2048)
    known.write_text(f"[10.0.0.5]:2222 {key.get_name()} {key.get_base64()}\n")
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY.replace("KNOWN_HOSTS", str(known)))
    return Inventory(path)


def test_the_connection_is_the_inventorys(inventory: Inventory, tmp_path: Path) -> None:
    remote = for_host(inventory, "gpu1")
    assert remote is for_host(inventory, "gpu1")  # one connection per host
    conn = remote.runner
    assert isinstance(conn, Connection)
    assert (conn.host, conn.port, conn.user) == ("10.0.0.5", 2222, "deploy")
    assert conn.connect_kwargs["key_filename"] == ["/srv/keys/id_ed25519"]  # templated, as Ansible does
    assert conn.ssh_config["userknownhostsfile"] == str(tmp_path / "known_hosts")
    assert "controlpath" not in conn.ssh_config  # OpenSSH's connection sharing: dropped
    assert isinstance(conn.client._policy, paramiko.RejectPolicy)
    assert conn.client.get_host_keys().lookup("[10.0.0.5]:2222") is None  # loaded as "system" keys: never written
    assert conn.client._system_host_keys.lookup("[10.0.0.5]:2222") is not None
    assert (remote.sudo_user, remote.sudo_password) == ("sglang", None)
    assert conn.connect_timeout == 10


def test_ssh_args_become_fabrics_gateway_and_become_follows_the_playbooks(inventory: Inventory) -> None:
    root = for_host(inventory, "gpu2")
    assert isinstance(root.runner, Connection) and root.runner.gateway == "nc -x proxy:1080 10.0.0.6 22"
    assert root.sudo_user is None  # becomes root (the playbooks' `become: true`) and already is
    ops = for_host(inventory, "gpu3")
    assert isinstance(ops.runner, Connection) and isinstance(ops.runner.gateway, Connection)
    assert ops.runner.gateway.host == "jump.example"
    assert isinstance(ops.runner.gateway.client._policy, paramiko.RejectPolicy)  # the jump host is checked too
    assert ops.sudo_user is None  # ansible_become: false
    assert Remote.from_vars("h", {"ansible_host": "h", "ansible_user": "ops"}).sudo_user == "root"
    local = for_host(inventory, "control")
    assert isinstance(local.runner, Context) and local.local


def test_what_fabric_cannot_do_is_refused_by_name() -> None:
    with pytest.raises(InputError, match="-C: day-2 commands connect through Fabric"):
        Remote.from_vars("h", {"ansible_ssh_common_args": "-C -o Compression=yes"})
    with pytest.raises(InputError, match="ansible_become_method"):
        Remote.from_vars("h", {"ansible_become_method": "su"})


def test_a_local_connection_runs_here_and_never_raises_or_echoes(capfd: pytest.CaptureFixture[str]) -> None:
    remote = Remote.from_vars("control", {"ansible_connection": "local", "ansible_become": "false"})
    script = "x = 1\n" * 10000  # 60 kB (80 kB in base64), as fast as a byte
    result = remote.run("cat; echo oops >&2; exit 3", stdin=script, timeout=10)
    assert (result.return_code, result.stdout, result.stderr) == (3, script, "oops\n")
    assert capfd.readouterr() == ("", "")


def test_become_is_sudo_that_never_prompts_or_fabrics_sudo_with_the_password() -> None:
    no_password = MockContext(run={"sudo -n -H -u sglang sh -c 'cat /etc/k; true'": Result("k\n")})
    assert Remote("h", no_password, sudo_user="sglang", sudo_password=None).run("cat /etc/k; true").stdout == "k\n"
    piped = "sudo -n -H -u root sh -c 'echo aGk= | base64 -d | sh -c '\"'\"'python3 -'\"'\"''"
    assert Remote("h", MockContext(run={piped: Result("hi\n")}), "root", None).run("python3 -", stdin="hi").ok
    with_password = MockContext(sudo={"sh -c 'systemctl --version'": Result("systemd 252\n")})
    assert Remote("h", with_password, "root", "s3cret").run("systemctl --version").stdout == "systemd 252\n"


@contextlib.contextmanager
def sshd(host_key: paramiko.PKey) -> Iterator[int]:
    """A server that completes the key exchange and takes no key login: enough to see the host key checked."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                transport = paramiko.Transport(client)
                transport.add_server_key(host_key)
                with contextlib.suppress(paramiko.SSHException, EOFError):
                    transport.start_server(server=paramiko.ServerInterface())

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


@pytest.mark.parametrize(
    ("known", "refusal"),
    [("none", "not found in known_hosts"), ("other", "does not match"), ("same", "Bad authentication type")],
)
def test_unknown_or_changed_host_keys_are_refused(tmp_path: Path, known: str, refusal: str) -> None:
    host_key, other = paramiko.RSAKey.generate(2048), paramiko.RSAKey.generate(2048)
    client_key = tmp_path / "id_ed25519"  # as the sandbox's: paramiko reads it in OpenSSH's format
    client_key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption())
    )
    with sshd(host_key) as port:
        listed = {"none": [], "other": [other], "same": [host_key]}[known]
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text("".join(f"[127.0.0.1]:{port} {k.get_name()} {k.get_base64()}\n" for k in listed))
        remote = Remote.from_vars("h", {
            "ansible_host": "127.0.0.1", "ansible_port": str(port), "ansible_user": "root",
            "ansible_ssh_private_key_file": str(client_key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes",
        })  # fmt: skip
        result = remote.run("true", timeout=30)
    assert result.return_code == 255  # as ssh's
    assert refusal in result.stderr and result.stderr.startswith("cannot reach h: ")
