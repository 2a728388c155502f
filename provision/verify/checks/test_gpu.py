"""GPU visibility: the profile's GPUs, their compute capability, the driver floor, and the service user's access."""

from __future__ import annotations

from typing import Any

import pytest


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.strip().split("."))


@pytest.mark.usefixtures("gpus")
def test_gpus_match_the_profile(host: Any, plan: dict[str, Any]) -> None:
    out = host.check_output("nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader")
    rows = [[field.strip() for field in line.split(",")] for line in out.splitlines() if line.strip()]
    assert len(rows) == plan["gpu"]["count"], f"{len(rows)} GPUs, the profile says {plan['gpu']['count']}: {rows}"
    assert {cc for _, cc, _ in rows} == {plan["gpu"]["arch"]}, rows
    floor = plan["driver"]["min"]
    low = [driver for *_, driver in rows if _version(driver) < _version(floor)]
    assert not low, f"driver {low[0]} is below the floor {floor} ({plan['driver']['reason']})"


@pytest.mark.usefixtures("gpus")
def test_every_gpu_is_usable_by_the_service_user(host: Any, plan: dict[str, Any]) -> None:
    user, count = plan["config"]["service"]["user"], plan["gpu"]["count"]
    python = plan["python_env"]["venv"] + "/bin/python3"
    code = (
        "import torch; n = torch.cuda.device_count(); "
        "[torch.ones(4, device=f'cuda:{i}').sum().item() for i in range(n)]; print(n)"
    )
    # as that account: runuser where the checks run as another one (root over ssh)
    as_user = "" if host.check_output("id -un").strip() == user else f"runuser -u {user} -- "
    run = host.run(f"{as_user}{python} -c {code!r}")
    assert run.rc == 0, run.stderr[-1500:]
    assert int(run.stdout.split()[-1]) == count
