"""What `provision apply` hands the play it starts: the typed `--set`, and the plans it validated and recorded.

Light on purpose: Ansible loads the action plugins that read this in its main process, and a run that apply started
needs none of provision's models (pydantic's import costs every run about 0.15 s).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from provision.files import file_name

# `provision apply --set` reaches the playbook under its own name, so that it is applied after a
# host's dflash_set (extra vars would otherwise replace that variable whole).
CLI_SET_VAR = "dflash_cli_set"
# The directory of the plans apply validated for this run (the run record's plans/, one HOST.json each), named to
# ansible-playbook in the control node's environment: no inventory, group_vars or extra var can name it. Empty or
# unset: the play resolves every plan itself (plain ansible-playbook, or apply given extra vars it did not see).
APPLY_PLANS_ENV = "DFLASH_APPLY_PLANS"


class HandoffError(Exception):
    """The run names apply's plans, and the host's cannot be read."""


def apply_plans_dir() -> Path | None:
    where = os.environ.get(APPLY_PLANS_ENV, "")
    return Path(where) if where else None


def apply_plan(host: str) -> dict[str, Any] | None:
    """The plan `provision apply` validated and recorded for the host before it started this run; None where apply
    did not start it."""
    where = apply_plans_dir()
    if where is None:
        return None
    # The plans stand for the run that recorded them, while it runs: ansible-runner writes the run's exit code
    # (artifacts/IDENT/rc, beside plans/) once the playbook has ended. A name left in a shell, or a re-run of the
    # record through ansible-runner, would otherwise apply plans the inventory may have moved away from.
    if any(where.parent.glob("artifacts/*/rc")):
        raise HandoffError(
            f"{APPLY_PLANS_ENV} names the plans of a provision apply run that has ended ({where}); allowed: the "
            f"plans of the run in progress, or {APPLY_PLANS_ENV} unset, and the play resolves every plan itself"
        )
    path = where / f"{file_name(host)}.json"
    try:
        plan = json.loads(path.read_text())
    except FileNotFoundError:
        raise HandoffError(f"provision apply planned no host {host!r} for this run (no {path})") from None
    except (OSError, ValueError) as err:
        raise HandoffError(f"cannot read the plan provision apply recorded for {host!r} ({path}): {err}") from None
    if not isinstance(plan, dict) or plan.get("host") != host:
        raise HandoffError(f"{path} is not the plan provision apply recorded for {host!r}")
    return plan
