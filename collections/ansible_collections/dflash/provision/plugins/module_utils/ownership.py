# The ownership guard's reads and writes: apply changes only what it created. A manifest on the host lists
# what apply created (or claimed while it was absent); a managed path, or the directory of its own that it
# lies in, that exists and is neither in the manifest nor adopted is refused, by name, before anything
# changes. The host probe checks (read-only); the ownership module records.

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import tempfile

MANIFEST = "/var/lib/dflash-provision/owned.json"
SPEC = {
    "manifest": {"type": "path", "default": MANIFEST},
    "paths": {"type": "list", "elements": "dict", "default": []},
    "unit": {"type": "str", "required": False},
    "user": {"type": "str", "required": False},
    "adopt": {"type": "list", "elements": "str", "default": []},
}

# systemd's system unit search path (systemd.unit(5)); a unit of the same name in any of them is another's
UNIT_DIRS = (
    "/etc/systemd/system.control", "/run/systemd/system.control", "/run/systemd/transient",
    "/run/systemd/generator.early", "/etc/systemd/system", "/etc/systemd/system.attached", "/run/systemd/system",
    "/run/systemd/system.attached", "/run/systemd/generator", "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system", "/lib/systemd/system", "/run/systemd/generator.late",
)  # fmt: skip
NOLOGIN_SHELLS = ("nologin", "false")
CLAIMED = "(claimed, not created yet)"


def read_manifest(path):
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {"paths": {}, "accounts": {}}
    return {"paths": data.get("paths", {}), "accounts": data.get("accounts", {})}


def _within(path, parents):
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in parents)


def _kind(path):
    info = os.lstat(path)
    for test, name in ((stat.S_ISLNK, "link"), (stat.S_ISDIR, "directory"), (stat.S_ISREG, "file")):
        if test(info.st_mode):
            return name, info
    return "other", info


def _owner(info):
    try:
        user = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        user = str(info.st_uid)
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    return f"{user}:{group}"


def sys_uid_max(login_defs="/etc/login.defs"):
    """The highest system account uid: login.defs' SYS_UID_MAX, else UID_MIN - 1 (shadow's own default)."""
    values = {}
    try:
        with open(login_defs) as handle:
            for line in handle:
                words = line.split()
                if len(words) >= 2 and words[0] in ("SYS_UID_MAX", "UID_MIN") and words[1].isdigit():
                    values[words[0]] = int(words[1])
    except OSError:
        pass
    return values.get("SYS_UID_MAX", values.get("UID_MIN", 1000) - 1)


def _unit_files(unit):
    for directory in UNIT_DIRS:
        for name in (unit, unit + ".d"):
            path = os.path.join(directory, name)
            if os.path.lexists(path):
                yield path


def _account_refusal(name, manifest, adopt):
    """(why the service account is refused or None, whether it is absent)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None, True
    if name in manifest["accounts"]:
        # claimed by a run that stopped (or is still running) before recording it: recorded once it exists
        return None, manifest["accounts"][name].get("uid") is None
    limit = sys_uid_max()
    shell = entry.pw_shell
    seen = f"the account {name} (service.user) exists and apply did not create it"
    if not 0 < entry.pw_uid <= limit or os.path.basename(shell) not in NOLOGIN_SHELLS:
        return (
            f"{seen}: uid {entry.pw_uid}, shell {shell} (a system account has uid 1..{limit} per login.defs and "
            "a nologin or false shell); apply would set its home and shell: choose a service.user that does not "
            "exist (apply creates it)"
        ), False
    if name not in adopt:
        return (
            f"{seen}: add {name} to service.adopt to let apply use it and set its home and shell, or choose a "
            "service.user that does not exist"
        ), False
    return None, False


def _path_refusal(path, field, candidate):
    """Why a managed path, or its own directory (candidate), is refused: it exists and is not apply's."""
    kind, info = _kind(candidate)
    seen = f"exists ({kind}, {_owner(info)}) and apply did not create it"
    if candidate == path:
        return f"{path} ({field}) {seen}; add it to service.adopt to let apply take it over, or choose a free path"
    return (
        f"{path} ({field}) would be created in {candidate}, which {seen}; add {candidate} to service.adopt to let "
        "apply create in it, or choose a directory of its own that does not exist"
    )


def check(params, manifest):
    ours = set(manifest["paths"]) | {a for a in params["adopt"] if a.startswith("/")}
    refused, absent, seen = [], {}, set()
    for entry in params["paths"]:
        path, own = entry["path"], entry.get("own_dir")
        steps = [(own, "directory")] if own and own != path else []
        for candidate, kind in [*steps, (path, entry.get("type") or "directory")]:
            if candidate in seen:  # refused already, for another path in it
                break
            if candidate in absent:
                continue
            # claimed by a run that stopped before recording it: recorded once it exists
            if manifest["paths"].get(candidate, {}).get("owner") == CLAIMED:
                absent[candidate] = {"path": candidate, "type": kind}
                continue
            if _within(candidate, ours):
                continue
            if not os.path.lexists(candidate):
                absent[candidate] = {"path": candidate, "type": kind}
                continue
            refused.append(_path_refusal(path, entry.get("field") or "", candidate))
            seen.add(candidate)
            break
    unit = params["unit"]
    # a unit apply created (or adopted) is its own, with any drop-in an administrator gives it
    if unit and os.path.join("/etc/systemd/system", unit) not in ours:
        planned = {e["path"] for e in params["paths"]}
        refused += [
            f"{unit} (service.name): {path} exists and apply did not create it: a unit of that name is another's; "
            "choose another service.name"
            for path in _unit_files(unit)
            if path not in planned or path not in seen
        ]
    account_absent = False
    if params["user"]:
        why, account_absent = _account_refusal(params["user"], manifest, params["adopt"])
        if why:
            refused.append(why)
    return refused, list(absent.values()), account_absent


def write_manifest(path, manifest):
    """Atomically: a whole new file renamed over the old one, so a crash leaves one or the other."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o755)
    handle, tmp = tempfile.mkstemp(prefix=".owned.", dir=directory)
    try:
        with os.fdopen(handle, "w") as out:
            json.dump({"version": 1, **manifest}, out, indent=1, sort_keys=True)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def record(params, manifest):
    changed = False
    for entry in params["paths"]:
        path = entry["path"]
        if os.path.lexists(path):
            kind, info = _kind(path)
            want = {"type": kind, "owner": _owner(info)}
        else:
            want = {"type": entry.get("type") or "directory", "owner": CLAIMED}
        if manifest["paths"].get(path) != want:
            manifest["paths"][path] = want
            changed = True
    name = params["user"]
    if name:
        try:
            want = {"uid": pwd.getpwnam(name).pw_uid}
        except KeyError:
            want = {"uid": None}
        if manifest["accounts"].get(name) != want:
            manifest["accounts"][name] = want
            changed = True
    return changed


def load_manifest(module, path):
    """read_manifest, or the module fails naming the file."""
    try:
        return read_manifest(path)
    except (OSError, ValueError) as err:
        module.fail_json(msg=f"{path}: cannot read the manifest of what apply created: {err}")


def collect(module, params):
    """check() as the host probe reports it; a host with anything refused fails, naming each."""
    refused, absent, account_absent = check(params, load_manifest(module, params["manifest"]))
    result = {"absent": absent, "account_absent": account_absent, "refused": refused}
    if refused:
        module.fail_json(msg="apply would take over what it did not create: " + " | ".join(refused), **result)
    return result
