"""The deploy play's role parameters, read off a host's plan (its JSON form, as the resolve action sets dflash_plan).

The resolve action sets them as the host's facts beside dflash_plan, as values: each role reads its parameters as
data, where play vars of the form "{{ dflash_plan.… }}" were templates that Ansible 2.19 compiles again every time
a variable names them (hundreds of times in the one look and the decision of a re-apply). As host facts they rank
above the inventory and the roles' defaults, as those play vars did: a host's inventory cannot bend a parameter.
Play vars, role vars, task vars (a role's include of python_env) and `-e` rank above them; the play and the roles'
vars define none of these names. Light on purpose, like provision.ansible.handoff: the action loads this in
Ansible's main process.
"""

from __future__ import annotations

import re
from typing import Any

# role parameter -> where in the plan its value is (dotted keys)
FROM_PLAN: dict[str, str] = {
    # nvidia_driver
    "nvidia_driver_branch": "driver.branch",
    "nvidia_driver_min": "driver.min",
    "nvidia_driver_reason": "driver.reason",
    "nvidia_driver_arch": "gpu.arch",
    # cuda_toolkit
    "cuda_toolkit_version": "cuda.version",
    "cuda_toolkit_method": "cuda.method",
    "cuda_toolkit_home": "cuda.home",
    "cuda_toolkit_driver_min": "driver.min",
    "cuda_toolkit_pip_requirements": "cuda.pip_requirements",
    "cuda_toolkit_pip_prefix_subdir": "cuda.pip_prefix_subdir",
    # python_env
    "python_env_venv": "python_env.venv",
    "python_env_requirements": "python_env.requirements",
    "python_env_use_wheelhouse": "python_env.wheelhouse",
    "python_env_user": "config.service.user",
    "python_env_user_home": "paths.state_dir",
    # model_store
    "model_store_model": "config.model",
    "model_store_drafter": "config.drafter",
    "model_store_service_user": "config.service.user",
    "model_store_drafter_json": "paths.drafter_json",
    # triton
    "triton_version": "triton.version",
    "triton_target": "triton.target",
    "triton_cc": "triton.cc",
    "triton_ptxas_override": "triton.ptxas_override",
    "triton_bundled_knows": "triton.bundled_knows",
    "triton_cache_dir": "config.triton.cache_dir",
    "triton_user": "config.service.user",
    "triton_venv": "python_env.venv",
    # sglang
    "sglang_requirement": "sglang.requirement",
    "sglang_install_deps": "sglang.install_deps",
    "sglang_venv": "python_env.venv",
    "sglang_server_args": "server_args",
    "sglang_use_wheelhouse": "python_env.wheelhouse",
    "sglang_libexec_dir": "paths.libexec",
    # flashinfer
    "flashinfer_requirement": "flashinfer.requirement",
    "flashinfer_install_deps": "sglang.install_deps",
    "flashinfer_arch_list": "flashinfer.arch_list",
    "flashinfer_workspace_base": "flashinfer.workspace_base",
    "flashinfer_aot_modules": "flashinfer.aot_modules",
    "flashinfer_max_jobs": "flashinfer.max_jobs",
    "flashinfer_cuda_home": "cuda.home",
    "flashinfer_venv": "python_env.venv",
    "flashinfer_user": "config.service.user",
    "flashinfer_use_wheelhouse": "python_env.wheelhouse",
    "flashinfer_libexec_dir": "paths.libexec",
    # sglang_service
    "sglang_service_name": "config.service.name",
    "sglang_service_config_dir": "config.service.config_dir",
    "sglang_service_unit": "unit",
    "sglang_service_env_file": "env_file",
    "sglang_service_venv": "python_env.venv",
    "sglang_service_api_key_file": "config.serve.api_key_file",
    "sglang_service_url": "service_url",
    "sglang_service_ready_timeout_s": "config.service.start_timeout_s",
    "sglang_service_launcher": "config.service.launcher",
    "sglang_service_standin_path": "config.service.standin_path",
    "sglang_service_serving_config": "config",
    "sglang_service_state_dir": "paths.serving_state",
    "sglang_service_watchdog": "config.watchdog",
}
# the same, where the plan's null means "none": the roles take an empty string (pip's default index)
FROM_PLAN_OR_EMPTY: dict[str, str] = {
    "python_env_torch_index_url": "python_env.torch_index_url",
    "python_env_index_url": "python_env.index_url",
    "sglang_dialect": "sglang.dialect",
    "sglang_index_url": "python_env.index_url",
    "sglang_extra_index_url": "python_env.torch_index_url",
    "flashinfer_index_url": "python_env.index_url",
    "flashinfer_extra_index_url": "python_env.torch_index_url",
}
# the environment variables that point Triton at its ptxas (the triton role checks and proves them)
TRITON_PTXAS = re.compile(r"^TRITON_PTXAS")


def _at(plan: dict[str, Any], where: str) -> Any:
    value: Any = plan
    for key in where.split("."):
        value = value[key]
    return value


def role_vars(plan: dict[str, Any], standin_src: str) -> dict[str, Any]:
    """Every role parameter the deploy play passes, from the host's plan; standin_src is where this control node
    keeps the SGLang stand-in (dflash_standin_src)."""
    params = {name: _at(plan, where) for name, where in FROM_PLAN.items()}
    params |= {name: _at(plan, where) or "" for name, where in FROM_PLAN_OR_EMPTY.items()}
    params["model_store_python"] = f"{_at(plan, 'config.service.venv')}/bin/python3"
    params["triton_ptxas_env"] = {k: v for k, v in plan["env"].items() if TRITON_PTXAS.match(k)}
    params["sglang_service_standin_src"] = standin_src
    return params
