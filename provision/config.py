"""What a host's deployment depends on: the pydantic models that decide and validate.

Field-level rules (types, ranges, choices, unknown keys) are pydantic's. Rules that relate fields
raise RuleError with the dotted path of the field to blame, so the error names the field the user
has to change.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from provision.tables import builds, compat, version_tuple

CUDA_VERSION = r"^\d+\.\d+$"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class RuleError(Exception):
    """A rule across fields failed. Not a ValueError on purpose: pydantic lets it through unwrapped."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path, got {value!r}")
    return value


AbsPath = Annotated[str, AfterValidator(_absolute)]


class GpuProfile(Section):
    model: str = Field(min_length=1)
    arch: str = Field(description='compute capability, like "12.0"')
    count: int = Field(ge=1, le=16)
    memory_gb: int = Field(ge=1)
    interconnect: Literal["pcie", "nvlink"]

    @field_validator("arch", mode="before")
    @classmethod
    def _known_arch(cls, value: object) -> str:
        text = str(value)
        known = compat().archs
        if text not in known:
            raise ValueError(f"unknown compute capability {text!r}; known: {', '.join(known)}")
        return text

    @property
    def sm(self) -> str:
        return "sm_" + self.arch.replace(".", "")


class CudaSpec(Section):
    version: str | None = Field(default=None, pattern=CUDA_VERSION)
    method: Literal["nvidia_repo", "pip", "preinstalled"] = "nvidia_repo"
    home: AbsPath | None = None

    @field_validator("version", mode="before")
    @classmethod
    def _known_toolkit(cls, value: object) -> str | None:
        if value is None:
            return None
        text = str(value)
        known = compat().toolkits
        if text not in known:
            raise ValueError(f"unsupported toolkit {text!r}; supported: {', '.join(known)}")
        return text


class SglangBuild(Section):
    source: Literal["release", "git", "wheel"] = "release"
    version: str = "0.5.23"
    git_url: str = "https://github.com/sgl-project/sglang.git"
    git_ref: str | None = None
    wheel: str | None = None
    base_release: str | None = Field(
        default=None, description="release whose pins (torch, triton, flashinfer) a git or wheel build keeps"
    )
    dialect: str | None = None
    torch_cuda: str | None = Field(default=None, pattern=CUDA_VERSION)
    install_deps: bool = Field(
        default=True, description="false: SGLang alone, beside python_env's packages (hosts without GPUs)"
    )

    @model_validator(mode="after")
    def _source_complete(self) -> SglangBuild:
        table = builds()
        if self.source == "git" and not self.git_ref:
            raise RuleError("sglang.git_ref", "required when source is git (a branch, tag, commit or refs/pull/N/head)")
        if self.source == "wheel" and not self.wheel:
            raise RuleError("sglang.wheel", "required when source is wheel (a path or URL of the .whl)")
        release = self.release_name
        if release not in table.releases:
            field = "sglang.version" if self.source == "release" else "sglang.base_release"
            raise RuleError(field, f"unknown release {release!r}; known: {', '.join(table.releases)}")
        if self.source != "release" and self.dialect is None:
            raise RuleError("sglang.dialect", f"required for a {self.source} build; known: {', '.join(table.dialects)}")
        if self.dialect is not None and self.dialect not in table.dialects:
            raise RuleError("sglang.dialect", f"unknown dialect {self.dialect!r}; known: {', '.join(table.dialects)}")
        return self

    @property
    def release_name(self) -> str:
        return self.version if self.source == "release" else (self.base_release or self.version)

    @property
    def dialect_name(self) -> str:
        return self.dialect or builds().releases[self.release_name].dialect


class ModelFiles(Section):
    """Where a model's files come from; the model_store role puts them at `path`."""

    path: AbsPath
    source: Literal["present", "huggingface", "copy"] = Field(
        default="present", description="present: only check the files; huggingface: fetch repo; copy: from copy_from"
    )
    repo: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    revision: str | None = None
    copy_from: AbsPath | None = Field(default=None, description="a directory on the control node")
    token_file: AbsPath | None = Field(default=None, description="control-node file (mode 0600) with the HF token")
    min_free_gb: int | None = Field(default=None, ge=0, description="free space required before fetching")

    @model_validator(mode="after")
    def _source_complete(self) -> ModelFiles:
        section = "drafter" if isinstance(self, Drafter) else "model"
        if self.source == "huggingface" and not self.repo:
            raise RuleError(f"{section}.repo", "required when source is huggingface (like org/name)")
        if self.source == "copy" and not self.copy_from:
            raise RuleError(f"{section}.copy_from", "required when source is copy (a directory on the control node)")
        return self


class TargetModel(ModelFiles):
    served_name: str | None = None
    trust_remote_code: bool = True


class Drafter(ModelFiles):
    block_size: int = Field(ge=2, description="the block size the drafter was trained with")


class DDTree(Section):
    budget: int = Field(default=8, ge=1)
    topk: int = Field(default=4, ge=1)


class CudaGraph(Section):
    enabled: bool = True
    prefill: bool = Field(default=True, description="capture prefill graphs too")
    max_bs: int | None = Field(default=None, ge=1)


class Serve(Section):
    algorithm: Literal["DFLASH", "DDTREE", "NONE"] = "DFLASH"
    block_size: int = Field(default=8, ge=2)
    allow_untrained_depth: bool = False
    draft_window: int | None = Field(default=None, ge=1)
    ddtree: DDTree = DDTree()
    tp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    dp_attention: bool = False
    attention_backend: str | None = None
    draft_attention_backend: str | None = None
    cuda_graph: CudaGraph = CudaGraph()
    nccl_p2p_disable: bool = Field(default=False, description="NCCL_P2P_DISABLE=1 (PCIe P2P hangs, NVIDIA/nccl#1999)")
    context_length: int | None = Field(default=None, ge=1)
    mem_fraction: float | None = Field(default=None, gt=0, lt=1)
    kv_cache_dtype: Literal["auto", "fp8_e5m2", "fp8_e4m3", "bf16"] | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=30000, ge=1, le=65535)
    api_key_file: AbsPath | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    metrics: bool = True
    extra_args: list[str] = []
    env: dict[str, str] = {}

    @field_validator("attention_backend", "draft_attention_backend")
    @classmethod
    def _known_backend(cls, value: str | None) -> str | None:
        known = compat().attention_backends
        if value is not None and value not in known:
            raise ValueError(f"unknown attention backend {value!r}; allowed: {', '.join(known)}")
        return value

    @field_validator("host")
    @classmethod
    def _ip(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"must be an IP address to bind (like 127.0.0.1 or 0.0.0.0), got {value!r}") from None
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not ENV_NAME.match(name):
                raise ValueError(f"invalid environment variable name {name!r}")
        return value

    @property
    def speculative(self) -> bool:
        return self.algorithm != "NONE"


class TritonSpec(Section):
    version: str | None = Field(default=None, description="defaults to the SGLang build's pin")
    ptxas: Literal["auto", "toolkit", "bundled"] = Field(
        default="auto", description="auto: use the toolkit's ptxas only where Triton's bundled one is too old"
    )
    cache_dir: AbsPath = "/var/cache/sglang-dflash/triton"


FLASHINFER_MODULES = ("activation", "norm", "sampling", "rope", "page", "cascade", "batch_mla", "batch_prefill_mla",
                      "fmha_cutlass_mla")  # fmt: skip


class FlashinferSpec(Section):
    arch_list: str | None = Field(default=None, description="defaults to the arch in FlashInfer's spelling")
    workspace_base: AbsPath = "/var/cache/sglang-dflash/flashinfer"
    aot_modules: list[Literal[FLASHINFER_MODULES]] = Field(  # type: ignore[valid-type]
        default=["norm", "batch_mla"], description="built ahead of time once per arch and shipped to the others"
    )
    max_jobs: int | None = Field(default=None, ge=1, description="nvcc jobs; default: sized to cores and memory")


class PythonEnvSpec(Section):
    """The service's virtualenv: torch and Triton pinned to the toolkit, from an index or a wheelhouse."""

    torch: str | None = Field(default=None, description="defaults to the SGLang build's pin")
    torch_variant: Literal["cuda", "cpu"] = Field(default="cuda", description="cuda: the build for torch's CUDA")
    torch_index_url: str | None = Field(
        default=None, description="defaults to download.pytorch.org's index for the variant; empty: none"
    )
    index_url: str | None = Field(default=None, description="the package index; default: pip's own")
    wheelhouse: bool = Field(default=True, description="the control node downloads once and ships to the hosts")
    extra_requirements: list[str] = []


class ServiceSpec(Section):
    name: str = Field(default="sglang-dflash", pattern=r"^[a-zA-Z0-9_.-]+$")
    user: str = Field(default="sglang", pattern=r"^[a-z_][a-z0-9_-]*$")
    venv: AbsPath = "/opt/sglang-dflash/venv"
    config_dir: AbsPath = "/etc/sglang-dflash"
    start_timeout_s: int = Field(default=1800, ge=5, description="a 590B model loads for minutes")
    stop_timeout_s: int = Field(default=180, ge=5, description="SIGTERM drains in-flight requests first")
    launcher: Literal["sglang", "standin"] = Field(
        default="sglang", description="standin: hosts without GPUs run the SGLang stand-in (tests/standin), same argv"
    )
    standin_path: AbsPath = "/opt/dflash-provision/libexec/sglang_standin.py"
    limit_nofile: int = Field(default=65536, ge=1024, description="open files (SGLang raises its soft limit to it)")


class MultiNode(Section):
    """Hosts that form one serving instance; a host's node rank is its place in `nodes`."""

    nodes: list[str] = Field(min_length=2)
    init_addr: str | None = Field(default=None, description="defaults to the first node's address")
    init_port: int = Field(default=50000, ge=1, le=65535)

    @field_validator("nodes")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("each node may appear once")
        return value


class Deployment(Section):
    gpu: GpuProfile
    cuda: CudaSpec = CudaSpec()
    sglang: SglangBuild = SglangBuild()
    model: TargetModel
    drafter: Drafter | None = None
    serve: Serve = Serve()
    triton: TritonSpec = TritonSpec()
    flashinfer: FlashinferSpec = FlashinferSpec()
    python_env: PythonEnvSpec = PythonEnvSpec()
    service: ServiceSpec = ServiceSpec()
    multinode: MultiNode | None = None

    @property
    def nnodes(self) -> int:
        return len(self.multinode.nodes) if self.multinode else 1

    @model_validator(mode="after")
    def _rules(self) -> Deployment:
        self._check_speculative()
        self._check_parallelism()
        self._check_backends()
        self._check_toolkit()
        return self

    def _check_parallelism(self) -> None:
        serve, gpus = self.serve, self.gpu.count * self.nnodes
        if serve.tp * serve.pp > gpus:
            where = f"{self.gpu.count} per node x {self.nnodes} nodes" if self.nnodes > 1 else "this host"
            raise RuleError("serve.tp", f"tp {serve.tp} x pp {serve.pp} needs more GPUs than {gpus} ({where})")
        if serve.ep not in (1, serve.tp):
            raise RuleError("serve.ep", f"must be 1 or equal to tp ({serve.tp}), got {serve.ep}")

    def _check_speculative(self) -> None:
        serve = self.serve
        if not serve.speculative:
            return
        if serve.dp_attention:
            raise RuleError("serve.dp_attention", f"{serve.algorithm} does not support dp-attention; set false")
        if serve.pp > 1:
            raise RuleError("serve.pp", f"{serve.algorithm} does not support pipeline parallelism; allowed: 1")
        if self.drafter is None:
            raise RuleError("drafter", f"{serve.algorithm} needs a drafter (path and trained block_size)")
        if serve.draft_window is not None and serve.draft_window < serve.block_size:
            raise RuleError(
                "serve.draft_window", f"must be >= block_size ({serve.block_size}), got {serve.draft_window}"
            )
        trained = self.drafter.block_size
        if serve.block_size > trained and not serve.allow_untrained_depth:
            raise RuleError(
                "serve.block_size",
                f"{serve.block_size} is above the drafter's trained block size {trained}: it asks for depths "
                f"{trained}..{serve.block_size - 1} the drafter never trained on (it predicts 1..{trained - 1}); "
                "allowed: <= "
                f"{trained}, or set serve.allow_untrained_depth=true",
            )
        dialect = builds().resolved_dialect(self.sglang.dialect_name)
        if serve.algorithm not in dialect.algorithms:
            raise RuleError(
                "serve.algorithm",
                f"{serve.algorithm} is not spoken by the SGLang build (dialect {self.sglang.dialect_name}: "
                f"{dialect.description}); allowed: {', '.join([*dialect.algorithms, 'NONE'])}",
            )

    def _check_backends(self) -> None:
        refused = compat().attention_refused.get(self.gpu.arch, {})
        for field in ("attention_backend", "draft_attention_backend"):
            backend = getattr(self.serve, field)
            if backend in refused:
                allowed = [b for b in compat().attention_backends if b not in refused]
                raise RuleError(
                    f"serve.{field}",
                    f"{backend} does not run on {self.gpu.sm} ({refused[backend]}); allowed: {', '.join(allowed)}",
                )

    def _check_toolkit(self) -> None:
        pin = self.cuda.version
        if pin is None:
            return
        first = compat().archs[self.gpu.arch].first_cuda
        if version_tuple(pin) < version_tuple(first):
            newer = [v for v in compat().toolkits if version_tuple(v) >= version_tuple(first)]
            raise RuleError(
                "cuda.version",
                f"CUDA {pin} cannot compile {self.gpu.sm} ({self.gpu.model}); it needs >= {first}; "
                f"allowed: {', '.join(newer)}",
            )
        torch_cuda = self.torch_cuda
        if version_tuple(pin)[0] != version_tuple(torch_cuda)[0]:
            raise RuleError(
                "cuda.version",
                f"CUDA {pin} does not match the CUDA {torch_cuda} build of torch that SGLang uses (JIT kernels "
                f"must be built with the same major version); pin {torch_cuda.split('.')[0]}.x or set "
                "sglang.torch_cuda to a matching torch build",
            )

    @property
    def torch_cuda(self) -> str:
        return self.sglang.torch_cuda or builds().releases[self.sglang.release_name].torch_cuda
