#!/usr/bin/env python3
"""Run a command under a systemd unit's syscall sandbox, rebuilt without systemd (for hosts that have none).

Reads the unit's SystemCallFilter=, SystemCallErrorNumber=, SystemCallArchitectures=, RestrictAddressFamilies=,
NoNewPrivileges= and CapabilityBoundingSet= lines with systemd's semantics, expands the @groups from
syscall_groups.json (systemd-analyze syscall-filter's own expansion, shipped beside this as ../data/), loads
the same seccomp filters through libseccomp (ctypes: no python binding needed) and execs the command.

  seccomp_harness.py UNIT -- python3 gpu_smoke.py
  seccomp_harness.py UNIT --print          # the expanded allow list, one name a line
Stdlib only: it runs with whatever Python the host has, and nothing from `provision`.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import json
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_GROUPS = Path(__file__).resolve().parent.parent / "data" / "syscall_groups.json"

# libseccomp's seccomp.h
SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_ACT_TRAP = 0x00030000
SCMP_ACT_LOG = 0x7FFC0000
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_FLTATR_ACT_BADARCH = 2
SCMP_FLTATR_CTL_NNP = 3
SCMP_FLTATR_CTL_LOG = 6
SCMP_CMP_LT = 2
SCMP_CMP_EQ = 4
SCMP_CMP_GT = 6
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
# linux/capability.h, in number order: CapabilityBoundingSet= names them
CAPS = (
    "CAP_CHOWN CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_FSETID CAP_KILL CAP_SETGID CAP_SETUID "
    "CAP_SETPCAP CAP_LINUX_IMMUTABLE CAP_NET_BIND_SERVICE CAP_NET_BROADCAST CAP_NET_ADMIN CAP_NET_RAW "
    "CAP_IPC_LOCK CAP_IPC_OWNER CAP_SYS_MODULE CAP_SYS_RAWIO CAP_SYS_CHROOT CAP_SYS_PTRACE CAP_SYS_PACCT "
    "CAP_SYS_ADMIN CAP_SYS_BOOT CAP_SYS_NICE CAP_SYS_RESOURCE CAP_SYS_TIME CAP_SYS_TTY_CONFIG CAP_MKNOD CAP_LEASE "
    "CAP_AUDIT_WRITE CAP_AUDIT_CONTROL CAP_SETFCAP CAP_MAC_OVERRIDE CAP_MAC_ADMIN CAP_SYSLOG CAP_WAKE_ALARM "
    "CAP_BLOCK_SUSPEND CAP_AUDIT_READ CAP_PERFMON CAP_BPF CAP_CHECKPOINT_RESTORE"
).split()


def scmp_act_errno(err: int) -> int:
    return 0x00050000 | (err & 0xFFFF)


class HarnessError(Exception):
    pass


class ScmpArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


@dataclass
class Sandbox:
    """What the unit asks of the kernel, after systemd's parsing rules."""

    allow_list: bool = False  # False with an empty filter: no syscall filter at all
    filter: set[str] = field(default_factory=set)  # allowed names (allow-list) or denied ones (deny-list)
    has_filter: bool = False
    errno_name: str | None = None  # SystemCallErrorNumber=; None: kill the process, as systemd does
    archs: list[str] = field(default_factory=list)
    families_allow: bool | None = None  # None: no RestrictAddressFamilies=
    families: set[str] = field(default_factory=set)
    no_new_privs: bool = False
    caps_bounding: set[str] | None = None  # None: CapabilityBoundingSet= unset, keep what we have
    unknown: list[str] = field(default_factory=list)  # names neither a group nor a syscall systemd knows


def load_groups(path: Path) -> tuple[dict[str, set[str]], str]:
    data = json.loads(path.read_text())
    return {k: set(v) for k, v in data["groups"].items()}, str(data["systemd_version"])


def unit_lines(text: str) -> list[tuple[str, str]]:
    """(key, value) of the [Service] section, in order, continuation lines joined."""
    out: list[tuple[str, str]] = []
    section = ""
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "Service" and "=" in line:
            key, _, value = line.partition("=")
            out.append((key.strip(), value.strip()))
    return out


def _yes(value: str) -> bool:
    return value.lower() in ("1", "yes", "true", "on")


def parse_unit(text: str, groups: dict[str, set[str]]) -> Sandbox:
    """systemd 252's config_parse_syscall_filter and friends, for the directives this harness applies."""
    sb = Sandbox()
    known = groups.get("@known", set())
    for key, value in unit_lines(text):
        if key == "SystemCallFilter":
            if not value:  # an empty assignment resets the list and its mode
                sb.filter, sb.allow_list, sb.has_filter = set(), False, False
                continue
            invert = value.startswith("~")
            if invert:
                value = value[1:]
            if not sb.has_filter:
                # the first line decides: a plain list allows only what is listed, plus @default
                sb.has_filter = True
                sb.allow_list = not invert
                if sb.allow_list:
                    sb.filter |= groups["@default"]
            for word in value.split():
                name = word.split(":", 1)[0]  # a per-name ":ERRNO" changes the action, not membership
                if name.startswith("@"):
                    if name not in groups:
                        sb.unknown.append(name)
                        continue
                    names = groups[name]
                else:
                    if known and name not in known:
                        sb.unknown.append(name)
                    names = {name}
                # systemd's rule: add when the line's sense matches the mode, remove otherwise
                if invert != sb.allow_list:
                    sb.filter |= names
                else:
                    sb.filter -= names
        elif key == "SystemCallErrorNumber":
            sb.errno_name = None if value in ("", "kill") else value
        elif key == "SystemCallArchitectures":
            sb.archs = [] if not value else sb.archs + value.split()
        elif key == "RestrictAddressFamilies":
            if not value:
                sb.families_allow, sb.families = None, set()
                continue
            invert = value.startswith("~")
            words = set(value.lstrip("~").split())
            if sb.families_allow is None:
                sb.families_allow = not invert
            if value == "none":
                sb.families_allow, sb.families = True, set()
            elif invert != sb.families_allow:
                sb.families |= words
            else:
                sb.families -= words
        elif key == "NoNewPrivileges":
            sb.no_new_privs = _yes(value)
        elif key == "CapabilityBoundingSet":
            invert = value.startswith("~")
            words = set(value.lstrip("~").split())
            current = set(CAPS) if sb.caps_bounding is None else sb.caps_bounding
            if not value:
                sb.caps_bounding = set()
            elif invert:
                sb.caps_bounding = current - words
            else:
                sb.caps_bounding = (set() if sb.caps_bounding is None else sb.caps_bounding) | words
    return sb


def errno_action(sb: Sandbox) -> int:
    if sb.errno_name is None:
        return SCMP_ACT_KILL_PROCESS
    number = int(sb.errno_name) if sb.errno_name.isdigit() else getattr(errno, sb.errno_name, None)
    if number is None:
        raise HarnessError(f"SystemCallErrorNumber={sb.errno_name}: not an errno name")
    return scmp_act_errno(number)


def family_number(name: str) -> int:
    number = getattr(socket, name, None)
    if not isinstance(number, int):
        raise HarnessError(f"RestrictAddressFamilies: {name} is not an address family this Python knows")
    return number


class Seccomp:
    """The few libseccomp calls the harness needs."""

    def __init__(self, log_all: bool = False) -> None:
        self.log_all = log_all
        path = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
        try:
            self.lib = ctypes.CDLL(path, use_errno=True)
        except OSError as exc:
            raise HarnessError(f"libseccomp not loadable ({path}): {exc}") from exc
        lib = self.lib
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ScmpArgCmp),
        ]  # fmt: skip
        lib.seccomp_load.argtypes = [ctypes.c_void_p]
        lib.seccomp_release.argtypes = [ctypes.c_void_p]

    def resolve(self, name: str) -> int:
        """The native syscall number; negative when this architecture has no such call."""
        return int(self.lib.seccomp_syscall_resolve_name(name.encode()))

    def build(self, default: int) -> int:
        ctx = self.lib.seccomp_init(default)
        if not ctx:
            raise HarnessError("seccomp_init failed")
        # no_new_privs is the unit's NoNewPrivileges= to set, not libseccomp's to force
        self._check(self.lib.seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0), "seccomp_attr_set(CTL_NNP)")
        if self.log_all:
            # diagnosis: the kernel logs errno (EAFNOSUPPORT) results too, not only kills and SCMP_ACT_LOG
            self._check(self.lib.seccomp_attr_set(ctx, SCMP_FLTATR_CTL_LOG, 1), "seccomp_attr_set(CTL_LOG)")
        return int(ctx)

    def rule(self, ctx: int, action: int, nr: int, *cmps: tuple[int, int, int]) -> None:
        arr = (ScmpArgCmp * max(1, len(cmps)))(*(ScmpArgCmp(a, op, d, 0) for a, op, d in cmps))
        self._check(self.lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr), f"seccomp_rule_add({nr})")

    def load(self, ctx: int) -> None:
        try:
            self._check(self.lib.seccomp_load(ctx), "seccomp_load")
        finally:
            self.lib.seccomp_release(ctx)

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc < 0:
            raise HarnessError(f"{what}: {os.strerror(-rc)}")


def syscall_filter(sb: Sandbox, lib: Seccomp, default_override: int | None) -> tuple[int | None, int, list[str]]:
    """The syscall filter's context (None: the unit has none), the rules added, and names not on this arch."""
    if not sb.has_filter:
        return None, 0, []
    refuse = errno_action(sb) if default_override is None else default_override
    ctx = lib.build(refuse if sb.allow_list else SCMP_ACT_ALLOW)
    if sb.archs == ["native"]:
        # a foreign ABI's calls (x32, i386 via int 0x80) would bypass the list: kill them, as systemd does
        lib._check(lib.lib.seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS), "badarch")
    added, missing = 0, []
    for name in sorted(sb.filter):
        nr = lib.resolve(name)
        if nr < 0:
            missing.append(name)  # another architecture's call (e.g. socketcall): nothing to allow here
            continue
        lib.rule(ctx, SCMP_ACT_ALLOW if sb.allow_list else refuse, nr)
        added += 1
    return ctx, added, missing


def families_filter(sb: Sandbox, lib: Seccomp) -> int | None:
    """systemd's seccomp_restrict_address_families for socket(2): unlisted families get EAFNOSUPPORT."""
    if sb.families_allow is None:
        return None
    ctx = lib.build(SCMP_ACT_ALLOW)
    deny = scmp_act_errno(errno.EAFNOSUPPORT)
    nr = lib.resolve("socket")
    numbers = sorted(family_number(f) for f in sb.families)
    if not sb.families_allow:
        for n in numbers:
            lib.rule(ctx, deny, nr, (0, SCMP_CMP_EQ, n))
    elif not numbers:
        lib.rule(ctx, deny, nr)
    else:
        # below the first, above the last, and each gap between: the shape systemd builds
        lib.rule(ctx, deny, nr, (0, SCMP_CMP_LT, numbers[0]))
        lib.rule(ctx, deny, nr, (0, SCMP_CMP_GT, numbers[-1]))
        for n in range(numbers[0] + 1, numbers[-1]):
            if n not in numbers:
                lib.rule(ctx, deny, nr, (0, SCMP_CMP_EQ, n))
    return ctx


def drop_caps(keep: set[str]) -> list[str]:
    """CapabilityBoundingSet=: drop the rest from the bounding set, so an exec as root gains none of them;
    clear inheritable and ambient too (AmbientCapabilities= empty). Returns the names dropped."""
    libc = ctypes.CDLL(None, use_errno=True)
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    dropped = []
    for nr in range(last + 1):
        name = CAPS[nr] if nr < len(CAPS) else f"cap_{nr}"
        if name in keep:
            continue
        if libc.prctl(PR_CAPBSET_DROP, nr, 0, 0, 0) != 0:
            raise HarnessError(f"prctl(PR_CAPBSET_DROP, {name}): {os.strerror(ctypes.get_errno())}")
        dropped.append(name)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    # capget/capset v3 (two 32-bit words per set): keep effective and permitted, zero inheritable
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capget(header, data) != 0:
        raise HarnessError(f"capget: {os.strerror(ctypes.get_errno())}")
    data[2] = data[5] = 0  # inheritable of each word
    if libc.capset(header, data) != 0:
        raise HarnessError(f"capset: {os.strerror(ctypes.get_errno())}")
    return dropped


def apply(sb: Sandbox, default_override: int | None) -> str:
    """Set up this process as the unit would; returns the summary line."""
    lib = Seccomp(log_all=default_override is not None)
    caps = "kept"
    if sb.caps_bounding is not None and os.geteuid() != 0:
        caps = "not root: an exec gains none"  # and without CAP_SETPCAP the bounding set cannot be changed
    elif sb.caps_bounding is not None:
        dropped = drop_caps(sb.caps_bounding)
        caps = f"bounding set {' '.join(sorted(sb.caps_bounding)) or 'empty'} ({len(dropped)} dropped)"
    libc = ctypes.CDLL(None, use_errno=True)
    if sb.no_new_privs and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise HarnessError(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    ctx, added, missing = syscall_filter(sb, lib, default_override)
    fam_ctx = families_filter(sb, lib)
    # the families filter first: once the syscall filter is in, loading another needs seccomp() allowed
    for c in (fam_ctx, ctx):
        if c is not None:
            lib.load(c)
    mode = "none" if ctx is None else ("allow-list" if sb.allow_list else "deny-list")
    action = {None: "kill-process (SystemCallErrorNumber= unset)"}.get(sb.errno_name, f"errno {sb.errno_name}")
    if default_override is not None:
        action = f"OVERRIDDEN to {hex(default_override)} (diagnosis, not the unit)"
    families = "unrestricted"
    if sb.families_allow is not None:
        families = ("" if sb.families_allow else "~") + (" ".join(sorted(sb.families)) or "none")
    return (
        f"seccomp_harness: mode {mode}, {added} syscalls {'allowed' if sb.allow_list else 'refused'} "
        f"({len(missing)} not on this arch), refused calls: {action}, families {families}, "
        f"archs {' '.join(sb.archs) or 'any'}, no_new_privs {'yes' if sb.no_new_privs else 'no'}, caps {caps}"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("unit", type=Path, help="a systemd unit file (its [Service] section is read)")
    ap.add_argument("--groups", type=Path, default=DEFAULT_GROUPS, help="syscall_groups.json")
    ap.add_argument("--print", action="store_true", help="print the expanded allow list and exit")
    ap.add_argument(
        "--default-action",
        choices=("log", "trap"),
        help="diagnosis: refused calls are logged to the kernel's audit log (log) or raise SIGSYS (trap) instead",
    )
    args = ap.parse_args(argv)
    try:
        groups, version = load_groups(args.groups)
        sb = parse_unit(args.unit.read_text(), groups)
        if sb.unknown:
            print(f"seccomp_harness: unknown to systemd {version}: {' '.join(sb.unknown)}", file=sys.stderr)
        if args.print:
            # a deny-list is printed with systemd's ~ so the two modes never read alike
            for name in sorted(sb.filter):
                print(name if sb.allow_list else f"~{name}")
            return 0
        if not command:
            ap.error("no command: UNIT -- COMMAND [ARG...]")
        override = {"log": SCMP_ACT_LOG, "trap": SCMP_ACT_TRAP, None: None}[args.default_action]
        summary = apply(sb, override)
    except (HarnessError, OSError, KeyError, ValueError) as exc:
        print(f"seccomp_harness: {exc}", file=sys.stderr)
        return 2
    print(f"{summary}, groups from systemd {version}", file=sys.stderr, flush=True)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"seccomp_harness: exec {command[0]}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
