# What the model_store role decides on: whether each model directory is complete (config, index, every
# shard's header, sizes), what a copy source has that the host lacks, and who can read it. Read-only; the
# host probe (dflash.provision.host_probe) calls collect() on the host and probe() for copy sources on the
# control node.

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import struct

from ansible_collections.dflash.provision.plugins.module_utils.file_state import report

SPEC = {
    "models": {"type": "dict", "required": True},
    "sources": {"type": "dict", "default": {}},
    "readable_by": {"type": "str", "required": False},
    "python": {"type": "path", "required": False},
    "marker": {"type": "str", "default": ".dflash-model-store.json"},
    "files": {"type": "list", "elements": "path", "default": []},
    "dirs": {"type": "list", "elements": "path", "default": []},
}

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_HEADER = 100 * 1024 * 1024


def _free(path):
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    st = os.statvfs(probe)
    return probe, st.f_bavail * st.f_frsize, os.stat(probe).st_dev


def _walk(root):
    files, dirs = {}, []
    for here, subdirs, names in os.walk(root, followlinks=True):
        subdirs.sort()
        rel_here = os.path.relpath(here, root)
        if rel_here != ".":
            dirs.append(rel_here)
        for name in sorted(names):
            full = os.path.join(here, name)
            try:
                files[os.path.normpath(os.path.join(rel_here, name))] = os.stat(full).st_size
            except OSError:  # a dangling link
                files[os.path.normpath(os.path.join(rel_here, name))] = -1
    return files, dirs


def _shard_header(path):
    """(tensor names, the file size its header implies) of a safetensors file, or raise ValueError."""
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER:
            raise ValueError(f"header length {length} is not plausible")
        text = handle.read(length)
        if len(text) != length:
            raise ValueError("truncated inside its header")
    try:
        header = json.loads(text)
    except ValueError as err:
        raise ValueError(f"header is not JSON ({err})") from None
    end = 0
    names = set()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        names.add(name)
        end = max(end, int(info["data_offsets"][1]))
    return names, 8 + length + end


def _can_read(st, who, want_exec):
    if who is None:
        return True
    uid, gids = who
    if uid == 0:
        return True
    bits = stat.S_IROTH | (stat.S_IXOTH if want_exec else 0)
    if st.st_uid == uid:
        bits <<= 6
    elif st.st_gid in gids:
        bits <<= 3
    return st.st_mode & bits == bits


def _who(user):
    if not user:
        return None
    try:
        entry = pwd.getpwnam(user)
    except KeyError:  # not created yet: judge by other's bits
        return (-1, set())
    gids = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    return (entry.pw_uid, gids)


def _config(path, result, problems):
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        problems.append("config.json is missing")
        return
    try:
        with open(config_path) as handle:
            config = json.load(handle)
    except (OSError, ValueError) as err:
        problems.append(f"config.json does not parse as JSON ({err})")
        return
    if not isinstance(config, dict):
        problems.append("config.json is not a JSON object")
        return
    result["config_ok"] = True
    nested = config.get("dflash_config")
    # the order SGLang's DFlash worker reads it in
    if isinstance(nested, dict) and nested.get("block_size") is not None:
        result["block_size"], result["block_size_key"] = nested["block_size"], "dflash_config.block_size"
    elif config.get("block_size") is not None:
        result["block_size"], result["block_size_key"] = config["block_size"], "block_size"


def _weights(path, files, result, problems):
    index_path = os.path.join(path, INDEX)
    expected = {}  # shard -> tensor names the index maps to it
    if os.path.isfile(index_path):
        try:
            with open(index_path) as handle:
                weight_map = json.load(handle)["weight_map"]
            for tensor, shard in weight_map.items():
                expected.setdefault(shard, set()).add(tensor)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            problems.append(f"{INDEX} is not a valid index ({err.__class__.__name__}: {err})")
            return
        if not expected:
            problems.append(f"{INDEX} names no shards")
    elif os.path.isfile(os.path.join(path, SINGLE)):
        expected = {SINGLE: None}
    else:
        problems.append(f"neither {INDEX} nor {SINGLE} is present")
        return
    result["shards"] = sorted(expected)
    for shard in result["shards"]:
        if shard not in files:
            result["missing"].append(shard)
            problems.append(f"shard {shard} is missing")
            continue
        try:
            names, implied = _shard_header(os.path.join(path, shard))
        except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
            problems.append(f"shard {shard} is not a safetensors file ({err})")
            continue
        if implied != files[shard]:
            problems.append(f"shard {shard} is {files[shard]} bytes, its header says {implied} (partial copy?)")
        absent = sorted((expected[shard] or set()) - names)
        if absent:
            problems.append(f"shard {shard} lacks {len(absent)} tensor(s) the index maps to it, like {absent[0]}")


def probe(path, source, who, marker):
    result = {
        "path": path,
        "exists": os.path.exists(path),
        "complete": False,
        "problems": [],
        "missing": [],
        "config_ok": False,
        "block_size": None,
        "block_size_key": "",
        "shards": [],
        "size_bytes": 0,
        "files": {},
        "marker": {},
        "unreadable": [],
    }
    result["free_path"], result["free_bytes"], result["device"] = _free(path)
    problems = result["problems"]
    files, dirs = {}, []
    if not result["exists"]:
        problems.append(f"{path} does not exist")
    elif not os.path.isdir(path):
        problems.append(f"{path} is not a directory")
    else:
        files, dirs = _walk(path)
        result["files"] = files
        result["size_bytes"] = sum(size for size in files.values() if size > 0)
        _config(path, result, problems)
        _weights(path, files, result, problems)
        marker_path = os.path.join(path, marker)
        if os.path.isfile(marker_path):
            try:
                with open(marker_path) as handle:
                    result["marker"] = json.load(handle)
            except (OSError, ValueError):
                result["marker"] = {"unreadable": True}
        if who is not None:
            ancestors, probe_dir = [], path
            while True:
                ancestors.append(probe_dir)
                parent = os.path.dirname(probe_dir)
                if parent == probe_dir:
                    break
                probe_dir = parent
            for entry in ancestors + [os.path.join(path, d) for d in dirs]:
                if not _can_read(os.stat(entry), who, want_exec=True):
                    result["unreadable"].append(entry + "/")
            for rel in files:
                full = os.path.join(path, rel)
                if os.path.exists(full) and not _can_read(os.stat(full), who, want_exec=False):
                    result["unreadable"].append(full)
    result["complete"] = not problems

    if source is not None:
        to_copy = sorted(rel for rel, size in source.get("files", {}).items() if files.get(rel) != size)
        result["to_copy"] = to_copy
        result["to_copy_bytes"] = sum(source["files"][rel] for rel in to_copy)
        have = set(dirs)
        result["dirs_to_create"] = [d for d in source.get("dirs", []) if d not in have]
    result["dirs"] = dirs
    return result


def collect(module, params):
    who = _who(params["readable_by"])
    models = {}
    for name, path in params["models"].items():
        if not isinstance(path, str) or not os.path.isabs(path):
            module.fail_json(msg=f"model {name}: the path must be absolute, got {path!r}")
        models[name] = probe(os.path.normpath(path), params["sources"].get(name), who, params["marker"])
    result = {"models": models, **report(files=params["files"], dirs=params["dirs"])}
    if params["python"]:
        result["python_exists"] = os.access(params["python"], os.X_OK)
    return result
