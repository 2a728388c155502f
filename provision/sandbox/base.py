"""The Debian base tree, built once and shared read-only (overlayfs lower layer) by every host."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from provision.sandbox.layout import APT_PROXY_PORT, BASE_PACKAGES, GATEWAY, SUITE, base_dir
from provision.sandbox.system import sh

STAMP = f"{SUITE} {BASE_PACKAGES} proxy {GATEWAY}:{APT_PROXY_PORT}\n"


def debian_mirror() -> str:
    """The Debian mirror this machine's apt already uses (the only one it reaches)."""
    for path in sorted(Path("/etc/apt").glob("sources.list.d/*.sources")) + [Path("/etc/apt/sources.list")]:
        if not path.is_file():
            continue
        text = path.read_text()
        match = re.search(r"^URIs:\s*(\S+/debian)/?\s*$", text, re.M) or re.search(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)/?\s", text, re.M
        )
        if match:
            return match.group(1)
    return "http://deb.debian.org/debian"


def ensure_base() -> bool:
    """Build the base tree unless one with the same recipe exists. True when it was built now."""
    base = base_dir()
    stamp = base / "etc" / "dflash-sandbox-base"
    if stamp.is_file() and stamp.read_text() == STAMP:
        return False
    building = base.with_name("base.building")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    mirror = debian_mirror()
    sh("debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", SUITE, str(building), mirror, timeout=1800)
    (building / "etc/apt/apt.conf.d/01dflash-proxy").write_text(
        f'Acquire::http::Proxy "http://{GATEWAY}:{APT_PROXY_PORT}";\n'
    )
    (building / "etc/apt/sources.list").write_text(f"deb {mirror} {SUITE} main\ndeb {mirror} {SUITE}-updates main\n")
    # each host gets its own host keys at first boot preparation
    for key in (building / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    sh("chroot", str(building), "apt-get", "clean")
    stamp_path = building / "etc" / "dflash-sandbox-base"
    stamp_path.write_text(STAMP)
    shutil.rmtree(base, ignore_errors=True)
    building.rename(base)
    return True
