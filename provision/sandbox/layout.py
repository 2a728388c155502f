"""Where the sandbox keeps its state, and the addresses it hands out."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from provision.files import write_atomic

STATE = Path(os.environ.get("PROVISION_SANDBOX_DIR", "/var/lib/dflash-provision/sandbox"))
BRIDGE = "dfpbr0"
SUBNET = "10.231.7"
GATEWAY = f"{SUBNET}.1"
APT_PROXY_PORT = 3142
SUITE = "bookworm"
# What every test host has from the start: what ansible (python3-apt: apt in check mode), ssh and
# systemd units need.
BASE_PACKAGES = "openssh-server,python3,python3-apt,systemd,systemd-sysv,sudo,curl,iproute2,dbus,ca-certificates"


@dataclass(frozen=True)
class SandboxHost:
    name: str
    type: str
    index: int

    @property
    def address(self) -> str:
        return f"{SUBNET}.{10 + self.index}"

    @property
    def veth(self) -> str:
        return f"dfpv{self.index}"

    @property
    def dir(self) -> Path:
        return STATE / "hosts" / self.name

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def pid_file(self) -> Path:
        return self.dir / "nspawn.pid"

    @property
    def cgroup(self) -> str:
        return f"dflash-sandbox-{self.name}"


def base_dir() -> Path:
    return STATE / "base"


def key_file() -> Path:
    return STATE / "ssh" / "id_ed25519"


def known_hosts() -> Path:
    return STATE / "ssh" / "known_hosts"


def control_path() -> str:
    """Ansible's ssh master connections to sandbox hosts: here, so that stopping a host can end them
    (a new host at the same address must not inherit a dead master)."""
    return str(STATE / "ssh" / "cm-%C")


def inventory_dir() -> Path:
    return STATE / "inventory"


def _registry() -> Path:
    return STATE / "hosts.json"


def load_hosts() -> list[SandboxHost]:
    if not _registry().exists():
        return []
    return [SandboxHost(**h) for h in json.loads(_registry().read_text())]


def save_hosts(hosts: list[SandboxHost]) -> None:
    _registry().parent.mkdir(parents=True, exist_ok=True)
    write_atomic(_registry(), json.dumps([asdict(h) for h in hosts], indent=2) + "\n", mode=0o644)
