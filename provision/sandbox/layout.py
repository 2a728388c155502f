"""Where the sandbox keeps its state, and the addresses it hands out."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from provision.files import write_atomic

# Several sandboxes can run side by side (parallel work on one machine): PROVISION_SANDBOX_ID=1..9 gives one
# its own state, bridge, subnet, namespaces and cgroups. Unset: the one default sandbox.
INSTANCE = os.environ.get("PROVISION_SANDBOX_ID", "")
if INSTANCE not in ("", *"123456789"):
    sys.stderr.write(f"provision: error: PROVISION_SANDBOX_ID: {INSTANCE!r}; allowed: 1-9, or unset\n")
    raise SystemExit(2)
STATE = Path(
    os.environ.get("PROVISION_SANDBOX_DIR", "/var/lib/dflash-provision/sandbox" + (f"-{INSTANCE}" if INSTANCE else ""))
)
BRIDGE = f"dfpbr{INSTANCE or 0}"
SUBNET = f"10.231.{7 + int(INSTANCE or 0)}"
GATEWAY = f"{SUBNET}.1"
APT_PROXY_PORT = 3142
SUITE = "bookworm"
# What every test host has from the start: what ansible (python3-apt: apt in check mode), ssh and
# systemd units need.
BASE_PACKAGES = "openssh-server,python3,python3-apt,systemd,systemd-sysv,sudo,curl,iproute2,dbus,ca-certificates"
HOST_TYPES = ("rtx6000", "b300")

# This sandbox's names where all sandboxes share one namespace (netns, cgroups, links), as exact patterns: a
# cleanup that lists them never takes another sandbox's (the default's names have no instance part).
_HOST_NAME = rf"(?:{'|'.join(HOST_TYPES)})-sbx\d*"
NETNS_NAME = re.compile(rf"sbx{INSTANCE}-{_HOST_NAME}" if INSTANCE else _HOST_NAME)
CGROUP_NAME = re.compile(rf"dflash-sandbox-{INSTANCE}-{_HOST_NAME}" if INSTANCE else rf"dflash-sandbox-{_HOST_NAME}")
VETH_NAME = re.compile(rf"dfp{INSTANCE}v\d+")


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
        return f"dfp{INSTANCE}v{self.index}" if INSTANCE else f"dfpv{self.index}"

    @property
    def netns(self) -> str:
        return f"sbx{INSTANCE}-{self.name}" if INSTANCE else self.name

    @property
    def dir(self) -> Path:
        return hosts_dir() / self.name

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def pid_file(self) -> Path:
        return self.dir / "nspawn.pid"

    @property
    def cgroup(self) -> str:
        return f"dflash-sandbox-{INSTANCE}-{self.name}" if INSTANCE else f"dflash-sandbox-{self.name}"


def hosts_dir() -> Path:
    return STATE / "hosts"


def lock_file() -> Path:
    return STATE / "lock"


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
