# Run on the host by the model_store role as `python -c`: snapshot_download one repository into a
# directory. The token comes on stdin and goes into HF_TOKEN (huggingface_hub reads it from there);
# every message is printed with the token masked.
# argv: repo revision local_dir marker free_margin endpoint (revision, free_margin, endpoint may be empty;
# an empty free_margin skips the free-space check because the plan set min_free_gb, checked already).
import json
import os
import sys

token = sys.stdin.read().strip()
repo, revision, local_dir, marker, margin, endpoint = sys.argv[1:7]
revision = revision or None
if token:
    os.environ["HF_TOKEN"] = token
if endpoint:
    os.environ["HF_ENDPOINT"] = endpoint
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.umask(0o022)  # world-readable files: the service user reads them


def say(message):
    print(message.replace(token, "***") if token else message, file=sys.stderr)


def free_bytes(path):
    while not os.path.exists(path):
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return path, st.f_bavail * st.f_frsize


try:
    from huggingface_hub import HfApi, snapshot_download
except ImportError as err:
    say(f"huggingface_hub is not importable by {sys.executable} ({err}); the python_env role installs it")
    sys.exit(2)

try:
    if margin:
        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
        total = have = 0
        for sibling in info.siblings or []:
            size = sibling.size or 0
            total += size
            local = os.path.join(local_dir, sibling.rfilename)
            if os.path.isfile(local) and os.path.getsize(local) == size:
                have += size
        need = (total - have) * float(margin)
        where, free = free_bytes(local_dir)
        if free < need:
            needed, left = need / 1e9, free / 1e9
            say(f"not enough free space for {local_dir}: need {needed:.1f} GB, {where} has {left:.1f} GB free")
            sys.exit(3)
    os.makedirs(local_dir, mode=0o755, exist_ok=True)
    snapshot_download(repo_id=repo, revision=revision, local_dir=local_dir)
    with open(os.path.join(local_dir, marker), "w") as handle:
        json.dump({"repo": repo, "revision": revision}, handle)
        handle.write("\n")
except Exception as err:  # noqa: BLE001 - every failure becomes one masked message
    say(f"{err.__class__.__name__}: {err}")
    sys.exit(1)
