"""The plan's types: what `provision plan` prints and the roles consume as the `dflash_plan` fact."""

from __future__ import annotations

from pydantic import BaseModel

from provision.model.deployment import Deployment


class GpuPlan(BaseModel):
    model: str
    arch: str
    sm: str
    count: int
    memory_gb: int
    interconnect: str


class CudaPlan(BaseModel):
    version: str
    home: str
    method: str
    arch_min: str
    reason: str
    pip_requirements: list[str]
    pip_prefix_subdir: str | None


class DriverPlan(BaseModel):
    min: str
    branch: str
    reason: str


class TritonPlan(BaseModel):
    version: str
    target: str
    cc: int
    bundled_knows: bool | None
    ptxas_override: bool
    reason: str


class FlashinferPlan(BaseModel):
    version: str
    arch_list: str
    workspace_base: str
    requirement: str
    aot_modules: list[str]
    max_jobs: int | None


class SglangPlan(BaseModel):
    source: str
    version: str
    git_url: str | None
    git_ref: str | None
    wheel: str | None
    dialect: str
    torch: str
    torch_cuda: str
    requirement: str
    install_deps: bool


class PythonEnvPlan(BaseModel):
    venv: str
    requirements: list[str]
    torch_index_url: str | None
    index_url: str | None
    wheelhouse: bool


class NodePlan(BaseModel):
    nnodes: int
    node_rank: int
    dist_init_addr: str


class SystemdPlan(BaseModel):
    version: int
    assumed: bool


class ManagedPath(BaseModel):
    """A path apply creates or changes on the host: the play's ownership guard refuses it, or its own
    directory, when it exists and apply did not create it (dflash.provision.ownership)."""

    path: str
    type: str
    owner: str
    mode: str | None
    field: str
    # the directory of its own below service.managed_roots; None at systemd's places (the unit, its StateDirectory)
    own_dir: str | None


class HostPaths(BaseModel):
    """Where the service's files are on the host: the one place every consumer reads them from."""

    unit: str
    env_file: str
    secrets_env: str | None  # only with serve.api_key_file
    build_json: str
    drafter_json: str
    state_dir: str  # the unit's StateDirectory
    serving_state: str  # day 2's record: current and last good config
    libexec: str
    argcheck: str
    standin: str | None  # only with the stand-in launcher
    watchdog_settings: str
    watchdog_dir: str


class Plan(BaseModel):
    host: str
    groups: list[str]
    gpu: GpuPlan
    cuda: CudaPlan
    driver: DriverPlan
    triton: TritonPlan
    flashinfer: FlashinferPlan
    sglang: SglangPlan
    python_env: PythonEnvPlan
    multinode: NodePlan | None
    systemd: SystemdPlan
    managed_paths: list[ManagedPath]
    paths: HostPaths
    config: Deployment
    env: dict[str, str]
    argv: list[str]
    server_args: list[str]
    service_address: str
    service_url: str
    env_file: str
    unit: str
    notes: list[str]
