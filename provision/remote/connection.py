"""Day-2 commands on a host, reached the way Ansible reaches it (the inventory's ansible_* variables)."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Remote:
    name: str
    argv: tuple[str, ...]  # the command prefix: ssh ... user@host, or empty for a local connection

    @classmethod
    def from_vars(cls, name: str, conn: dict[str, str]) -> Remote:
        if conn.get("ansible_connection") == "local":
            return cls(name, ())
        argv = ["ssh", "-o", "BatchMode=yes", *shlex.split(conn.get("ansible_ssh_common_args", ""))]
        if "ansible_ssh_private_key_file" in conn:
            argv += ["-i", conn["ansible_ssh_private_key_file"]]
        if "ansible_port" in conn:
            argv += ["-p", conn["ansible_port"]]
        user = conn.get("ansible_user")
        address = conn.get("ansible_host", name)
        return cls(name, (*argv, f"{user}@{address}" if user else address))

    def run(
        self, script: str, stdin: str | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell script on the host; never raises for a non-zero exit."""
        cmd = [*self.argv, "--", script] if self.argv else ["bash", "-c", script]
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)

    def stream(self, script: str) -> int:
        """Run with the output passed straight through (logs --follow)."""
        cmd = [*self.argv, "--", script] if self.argv else ["bash", "-c", script]
        return subprocess.run(cmd).returncode
