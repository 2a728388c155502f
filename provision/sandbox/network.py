"""The private bridge, one network namespace per host, and the apt proxy on the bridge address."""

from __future__ import annotations

import subprocess
from pathlib import Path

from provision.errors import SandboxError
from provision.sandbox.layout import APT_PROXY_PORT, BRIDGE, GATEWAY, STATE, SandboxHost
from provision.sandbox.system import pid_alive, sh, terminate, wait_port


def _link_exists(name: str, netns: str | None = None) -> bool:
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    return sh(*prefix, "link", "show", name, check=False).returncode == 0


def ensure_bridge() -> None:
    if not _link_exists(BRIDGE):
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
    if GATEWAY not in sh("ip", "-4", "addr", "show", "dev", BRIDGE).stdout:
        sh("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")


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


def remove_netns(host: SandboxHost) -> None:
    # deleting the namespace destroys its veth end, and with it the peer on the bridge
    if Path(f"/run/netns/{host.netns}").exists():
        sh("ip", "netns", "del", host.netns)
    if _link_exists(host.veth):
        sh("ip", "link", "del", host.veth, check=False)  # may vanish on its own meanwhile
    if _link_exists(host.veth):
        raise SandboxError(f"{host.veth} is still on the bridge after its namespace was removed")


def _proxy_dir() -> Path:
    return STATE / "apt-proxy"


def ensure_apt_proxy() -> None:
    """apt-cacher-ng in the foreground on the bridge address, with no Remap rules (they answer 503)."""
    conf = _proxy_dir() / "conf"
    pid_file = _proxy_dir() / "pid"
    if pid_file.exists() and pid_alive(int(pid_file.read_text())):
        return
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
    pid_file.write_text(str(proc.pid))
    wait_port(GATEWAY, APT_PROXY_PORT, 15)


def stop_apt_proxy() -> None:
    pid_file = _proxy_dir() / "pid"
    if not pid_file.exists():
        return
    terminate(int(pid_file.read_text()), grace_s=5)
    pid_file.unlink()
