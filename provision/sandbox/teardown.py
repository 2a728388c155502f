"""`down`'s sweep: everything of this sandbox is found by what the system shows (/proc, mounts, /run/netns,
cgroup and link names), not by the registry or pid files, which a crash or a racing process can leave wrong.
Every step is tried whatever the others did; what failed and what remains are reported together at the end."""

from __future__ import annotations

import shutil
from collections.abc import Callable

from provision.errors import SandboxError, one_line
from provision.sandbox import machines, network
from provision.sandbox.layout import BRIDGE, STATE, SandboxHost, hosts_dir, inventory_dir, known_hosts, save_hosts
from provision.sandbox.system import end_processes, mounts_under, unmount_all, warn


def leftovers() -> list[str]:
    """What of this sandbox still exists, one item per kind; [] when down is complete."""
    found: dict[str, list[object]] = {
        "containers (nspawn pids)": sorted(machines.containers()),
        "cgroups": list(machines.cgroup_dirs()),
        "mounts": list(mounts_under(STATE)),
        "network namespaces": list(network.netns_names()),
        "veths": list(network.veths()),
        "bridge": [BRIDGE] if network.bridge_exists() else [],
        "apt proxy (pids)": list(network.proxy_pids()),
        "ssh masters (pids)": list(machines.ssh_masters()),
        "host directories": sorted(hosts_dir().iterdir()) if hosts_dir().is_dir() else [],
    }
    return [f"{kind}: {', '.join(map(str, items))}" for kind, items in found.items() if items]


def _remove_host_dirs() -> None:
    for directory in sorted(hosts_dir().iterdir()) if hosts_dir().is_dir() else []:
        # never delete through a mount that is still there: it would reach into whatever is mounted
        if not mounts_under(directory):
            shutil.rmtree(directory)


def down(hosts: list[SandboxHost]) -> None:
    """Stop every container and remove every trace; raises only when something remains, saying what."""
    failures: list[str] = []

    def attempt(what: str, action: Callable[[], object]) -> None:
        try:
            action()
        except Exception as err:  # noqa: BLE001 - any step may fail; the sweep goes on and reports it
            failures.append(f"{what}: {one_line(str(err)) or type(err).__name__}")

    for host in hosts:
        attempt(f"{host.name}'s ssh master", lambda host=host: machines.close_ssh_master(host))
    attempt("ssh masters", lambda: end_processes(machines.ssh_masters(), grace_s=2))
    attempt("containers", lambda: machines.stop_containers(sorted(machines.containers())))
    # before unmounting: a process left in a container's cgroup can hold its root busy
    for directory in machines.cgroup_dirs():
        attempt(f"cgroup {directory}", lambda directory=directory: machines.remove_cgroup(directory))
    attempt("mounts", lambda: unmount_all(STATE))
    for name in network.netns_names():
        attempt(f"netns {name}", lambda name=name: network.remove_netns(name))
    attempt("veths", network.remove_veths)
    attempt("apt proxy", network.stop_apt_proxy)
    attempt("bridge", network.remove_bridge)
    attempt("host directories", _remove_host_dirs)
    attempt("ssh sockets", lambda: [sock.unlink(missing_ok=True) for sock in (STATE / "ssh").glob("cm-*")])
    attempt("known hosts", lambda: known_hosts().unlink(missing_ok=True))
    if left := leftovers():
        # the registry and inventory stay, so that a second `down` (or the user) still knows the hosts
        also = f" (failed: {'; '.join(failures)})" if failures else ""
        raise SandboxError(f"down left behind {'; '.join(left)}{also}")
    attempt("registry", lambda: save_hosts([]))
    attempt("inventory", lambda: shutil.rmtree(inventory_dir(), ignore_errors=True))
    if failures:
        warn(f"down: nothing is left, but on the way: {'; '.join(failures)}")
