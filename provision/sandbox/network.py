"""The private bridge, one network namespace per host, and the apt proxy on the bridge address."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from provision.errors import SandboxError
from provision.sandbox.layout import APT_PROXY_PORT, BRIDGE, GATEWAY, NETNS_NAME, STATE, VETH_NAME, SandboxHost
from provision.sandbox.system import end_processes, processes, sh, wait_port

NETNS_DIR = Path("/run/netns")


def _link_exists(name: str, netns: str | None = None) -> bool:
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    return sh(*prefix, "link", "show", name, check=False).returncode == 0


def ensure_bridge() -> None:
    if not _link_exists(BRIDGE):
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
    if GATEWAY not in sh("ip", "-4", "addr", "show", "dev", BRIDGE).stdout:
        sh("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")


def bridge_exists() -> bool:
    return _link_exists(BRIDGE)


def remove_bridge() -> None:
    if _link_exists(BRIDGE):
        sh("ip", "link", "del", BRIDGE)


def ensure_netns(host: SandboxHost) -> None:
    if not Path(f"/run/netns/{host.netns}").exists():
        sh("ip", "netns", "add", host.netns)
    if not _link_exists("eth0", host.netns):
        if _link_exists(host.veth):
            sh("ip", "link", "del", host.veth)
        sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", f"{host.veth}c")
        sh("ip", "link", "set", host.veth, "master", BRIDGE, "up")
        sh("ip", "link", "set", f"{host.veth}c", "netns", host.netns)
        sh("ip", "-n", host.netns, "link", "set", f"{host.veth}c", "name", "eth0")
        sh("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
    sh("ip", "-n", host.netns, "link", "set", "eth0", "up")
    sh("ip", "-n", host.netns, "link", "set", "lo", "up")
    if "default" not in sh("ip", "-n", host.netns, "route", "show").stdout:
        sh("ip", "-n", host.netns, "route", "add", "default", "via", GATEWAY)


def netns_names() -> list[str]:
    """This sandbox's network namespaces, registered or not, by exact name (others' never match)."""
    return sorted(n for n in os.listdir(NETNS_DIR) if NETNS_NAME.fullmatch(n)) if NETNS_DIR.is_dir() else []


def remove_netns(name: str) -> None:
    # deleting the namespace destroys its veth end, and with it the peer on the bridge
    sh("ip", "netns", "del", name)


def veths() -> list[str]:
    """This sandbox's host-side veth ends, by exact name."""
    names = (
        line.split(":")[1].strip().partition("@")[0] for line in sh("ip", "-o", "link", "show").stdout.splitlines()
    )
    return sorted(n for n in names if VETH_NAME.fullmatch(n))


def remove_veths() -> None:
    for name in veths():
        sh("ip", "link", "del", name, check=False)  # may vanish on its own meanwhile, with its namespace
    if left := veths():
        raise SandboxError(f"{', '.join(left)} still on the bridge")


def _proxy_dir() -> Path:
    return STATE / "apt-proxy"


def proxy_pids() -> list[int]:
    """The apt-cacher-ng processes running on this sandbox's config, found in /proc (no pid file to go stale)."""
    conf = str(_proxy_dir() / "conf")
    return sorted(
        pid for pid, (_, argv) in processes().items() if Path(argv[0]).name == "apt-cacher-ng" and conf in argv
    )


def ensure_apt_proxy() -> None:
    """apt-cacher-ng in the foreground on the bridge address, with no Remap rules (they answer 503)."""
    if proxy_pids():
        return
    conf = _proxy_dir() / "conf"
    for sub in ("conf", "cache", "log"):
        (_proxy_dir() / sub).mkdir(parents=True, exist_ok=True)
    (conf / "acng.conf").write_text(
        f"CacheDir: {_proxy_dir() / 'cache'}\nLogDir: {_proxy_dir() / 'log'}\n"
        "SupportDir: /usr/lib/apt-cacher-ng\n"
        f"BindAddress: {GATEWAY}\nPort: {APT_PROXY_PORT}\nPidFile: {_proxy_dir() / 'acng.pid'}\nForeGround: 1\n"
    )
    log = open(_proxy_dir() / "log" / "console.log", "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(
        ["apt-cacher-ng", "-c", str(conf)], stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
    )
    wait_port(GATEWAY, APT_PROXY_PORT, 15, alive=lambda: proc.poll() is None)


def stop_apt_proxy() -> None:
    if left := end_processes(proxy_pids(), grace_s=5):
        raise SandboxError(f"apt-cacher-ng pids {left} survived SIGKILL")
