"""`provision discover`: a host's GPUs (nvidia-smi, `nvidia-smi topo -m`) beside the inventory's profile."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from provision.planning.types import Plan

QUERY = "nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader,nounits"


def interconnect(topo: str) -> str:
    """nvlink when any GPU pair is linked by NVLink (NV# in the matrix), pcie when there are several GPUs without it."""
    rows = [line.split() for line in topo.splitlines() if re.match(r"^GPU\d+\s", line)]
    links = {cell for row in rows for cell in row[1 : len(rows) + 1]}
    if any(re.fullmatch(r"NV\d+", cell) for cell in links):
        return "nvlink"
    return "pcie" if len(rows) > 1 else "single"


def suggestion(found: str, count: int) -> str:
    """What the facts say wins: tensor parallel over NVLink, expert parallel over PCIe (the seed's measurements)."""
    if count == 1:
        return "one GPU: tp 1"
    if found == "nvlink":
        return f"NVLink: tensor parallel wins (serve.tp {count}, serve.ep 1), as on the B300 box"
    settings = f"serve.tp {count}, serve.ep {count}, serve.nccl_p2p_disable true"
    return f"PCIe: expert parallel wins ({settings}), as on the RTX PRO 6000 box"


def discover(plan: Plan, inventory: Path, console: Console) -> int:
    import testinfra

    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    host: Any = testinfra.get_host(f"ansible://{plan.host}?ansible_inventory={inventory}")
    if not host.exists("nvidia-smi"):
        console.print(
            f"{plan.host}: no GPU found (nvidia-smi is not installed); "
            f"the inventory says {plan.gpu.count}x {plan.gpu.model}"
        )
        return 1
    rows = [[f.strip() for f in line.split(",")] for line in host.check_output(QUERY).splitlines() if line.strip()]
    topo = host.run("nvidia-smi topo -m").stdout
    found_link = interconnect(topo)
    table = Table(title=f"{plan.host}: found vs inventory")
    for column in ("field", "found", "inventory", ""):
        table.add_column(column)
    found = {
        "model": ", ".join(sorted({r[0] for r in rows})),
        "count": str(len(rows)),
        "arch": ", ".join(sorted({r[1] for r in rows})),
        "memory_gb": ", ".join(sorted({str(round(int(r[2]) / 1024)) for r in rows})),
        "interconnect": found_link,
        "driver": ", ".join(sorted({r[3] for r in rows})),
    }
    wanted = {
        "model": plan.gpu.model, "count": str(plan.gpu.count), "arch": plan.gpu.arch,
        "memory_gb": str(plan.gpu.memory_gb), "interconnect": plan.gpu.interconnect, "driver": f">= {plan.driver.min}",
    }  # fmt: skip
    for field, value in found.items():
        same = value == wanted[field] or (field == "interconnect" and value == "single")
        if field == "driver":
            same = all(
                tuple(map(int, d.split("."))) >= tuple(map(int, plan.driver.min.split("."))) for d in value.split(", ")
            )
        if field == "memory_gb":
            same = abs(int(value.split(", ")[0]) - plan.gpu.memory_gb) <= 0.1 * plan.gpu.memory_gb
        table.add_row(field, value, wanted[field], "[green]ok[/]" if same else "[bold red]differs[/]")
    console.print(table)
    console.print(f"parallelism: {suggestion(found_link, len(rows))}; the inventory has serve.tp "
                  f"{plan.config.serve.tp}, serve.ep {plan.config.serve.ep}")  # fmt: skip
    return 0
