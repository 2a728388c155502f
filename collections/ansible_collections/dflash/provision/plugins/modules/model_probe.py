#!/usr/bin/python
# One read-only look at every model directory the model_store role decides on, in a single round trip.

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import struct

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dflash.provision.plugins.module_utils.file_state import dir_state, file_state

DOCUMENTATION = r"""
module: model_probe
short_description: Read whether model directories are complete, without changing anything
description:
  - For each model directory, reports whether it exists, whether config.json parses (and the DFlash block
    size it declares), the safetensors weights (model.safetensors.index.json and every shard it names, or a
    single model.safetensors), shards whose size disagrees with their own safetensors header, the files and
    their sizes, and the free space on the filesystem holding the directory (or its nearest existing parent).
  - Given a source manifest (relative file name to size), also reports which files differ from it.
  - Reads only the config, the index and each shard's header, never the weights. Never changes the host;
    supports check mode.
options:
  models:
    description: The model directories to probe, name to absolute path.
    type: dict
    required: true
  sources:
    description: >-
      Per name, what the files should be: a dict with files (relative name to size) and dirs (relative
      directories), like this module's own result for the source directory. Adds to_copy,
      to_copy_bytes and dirs_to_create to that name's result.
    type: dict
    default: {}
  readable_by:
    description: A user that must be able to read the files (the service user); other's bits when it does not exist.
    type: str
    required: false
  python:
    description: An interpreter whose presence to report (the one that downloads).
    type: path
    required: false
  marker:
    description: Name of the file inside a model directory that records where it was fetched from.
    type: str
    default: .dflash-model-store.json
  files:
    description: >-
      Other files whose SHA-1 and owner, group and mode to report (the role's drafter record), so a
      settled one is not rewritten and a drifted one is.
    type: list
    elements: path
    default: []
  dirs:
    description: Directories whose owner, group and mode to report, so a settled one is not touched.
    type: list
    elements: path
    default: []
author: dflash-provision developers
"""

EXAMPLES = r"""
- name: Probe the target model and the drafter
  dflash.provision.model_probe:
    models:
      model: /data/models/DeepSeek-V3
      drafter: /data/models/DeepSeek-V3-DFlash
    readable_by: sglang
"""

RETURN = r"""
models:
  description: >-
    Per name: path, exists, complete, problems (what is missing or wrong, one line each), missing (files
    named by the index that are absent), config_ok, block_size and block_size_key (from config.json's
    dflash_config.block_size or block_size; null and empty when neither), shards, size_bytes, files
    (relative name to size), dirs, free_bytes, free_path, device (of the filesystem), marker (the marker
    file's content, {} when absent), unreadable (what the readable_by user cannot read), and with a source: to_copy
    (relative names whose size differs or that are absent), to_copy_bytes and dirs_to_create.
  type: dict
  returned: always
file_sha1:
  description: Path to SHA-1 of each of the files option's files; empty for a missing one.
  type: dict
  returned: always
file_state:
  description: Path to "owner:group:mode" (like root:root:0644) of each given file; empty for a missing one.
  type: dict
  returned: always
dir_state:
  description: Path to "owner:group:mode" (like root:root:0755) of each given directory; empty for a missing one.
  type: dict
  returned: always
python_exists:
  description: Whether the python option names an executable.
  type: bool
  returned: when python is given
"""

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


def main():
    module = AnsibleModule(
        argument_spec={
            "models": {"type": "dict", "required": True},
            "sources": {"type": "dict", "default": {}},
            "readable_by": {"type": "str", "required": False},
            "python": {"type": "path", "required": False},
            "marker": {"type": "str", "default": ".dflash-model-store.json"},
            "files": {"type": "list", "elements": "path", "default": []},
            "dirs": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    who = _who(module.params["readable_by"])
    models = {}
    for name, path in module.params["models"].items():
        if not isinstance(path, str) or not os.path.isabs(path):
            module.fail_json(msg=f"model {name}: the path must be absolute, got {path!r}")
        source = module.params["sources"].get(name)
        models[name] = probe(os.path.normpath(path), source, who, module.params["marker"])
    result = {
        "changed": False,
        "models": models,
        "file_sha1": {path: module.sha1(path) or "" for path in module.params["files"]},
        "file_state": {path: file_state(path) for path in module.params["files"]},
        "dir_state": {path: dir_state(path) for path in module.params["dirs"]},
    }
    if module.params["python"]:
        result["python_exists"] = os.access(module.params["python"], os.X_OK)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
