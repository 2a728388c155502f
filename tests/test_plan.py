"""`provision plan` shows the seed's deployment for each box, decided by the tables."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from provision.planning.render import API_KEY_REF
from tests.conftest import ROOT


def test_rtx6000_seed_plan(plan_json) -> None:
    plan = plan_json("--host", "rtx6000")
    assert plan["host"] == "rtx6000-01.example.invalid"
    assert plan["gpu"] == {
        "model": "NVIDIA RTX PRO 6000 Blackwell",
        "arch": "12.0",
        "sm": "sm_120",
        "count": 8,
        "memory_gb": 96,
        "interconnect": "pcie",
    }
    # no pin: sm_120 needs >= 12.8, torch 2.14.1 is the CUDA 13.0 build, so 13.0
    assert plan["cuda"]["version"] == "13.0"
    assert plan["cuda"]["home"] == "/usr/local/cuda-13.0"
    assert "sm_120 needs >= 12.8" in plan["cuda"]["reason"]
    assert plan["driver"]["min"] == "580.65.06"
    assert plan["env"]["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f"
    assert plan["env"]["NCCL_P2P_DISABLE"] == "1"
    assert plan["env"]["SGLANG_DDTREE_MAX_TOPK"] == "4"
    assert "TRITON_PTXAS_PATH" not in plan["env"]  # Triton 3.8's ptxas-blackwell knows sm_120a
    argv = plan["argv"]
    assert argv[:3] == ["/opt/sglang-dflash/venv/bin/python3", "-m", "sglang.launch_server"]
    joined = " ".join(argv)
    for expected in (
        "--tp-size 8 --ep-size 8",
        "--speculative-algorithm DDTREE --speculative-ddtree-budget 8",
        "--speculative-num-draft-tokens 8",
        "--speculative-draft-window-size 2048",
        "--attention-backend flashinfer",
        "--speculative-draft-attention-backend triton",
        "--disable-prefill-cuda-graph",
        "--tool-call-parser kimi_k2",
        "--reasoning-parser kimi_k2",
        "--enable-metrics",
    ):
        assert expected in joined


def test_b300_seed_plan(plan_json) -> None:
    plan = plan_json("--host", "b300")
    assert plan["gpu"]["arch"] == "10.3" and plan["gpu"]["interconnect"] == "nvlink"
    assert plan["cuda"]["version"] == "13.0" and "pinned" in plan["cuda"]["reason"]
    assert plan["env"]["TRITON_PTXAS_PATH"] == "/usr/local/cuda-13.0/bin/ptxas"
    assert plan["env"]["TRITON_PTXAS_BLACKWELL_PATH"] == "/usr/local/cuda-13.0/bin/ptxas"
    assert plan["env"]["FLASHINFER_CUDA_ARCH_LIST"] == "10.3a"
    assert plan["triton"]["target"] == "sm_103a"
    assert "NCCL_P2P_DISABLE" not in plan["env"]
    joined = " ".join(plan["argv"])
    assert "--tp-size 8" in joined and "--ep-size" not in joined
    assert "--cuda-graph-max-bs-decode 64" in joined


def test_unit_runs_exactly_the_argv_and_never_holds_the_key(plan_json) -> None:
    plan = plan_json("--host", "b300")
    exec_line = next(line for line in plan["unit"].splitlines() if line.startswith("ExecStart="))
    assert shlex.split(exec_line.removeprefix("ExecStart=")) == plan["argv"]
    assert "User=sglang" in plan["unit"]
    assert "EnvironmentFile=/etc/sglang-dflash/secrets.env" in plan["unit"]
    assert API_KEY_REF in plan["argv"]  # substituted by systemd from the root-only secrets file
    for name, value in plan["env"].items():
        assert f'{name}="{value}"' in plan["env_file"]


def test_toolkit_follows_the_torch_build(plan_json) -> None:
    # a torch built for CUDA 12.x lets the table pick the arch's minimum: 12.8 for sm_120 (R570)
    plan = plan_json("--host", "rtx6000", "--set", "sglang.torch_cuda=12.8")
    assert plan["cuda"]["version"] == "12.8"
    assert plan["env"]["FLASHINFER_CUDA_ARCH_LIST"] == "12.0a"  # no 'f' targets before 12.9
    assert plan["driver"] == {"min": "570.86.10", "branch": "R570", "reason": plan["driver"]["reason"]}
    # sm_103 needs 12.9 (R575)
    plan = plan_json("--host", "b300", "--set", "sglang.torch_cuda=12.9", "--set", "cuda.version=12.9")
    assert plan["cuda"]["version"] == "12.9" and plan["driver"]["min"].startswith("575.")


def test_triton_override_follows_its_bundled_ptxas(plan_json) -> None:
    # Triton 3.5 bundles ptxas 12.8 only: it cannot assemble sm_103a, so auto turns the override on
    plan = plan_json("--host", "b300", "--set", "triton.ptxas=auto", "--set", "triton.version=3.5.1")
    assert plan["triton"]["ptxas_override"] is True and "too old" in plan["triton"]["reason"]
    plan = plan_json("--host", "b300", "--set", "triton.ptxas=auto")
    assert plan["triton"]["ptxas_override"] is False and "TRITON_PTXAS_PATH" not in plan["env"]


def test_dflash_dialect_and_no_speculation(plan_json) -> None:
    plan = plan_json("--host", "rtx6000", "--set", "serve.algorithm=DFLASH")
    joined = " ".join(plan["argv"])
    assert "--speculative-algorithm DFLASH" in joined and "ddtree" not in joined
    assert "SGLANG_DDTREE_MAX_TOPK" not in plan["env"]
    plan = plan_json("--host", "rtx6000", "--set", "serve.algorithm=NONE")
    assert not any(a.startswith("--speculative") for a in plan["argv"])


def test_set_overrides_reach_argv_and_env(plan_json) -> None:
    plan = plan_json(
        "--host", "b300",
        "--set", "serve.ddtree.budget=12", "--set", "serve.ddtree.topk=6", "--set", "serve.draft_window=null",
        "--set", "serve.port=30001", "--set", "serve.block_size=4", "--set", "serve.env.NCCL_DEBUG=INFO",
        "--set", "serve.cuda_graph.enabled=false",
    )  # fmt: skip
    joined = " ".join(plan["argv"])
    assert "--speculative-ddtree-budget 12" in joined and plan["env"]["SGLANG_DDTREE_MAX_TOPK"] == "6"
    assert "--speculative-draft-window-size" not in joined
    assert "--port 30001" in joined and "--speculative-num-draft-tokens 4" in joined
    assert "--disable-cuda-graph" in joined and "--cuda-graph-max-bs-decode" not in joined
    assert plan["env"]["NCCL_DEBUG"] == "INFO"


def test_untrained_depth_allowed_explicitly(plan_json) -> None:
    plan = plan_json(
        "--host", "rtx6000", "--set", "serve.block_size=16", "--set", "serve.allow_untrained_depth=true"
    )  # fmt: skip
    assert "--speculative-num-draft-tokens 16" in " ".join(plan["argv"])
    assert any("trained 8" in note for note in plan["notes"])


def test_h200_arch_plans(plan_json) -> None:
    plan = plan_json(
        "--host", "b300",
        "--set", "gpu.arch=9.0", "--set", "gpu.count=1", "--set", "gpu.model=NVIDIA H200", "--set", "serve.tp=1",
        "--set", "triton.ptxas=auto",
    )  # fmt: skip
    assert plan["triton"]["target"] == "sm_90a" and plan["env"]["FLASHINFER_CUDA_ARCH_LIST"] == "9.0a"
    assert "TRITON_PTXAS_BLACKWELL_PATH" not in plan["env"]


def test_human_plan_names_every_decision(run) -> None:
    rc, out, _ = run("plan", "--host", "b300")
    assert rc == 0
    for expected in (
        "hardware",
        "CUDA",
        "driver",
        "Triton",
        "FlashInfer",
        "environment",
        "launch command",
        "[Service]",
    ):
        assert expected in out


def test_group_json_lists_each_host(inventory, run) -> None:
    import json

    rc, out, _ = run("plan", "--json", "--host", "all", "--inventory", str(inventory))
    assert rc == 0
    doc = json.loads(out)
    assert doc["target"] == "all" and set(doc["hosts"]) == {"rtx-test", "b300-test"}


def _leaf_keys(model: type, prefix: str = "") -> list[str]:
    from pydantic import BaseModel

    keys = []
    for name, field in model.model_fields.items():
        nested = [a for a in getattr(field.annotation, "__args__", [field.annotation]) if isinstance(a, type)]
        sub = [a for a in nested if issubclass(a, BaseModel)]
        keys += _leaf_keys(sub[0], f"{prefix}{name}.") if sub else [f"{prefix}{name}"]
    return keys


def test_readme_documents_every_config_key() -> None:
    from provision.model.deployment import Deployment

    readme = (ROOT / "README.md").read_text()
    missing = [key for key in _leaf_keys(Deployment) if f"`{key}`" not in readme]
    assert not missing, f"README's key table lacks {missing}"


def test_discover_reads_the_interconnect_from_nvidia_smi_topo() -> None:
    from provision.remote.discover import interconnect

    h200 = (ROOT / "docs" / "h200" / "topo.txt").read_text()  # a real one-GPU machine
    nvlink = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-63\nGPU1\tNV18\t X \t0-63\n"
    pcie = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-63\nGPU1\tPHB\t X \t0-63\n"
    assert interconnect(h200) == "single"
    assert interconnect(nvlink) == "nvlink"
    assert interconnect(pcie) == "pcie"


def test_a_value_that_reads_like_the_key_reference_is_only_text(plan_json) -> None:
    plan = plan_json("--host", "rtx6000", "--set", "model.served_name=${SGLANG_DFLASH_API_KEY}")
    exec_start = next(line for line in plan["unit"].splitlines() if line.startswith("ExecStart="))
    assert '--served-model-name "$${SGLANG_DFLASH_API_KEY}"' in exec_start
    assert exec_start.count(" " + API_KEY_REF) == 1  # the --api-key word, placed by position


def test_ipv6_binds_give_bracketed_urls(plan_json) -> None:
    assert plan_json("--host", "b300", "--set", "serve.host=::")["service_url"] == "http://[::1]:30000"
    assert plan_json("--host", "b300", "--set", "serve.host=fd00::5")["service_url"] == "http://[fd00::5]:30000"


def test_rdma_devices_only_when_asked(plan_json) -> None:
    assert "infiniband" not in plan_json("--host", "b300")["unit"]
    assert "DeviceAllow=char-infiniband_verbs rw" in plan_json("--host", "b300", "--set", "service.rdma=true")["unit"]


def test_the_plan_says_which_systemd_it_assumed(plan_json) -> None:
    plan = plan_json("--host", "b300")
    assert plan["systemd"] == {"version": 255, "assumed": True}
    assert any("rendered for systemd 255 (assumed" in note for note in plan["notes"])
    old = plan_json("--host", "b300", "--set", "service.systemd_version=249")
    assert "\nRestartSteps=" not in old["unit"] and "\nRestartSec=15" in old["unit"]
    assert "SystemCallFilter=pidfd_getfd" in old["unit"] and "SystemCallErrorNumber=EPERM" in old["unit"]


def test_settings_without_effect_in_the_inventory_are_noted(inventory: Path, run) -> None:
    # rtx6000's group_vars set serve.ddtree; under DFLASH it does nothing: a note, not an error
    (inventory / "group_vars" / "rtx6000.yml").write_text(
        (inventory / "group_vars" / "rtx6000.yml").read_text().replace("algorithm: DDTREE", "algorithm: DFLASH")
    )
    rc, out, err = run("plan", "--json", "--host", "rtx6000", "--inventory", str(inventory))
    assert rc == 0, err
    notes = json.loads(out)["notes"]
    assert any("dflash_serve.ddtree.budget has no effect" in n and "group_vars/rtx6000.yml" in n for n in notes), notes


@pytest.mark.parametrize("name", ["dflash_cli_set", "dflash_plan", "dflash_host_type"])
def test_variables_provision_sets_are_refused_in_the_inventory(inventory: Path, run, name: str) -> None:
    path = inventory / "group_vars" / "b300.yml"
    path.write_text(path.read_text() + f"{name}: {{serve.port: 31000}}\n")
    rc, out, err = run("plan", "--host", "b300", "--inventory", str(inventory))
    assert rc == 2 and out == "" and name in err and "set by provision itself" in err, err


@pytest.mark.parametrize(
    "inventory_dir",
    sorted(str(p.relative_to(ROOT)) for p in [ROOT / "inventory", *(ROOT / "inventories").iterdir()] if p.is_dir()),
)
def test_every_shipped_inventory_plans(inventory_dir: str, run) -> None:
    """The production example and every documented inventory (inventories/h200: the GPU verification) plan."""
    rc, out, err = run("plan", "--json", "--host", "all", "--inventory", str(ROOT / inventory_dir))
    assert rc == 0, err
    assert json.loads(out)
