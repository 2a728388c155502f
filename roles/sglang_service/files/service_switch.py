"""Switch the SGLang service to a new configuration on this host, safely; or report its state.

Standalone, stdlib only (runs under the host's python3, sent by `provision reconfigure` and
`provision status`; the sglang_service role also ships it to the host for NAME-rollback.service).
Usage: python3 service_switch.py switch|status|check|rollback|up|restart BASE64_JSON|@JOB_FILE

switch: holds a per-host lock for its whole run (a second switch is refused, exit 3), keeps the
serving config as the last good one when it is healthy, stops the server gracefully (SIGTERM
drains) after installing the new unit and environment, waits until the old process's GPU memory is
released (nvidia-smi; skipped with the reason on hosts without GPUs), starts, and waits until
/health_generate answers 200 (refused connections and 503 mean "not yet"; the unit failing or
restarting means "crashed"). When the new config does not become ready it restores the last good
one, waits until that is ready again and exits 1. A config the acceptance watchdog rolled back is
refused (exit 4) unless the job says force; a switch that succeeds arms the watchdog anew.

rollback: NAME-rollback.service runs it (as root) when the acceptance watchdog asks, under the same
lock: it acts only when the request names the config serving now and no rollback was made under the
same arming, marks that config failed, restores the last good one and keeps the reason in
STATE_DIR/watchdog.json. Prints one JSON object.

up: the sglang_service role's first start (or the start of a unit it finds stopped or disabled): the start
count reset as a switch resets it, `systemctl enable` and `systemctl start`, then a switch's own wait, all in
one round trip; "changed" says whether the unit was not active and enabled before; exit 1 with the reason
(systemctl's own words where the start is refused, else why the server did not become ready).

restart: the sglang_service role's restart handler: the same with `systemctl restart`.
"""

import base64
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

POLL_S = 0.05


def sh(*args, timeout=None):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


def write_atomic(path, text, mode=0o644):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def read_json(path):
    text = read(path)
    return json.loads(text) if text else None


def config_id(unit, env):
    """What identifies a serving config on a host: its unit and environment text (the watchdog computes it too)."""
    return hashlib.sha256((unit + "\0" + env).encode()).hexdigest()[:16]


def unit_state(name):
    out = sh("systemctl", "show", name, "-p", "ActiveState", "-p", "SubState", "-p", "MainPID", "-p", "NRestarts",
             "-p", "ExecMainStatus", "-p", "ActiveEnterTimestamp", "-p", "UnitFileState").stdout  # fmt: skip
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def get(url, key):
    """(status, body) of a GET with the API key; status 0 when nothing listens yet."""
    request = urllib.request.Request(url)
    if key:
        request.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, b""
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


def api_key(job):
    """The server's API key, read on the host from its root-only file (never passed around)."""
    return (read(job["api_key_file"]) or "").strip() if job.get("api_key_file") else ""


def health(url, key):
    return get(url + "/health_generate", key)[0]


def server_info(url, key):
    status, body = get(url + "/get_server_info", key)
    try:
        return json.loads(body) if status == 200 else None
    except ValueError:
        return None


def wait_ready(job, key, since_restarts):
    """(True, detected_at) once 200; (False, why) on the deadline or when the unit fails or restarts."""
    deadline = time.monotonic() + job["start_timeout_s"]
    last = 0
    while time.monotonic() < deadline:
        last = health(job["url"], key)
        if last == 200:
            return True, time.time()
        state = unit_state(job["name"])
        if (
            state.get("ActiveState") == "failed"
            or state.get("SubState") == "auto-restart"
            or (state.get("NRestarts", "0") != since_restarts)
        ):
            return False, f"the server exited during start (status {state.get('ExecMainStatus', '?')}, " \
                          f"{state.get('ActiveState')}/{state.get('SubState')})"  # fmt: skip
        time.sleep(POLL_S)
    return False, f"not ready within {job['start_timeout_s']} s (last /health_generate status {last or 'refused'})"


def waited(job, since_restarts):
    began = time.monotonic()
    ready, detail = wait_ready(job, api_key(job), since_restarts)
    if ready:
        return 0, {"status": "ready", "waited_s": round(time.monotonic() - began, 3)}
    return 1, {"status": "failed", "reason": detail}


def brought(job, *commands):
    """Reset the start count as start() resets it, run each `systemctl COMMAND NAME` in turn (the first refused:
    systemctl's own words, which a combined `enable --now` would bury under its symlink lines) and wait with a
    switch's own wait: one call, to a monotonic deadline, over at once where the unit fails or systemd restarts it
    (it crashed while loading). What waited_s reports is the server's start alone: from systemctl's return (an
    old process is gone) to the first 200."""
    reset_start_count(job)
    for command in commands:
        done = sh("systemctl", command, job["name"])
        if done.returncode != 0:
            return 1, {"status": "failed", "reason": f"systemctl {command} failed: " + " ".join(done.stderr.split())}
    return waited(job, restart_count(job))


def up(job):
    """Enable and start the unit apply found not active and enabled, and wait until it is ready."""
    before = unit_state(job["name"])
    was_up = before.get("ActiveState") == "active" and before.get("UnitFileState") == "enabled"
    code, out = brought(job, "enable", "start")
    return code, {**out, "changed": not was_up}


def restart(job):
    """Restart the unit apply changed and wait until it is ready."""
    return brought(job, "restart")


def gpu_pids():
    """PIDs holding GPU memory; None where there is no GPU to ask."""
    if not any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in os.environ.get("PATH", "").split(":")):
        return None
    out = sh("nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader").stdout
    return {int(p) for p in out.split() if p.strip().isdigit()}


def descendants(pid):
    out = sh("ps", "-e", "-o", "pid=,ppid=").stdout
    children, found = {}, {pid}
    for line in out.splitlines():
        p, pp = (int(x) for x in line.split())
        children.setdefault(pp, []).append(p)
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def wait_gpu_released(pids, timeout_s):
    start = time.monotonic()
    held = gpu_pids()
    if held is None:
        return {"skipped": "no GPU on this host: nvidia-smi is not installed", "seconds": 0.0}
    while held & pids:
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"GPU memory of pids {sorted(held & pids)} not released within {timeout_s} s")
        time.sleep(0.2)
        held = gpu_pids() or set()
    return {"seconds": round(time.monotonic() - start, 3)}


def install(job, unit, env):
    write_atomic(job["env_path"], env)
    write_atomic(job["unit_path"], unit)
    sh("systemctl", "daemon-reload")


def journal(job, since):
    out = sh("journalctl", "-u", job["name"], "--since", since, "-n", str(job["journal_lines"]), "-o", "cat",
             "--no-pager").stdout  # fmt: skip
    return out.splitlines()


def take_lock(job, wait):
    """The per-host lock (kept open for the process's life), or None when another holds it and wait is False."""
    os.makedirs(job["state_dir"], mode=0o700, exist_ok=True)
    lock = open(os.path.join(job["state_dir"], "reconfigure.lock"), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        lock.seek(0)
        return None, lock.read().strip()
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')} ({job.get('by', '?')})\n")
    lock.flush()
    return lock, None


def watchdog_record(job):
    return read_json(os.path.join(job["state_dir"], "watchdog.json")) or {"failed": {}, "rollbacks": []}


def reset_start_count(job):
    """StartLimitBurst= counts every start in its interval, deliberate ones too: the start count is reset before
    a deliberate start (reset-failed), so that switches and applies never run into the limit that bounds crash
    loops."""
    sh("systemctl", "reset-failed", job["name"])


def restart_count(job):
    """NRestarts once a deliberate start's systemctl has returned, which wait_ready compares. Read after it, not
    before: a start that cuts short a pending automatic restart (a unit left in auto-restart by a failed start)
    counts as one, while a crash while loading restarts only RestartSec= later."""
    return unit_state(job["name"]).get("NRestarts", "0")


def start(job):
    """Start the unit for a deliberate switch: its NRestarts after the start, which wait_ready compares."""
    reset_start_count(job)
    sh("systemctl", "start", job["name"])
    return restart_count(job)


def restore(job, key, last_good):
    """Stop, install the last good config, start and wait: (ready, detail); current.json follows when ready."""
    sh("systemctl", "stop", job["name"], timeout=job["stop_timeout_s"] + 30)
    install(job, last_good["unit"], last_good["env"])
    back, detail = wait_ready(job, key, start(job))
    if back and last_good.get("config") is not None:
        write_atomic(os.path.join(job["state_dir"], "current.json"), json.dumps({**last_good, "since": time.time()}),
                     0o600)  # fmt: skip
    return back, None if back else detail


def arm_watchdog(job):
    """Write the new config's watchdog settings into the role's settings file (a new arming: no hold)."""
    path = job.get("watchdog_settings_path")
    settings = read_json(path) if path else None
    if settings is None:
        return  # no watchdog installed on this host
    settings.update(watchdog=job["watchdog"], armed={"by": job.get("by", "?"), "at": time.time()})
    write_atomic(path, json.dumps(settings, indent=1) + "\n", 0o644)


def check(job):
    """Whether the acceptance watchdog marked this config failed on this host."""
    failed = watchdog_record(job)["failed"].get(config_id(job["unit"], job["env"]))
    return 0, {"failed": failed}


def switch(job):
    lock, holder = take_lock(job, wait=False)
    if lock is None:
        return 3, {"status": "locked", "holder": holder}
    state_dir = job["state_dir"]
    failed = watchdog_record(job)["failed"].get(config_id(job["unit"], job["env"]))
    if failed and not job.get("force"):
        return 4, {"status": "refused", "failed": failed}

    key = api_key(job)
    current_path, last_good_path = os.path.join(state_dir, "current.json"), os.path.join(state_dir, "last-good.json")
    serving = {"unit": read(job["unit_path"]), "env": read(job["env_path"]),
               "config": (read_json(current_path) or {}).get("config")}  # fmt: skip
    if health(job["url"], key) == 200 and serving["unit"]:
        serving["saved_at"] = time.time()
        write_atomic(last_good_path, json.dumps(serving), 0o600)
    last_good = read_json(last_good_path)

    timings = {}
    old = unit_state(job["name"])
    old_pids = descendants(int(old.get("MainPID", "0"))) if old.get("MainPID", "0") != "0" else set()
    # installed while the old process still serves (it read its files at start): the reload is not downtime
    install(job, job["unit"], job["env"])
    timings["stop_started_at"] = time.time()
    t = time.monotonic()
    sh("systemctl", "stop", job["name"], timeout=job["stop_timeout_s"] + 30)
    timings["stop_s"] = round(time.monotonic() - t, 3)
    try:
        timings["gpu_release"] = wait_gpu_released(old_pids, job["gpu_release_timeout_s"])
    except TimeoutError as err:
        if serving["unit"]:  # the files on disk go back to what the stopped process served
            install(job, serving["unit"], serving["env"] or "")
        return 1, {"status": "failed", "reason": str(err), "rolled_back": False, "timings": timings}

    since = time.strftime("%Y-%m-%d %H:%M:%S")
    t = time.monotonic()
    started_at = time.time()
    ready, detail = wait_ready(job, key, start(job))
    timings["start_to_ready_s"] = round(time.monotonic() - t, 3)
    if ready:
        timings["started_at"], timings["detected_at"] = started_at, detail
        write_atomic(current_path, json.dumps({"config": job["config"], "unit": job["unit"], "env": job["env"],
                                               "since": time.time()}), 0o600)  # fmt: skip
        arm_watchdog(job)
        return 0, {"status": "ok", "timings": timings, "server_info": server_info(job["url"], key)}

    lines = journal(job, since)
    result = {"status": "failed", "reason": detail, "journal": lines, "timings": timings, "rolled_back": False}
    if not last_good:
        return 1, result
    back, back_detail = restore(job, key, last_good)
    result.update(rolled_back=True, rollback_ready=back, rollback_detail=back_detail)
    return 1, result


def rollback(job):
    """The acceptance watchdog's request (NAME-rollback.service, root): back to the last good config, once an arming."""
    request_path = os.path.join(job["request_dir"], "rollback-request.json")
    request = read_json(request_path)
    if request is None:
        return 0, {"status": "nothing to do"}
    lock, _ = take_lock({**job, "by": "acceptance watchdog rollback"}, wait=True)
    record = watchdog_record(job)
    serving_id = config_id(read(job["unit_path"]) or "", read(job["env_path"]) or "")
    arm = hashlib.sha256((read(job["watchdog_settings_path"]) or "").encode()).hexdigest()[:16]
    entry = {"at": time.time(), "request": {k: request.get(k) for k in ("id", "config_id", "arm", "reason", "at")},
             "windows": request.get("windows", [])[-20:]}  # fmt: skip
    last_good = read_json(os.path.join(job["state_dir"], "last-good.json"))
    if request.get("config_id") != serving_id or request.get("arm") != arm:
        entry["status"] = "ignored: the config or its arming changed since the request"
    elif any(r.get("arm") == arm and r.get("status") == "rolled back" for r in record["rollbacks"]):
        entry["status"] = "ignored: a rollback was made under this arming already (no flapping)"
    else:
        current = read_json(os.path.join(job["state_dir"], "current.json")) or {}
        record["failed"][serving_id] = {"at": entry["at"], "reason": request.get("reason"),
                                        "config": current.get("config")}  # fmt: skip
        if not last_good or config_id(last_good["unit"], last_good["env"] or "") == serving_id:
            entry["status"] = "failed: no other last good config to roll back to"
        else:
            key = api_key(job)
            ready, detail = restore(job, key, last_good)
            entry.update(status="rolled back", arm=arm, to=config_id(last_good["unit"], last_good["env"] or ""),
                         ready=ready, detail=detail)  # fmt: skip
    entry["from"] = serving_id
    record["rollbacks"].append(entry)
    write_atomic(os.path.join(job["state_dir"], "watchdog.json"), json.dumps(record), 0o600)
    # answered: the path unit stops firing, and the watchdog sees its request was handled
    os.replace(request_path, os.path.join(job["request_dir"], "rollback-request.handled.json"))
    lock.close()
    return 0, entry


def status(job):
    key = api_key(job)
    state_dir = job["state_dir"]
    info = server_info(job["url"], key) or {}
    accept = ((info.get("internal_states") or [{}])[0]).get("avg_spec_accept_length")
    held = gpu_pids()
    gpu = "skipped: no GPU on this host: nvidia-smi is not installed"
    if held is not None:
        gpu = sh("nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader").stdout.strip()
    current = read_json(os.path.join(state_dir, "current.json")) or {}
    last_good = read_json(os.path.join(state_dir, "last-good.json")) or {}
    watchdog = read_json(os.path.join(job["watchdog_dir"], "state.json")) if job.get("watchdog_dir") else None
    return 0, {
        "unit": unit_state(job["name"]),
        "health": health(job["url"], key),
        "current": current.get("config"),
        "last_good": last_good.get("config"),
        "accept_length": accept,
        "standin": info.get("standin", False),
        "gpu_memory": gpu,
        "watchdog": watchdog,
        "watchdog_record": watchdog_record(job),
    }


if __name__ == "__main__":
    verb, arg = sys.argv[1], sys.argv[2]
    payload = json.loads(read(arg[1:]) if arg.startswith("@") else base64.b64decode(arg))
    code, out = {
        "switch": switch,
        "status": status,
        "check": check,
        "rollback": rollback,
        "up": up,
        "restart": restart,
    }[verb](payload)
    print(json.dumps(out))
    sys.exit(code)
