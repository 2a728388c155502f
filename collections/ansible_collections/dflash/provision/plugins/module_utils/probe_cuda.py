# What the cuda_toolkit role decides on: the GPU driver versions (or why there are none), missing build
# packages, NVIDIA's repository (its packages, its source file and the NVIDIA lists beside it), what a
# pip-built prefix was built from, where the toolkit home points, the cuda alternative and nvcc's release.
# Read-only.

from __future__ import annotations

import fnmatch
import os
import re

from ansible_collections.dflash.provision.plugins.module_utils.file_state import report
from ansible_collections.dflash.provision.plugins.module_utils.host import missing, nvidia_smi, run

SPEC = {
    "packages": {"type": "list", "elements": "str", "default": []},
    "home": {"type": "path", "required": True},
    "marker": {"type": "path", "required": False},
    "repo_packages": {"type": "list", "elements": "str", "default": []},
    "source": {"type": "path", "required": False},
    "files": {"type": "list", "elements": "path", "default": []},
    "paths": {"type": "list", "elements": "path", "default": []},
    # the lists in this directory whose names match: the caller may not know the one it looks for yet
    "lists_dir": {"type": "path", "required": False},
    "lists_pattern": {"type": "str", "default": "*.list"},
}


def _has_candidate(module, name):
    rc, out, _ = run(module, ["apt-cache", "policy", name])
    found = re.search(r"^\s*Candidate: (.*)$", out, re.M) if rc == 0 else None
    return bool(found) and found.group(1).strip() != "(none)"


def _source_uris(source):
    uris = []
    if source and os.path.isfile(source):
        with open(source) as handle:
            for line in handle:
                if line.lower().startswith("uris:"):
                    uris.extend(line.split(":", 1)[1].split())
    return uris


def _nvcc_release(module, home):
    nvcc = os.path.join(home, "bin", "nvcc")
    if not os.access(nvcc, os.X_OK):
        return ""
    rc, out, _ = run(module, [nvcc, "--version"])
    found = re.search(r"release (\d+\.\d+),", out) if rc == 0 else None
    return found.group(1) if found else ""


def collect(module, params):
    home, marker, lists_dir = params["home"], params["marker"], params["lists_dir"]
    installed, _, versions, error = nvidia_smi(module)
    repo_missing = missing(module, params["repo_packages"])
    built_from = ""
    if marker and os.path.isfile(marker):
        with open(marker) as handle:
            built_from = handle.read()
    rc, out, _ = run(module, ["update-alternatives", "--query", "cuda"])
    value = re.search(r"^Value: (.*)$", out, re.M) if rc == 0 else None
    return {
        "driver_versions": versions,
        "driver_missing_reason": "" if versions else error if not installed else f"nvidia-smi failed: {error[:200]}",
        "missing_packages": missing(module, params["packages"]),
        "repo_packages_missing": repo_missing,
        # apt-get update is needed only for what apt's lists do not know yet
        "repo_packages_unknown": [name for name in repo_missing if not _has_candidate(module, name)],
        "source_uris": _source_uris(params["source"]),
        "built_from": built_from,
        "home_link": os.readlink(home) if os.path.islink(home) else "",
        "home_is_dir": os.path.isdir(home) and not os.path.islink(home),
        "alternative": value.group(1).strip() if value else "",
        "alternatives": re.findall(r"^Alternative: (.*)$", out, re.M) if rc == 0 else [],
        "nvcc_release": _nvcc_release(module, home),
        "lists": sorted(
            os.path.join(lists_dir, name)
            for name in (os.listdir(lists_dir) if lists_dir and os.path.isdir(lists_dir) else [])
            if fnmatch.fnmatch(name, params["lists_pattern"])
        ),
        **report(files=params["files"], paths=params["paths"]),
    }
