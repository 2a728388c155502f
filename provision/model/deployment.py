"""What a host's deployment depends on: the pydantic models that decide and validate.

Field-level rules (types, ranges, choices, unknown keys) are pydantic's. Rules that relate fields
raise RuleError with the dotted path of the field to blame, so the error names the field the user
has to change.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from provision.model.tables import builds, compat, parsers, version_tuple
from provision.model.translate import kind

CUDA_VERSION = r"^\d+\.\d+$"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# a host name as a URL or --dist-init-addr carries it (RFC 1123 labels)
HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
GIT_REF = re.compile(r"^(?!-)(?!.*\.\.)[A-Za-z0-9._/-]+$")
# A variable or flag name that says "secret" in one of its components (split at - and _): KEY or AUTH as a
# component, or a component that is or ends in TOKEN, SECRET(S), PASSWORD, PASSWD, PASSPHRASE, CREDENTIAL(S),
# APIKEY (HF_TOKEN, HFTOKEN, AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS). Such a value would sit in
# the world-readable unit or env file. Plurals of counts do not (TOKENIZERS_PARALLELISM, --num-draft-tokens).
SECRET_NAME = re.compile(
    r"(^|[-_])([a-z0-9]*(token|secrets?|password|passwd|passphrase|credentials?|api[-_]?key)|key|auth)([-_]|$)",
    re.I,
)
# Linux's limits on the paths this tool puts on a host (include/uapi/linux/limits.h; systemd's path_is_valid
# and filename_is_valid hold paths to them too, and ignore a directive whose path breaks them): PATH_MAX
# counts the terminating NUL, NAME_MAX is one component. Bytes, as the kernel counts them (UTF-8).
PATH_MAX = 4096
NAME_MAX = 255


class RuleError(Exception):
    """A rule across fields failed. Not a ValueError on purpose: pydantic lets it through unwrapped."""

    def __init__(self, field: str, message: str, related: tuple[str, ...] = ()) -> None:
        """related: the other fields the rule reads; the error is blamed on whichever a --set gave."""
        self.field = field
        self.message = message
        self.related = related
        super().__init__(f"{field}: {message}")


def _control_characters(value: Any) -> Iterator[str]:
    """Control characters anywhere in a value (strings, list items, mapping keys and values)."""
    if isinstance(value, str):
        yield from (c for c in value if unicodedata.category(c) in ("Cc", "Zl", "Zp"))
    elif isinstance(value, list):
        for item in value:
            yield from _control_characters(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _control_characters(key)
            yield from _control_characters(item)


class Section(BaseModel):
    # strict: a YAML `yes` is no port, "8" is no count; nothing is coerced in either direction
    model_config = ConfigDict(extra="forbid", strict=True, regex_engine="python-re", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _no_control_characters(cls, value: Any) -> Any:
        # a newline or carriage return would add lines to the unit, the env file or a log line
        bad = next(_control_characters(value), None)
        if bad is not None:
            raise ValueError(f"control character U+{ord(bad):04X} is not allowed (it could add lines to the unit)")
        return value


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path, got {value!r}")
    if value == "/":
        raise ValueError("must name a directory or file below /, not / itself")
    if value != value.strip():
        raise ValueError(f"must not begin or end with white space (systemd strips it), got {value!r}")
    if "\\" in value:
        raise ValueError(
            f"a backslash is not allowed in a path (systemd unescapes it in some directives), got {value!r}"
        )
    normal = posixpath.normpath(value)
    if normal != value or value.startswith("//"):
        raise ValueError(f"must be a normalized path (no '.', '..', '//' or trailing '/'), like {normal!r}")
    return check_path_limits(value)


def check_path_limits(value: str) -> str:
    """A path within the kernel's PATH_MAX, each component within NAME_MAX (bytes)."""
    size = len(value.encode())
    if size >= PATH_MAX:
        raise ValueError(f"is {size} bytes long; a path on Linux has at most {PATH_MAX - 1} (PATH_MAX)")
    long = next((part for part in value.split("/") if len(part.encode()) > NAME_MAX), None)
    if long is not None:
        raise ValueError(
            f"has a component of {len(long.encode())} bytes ({long[:20]}...); "
            f"a file name on Linux has at most {NAME_MAX} (NAME_MAX)"
        )
    return value


def _url(value: str, schemes: tuple[str, ...]) -> str:
    parts = urlsplit(value)
    if parts.scheme not in schemes or (not parts.netloc and parts.scheme != "file") or any(c.isspace() for c in value):
        raise ValueError(f"must be a URL ({', '.join(s + '://' for s in schemes)}...) without spaces, got {value!r}")
    if parts.fragment or "#" in value:
        raise ValueError(f"a URL fragment (#...) is not allowed here, got {value!r}")
    # ssh's and git's user name (git@host) is no secret; a password is, and so is any user part of an
    # http(s) URL (a token given as the user): the plan prints the URL and the hosts record it
    if parts.password is not None or (parts.username is not None and parts.scheme in ("http", "https")):
        raise ValueError(
            f"must not carry credentials (user:password@ or token@), got {parts.scheme}://...@{parts.hostname}: "
            "the plan prints and records the URL; put them in ~/.netrc (pip and git read it) instead"
        )
    return value


def _pep440(value: str) -> str:
    try:
        canonical = str(Version(value))
    except InvalidVersion:
        raise ValueError(f"must be a PEP 440 version, like 3.6.0, got {value!r}") from None
    if canonical != value:
        raise ValueError(f"must be written as {canonical!r} (PEP 440's normal form), got {value!r}")
    return value


def _requirement(value: str) -> str:
    try:
        Requirement(value)
    except InvalidRequirement as err:
        raise ValueError(f"must be a PEP 508 requirement, like 'numpy>=2': {err}") from None
    return value


def check_init_addr(value: str) -> str:
    """An address torch.distributed's --dist-init-addr HOST:PORT carries: IPv4 or a host name."""
    try:
        if ipaddress.ip_address(value).version == 6:
            raise ValueError(f"an IPv6 address cannot be given as SGLang's --dist-init-addr, got {value!r}; "
                             "use an IPv4 address or a host name")  # fmt: skip
    except ValueError as err:
        if "IPv6" in str(err) or not HOSTNAME.match(value):
            raise ValueError(str(err) if "IPv6" in str(err) else
                             f"must be an IPv4 address or a host name, got {value!r}") from None  # fmt: skip
    return value


# Where apply may create the paths it manages, by default (service.managed_roots overrides it per site): every
# path it creates and changes lies in a directory of its own one level or more below a root (/opt/NAME/...,
# /etc/NAME). Which NAME is its own is the host's to say: the play's ownership guard refuses a managed path, or
# its own directory, that exists and that apply did not create (dflash.provision.ownership).
MANAGED_ROOTS = ("/opt", "/srv", "/var/cache", "/var/lib", "/etc", "/usr/local", "/models")


def inside(path: str, parent: str) -> bool:
    """Whether path is parent itself or below it."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")


AbsPath = Annotated[str, AfterValidator(_absolute)]
HttpUrl = Annotated[str, AfterValidator(lambda v: _url(v, ("https", "http")))]
GitUrl = Annotated[str, AfterValidator(lambda v: _url(v, ("https", "http", "ssh", "git", "file")))]
Pep440 = Annotated[str, AfterValidator(_pep440)]


def _version_text(value: object) -> str:
    """A version as text: YAML reads 12.10 as the number 12.1, so a number is refused, never converted."""
    if not isinstance(value, str):
        shown = f" {value}" if isinstance(value, (int, float)) else ""
        raise ValueError(f'must be a string, like "12.0" (quoted in YAML), got {kind(value)}{shown}')
    return value


class GpuProfile(Section):
    model: str = Field(min_length=1)
    arch: str = Field(description='compute capability, like "12.0"')
    count: int = Field(ge=1, le=16)
    memory_gb: int = Field(ge=1, le=100_000)
    interconnect: Literal["pcie", "nvlink"]

    @field_validator("arch", mode="before")
    @classmethod
    def _known_arch(cls, value: object) -> str:
        text = _version_text(value)
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
    # no ':' (it goes on PATH); a preinstalled toolkit may live in the host's own tree (Debian's in /usr)
    home: Annotated[AbsPath, Field(pattern=r"^[^:]*$")] | None = None

    @field_validator("version", mode="before")
    @classmethod
    def _known_toolkit(cls, value: object) -> str | None:
        if value is None:
            return None
        text = _version_text(value)
        known = compat().toolkits
        if text not in known:
            raise ValueError(f"unsupported toolkit {text!r}; supported: {', '.join(known)}")
        return text


class SglangBuild(Section):
    source: Literal["release", "git", "wheel"] = "release"
    version: Pep440 = "0.5.23"
    git_url: GitUrl = "https://github.com/sgl-project/sglang.git"
    git_ref: str | None = Field(default=None, pattern=GIT_REF.pattern)
    wheel: str | None = Field(default=None, description="an absolute path or an http(s) URL of the .whl")
    base_release: Pep440 | None = Field(
        default=None, description="release whose pins (torch, triton, flashinfer) a git or wheel build keeps"
    )
    dialect: str | None = None
    torch_cuda: str | None = Field(default=None, pattern=CUDA_VERSION)
    install_deps: bool = Field(
        default=True, description="false: SGLang alone, beside python_env's packages (hosts without GPUs)"
    )

    @field_validator("wheel")
    @classmethod
    def _wheel(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if "://" in value:
            _url(value, ("https", "http"))
        else:
            _absolute(value)
        if not value.endswith(".whl"):
            raise ValueError(f"must name a .whl file, got {value!r}")
        return value

    @model_validator(mode="after")
    def _source_complete(self) -> SglangBuild:
        table = builds()
        if self.source == "git" and not self.git_ref:
            raise RuleError(
                "sglang.git_ref",
                "sglang.git_ref is required when source is git (a branch, tag, commit or refs/pull/N/head)",
                ("sglang.source",),
            )
        if self.source == "wheel" and not self.wheel:
            raise RuleError(
                "sglang.wheel",
                "sglang.wheel is required when source is wheel (a path or URL of the .whl)",
                ("sglang.source",),
            )
        release = self.release_name
        if release not in table.releases:
            field = "sglang.version" if self.source == "release" else "sglang.base_release"
            raise RuleError(field, f"unknown release {release!r}; known: {', '.join(table.releases)}")
        if self.source != "release" and self.dialect is None:
            raise RuleError(
                "sglang.dialect",
                f"sglang.dialect is required for a {self.source} build; known: {', '.join(table.dialects)}",
                ("sglang.source",),
            )
        if self.dialect is not None and self.dialect not in table.dialects:
            raise RuleError("sglang.dialect", f"unknown dialect {self.dialect!r}; known: {', '.join(table.dialects)}")
        own = table.releases[release].dialect
        if self.source == "release" and self.dialect not in (None, own):
            raise RuleError(
                "sglang.dialect",
                f"the {release} release speaks only its own dialect {own}, not {self.dialect}; "
                "remove sglang.dialect, or set sglang.source to git or wheel for a build that speaks it",
            )
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
    revision: str | None = Field(default=None, pattern=GIT_REF.pattern)
    copy_from: AbsPath | None = Field(default=None, description="a directory on the control node")
    token_file: AbsPath | None = Field(default=None, description="control-node file (mode 0600) with the HF token")
    min_free_gb: int | None = Field(default=None, ge=0, le=1_000_000, description="free space required before fetching")

    @model_validator(mode="after")
    def _source_complete(self) -> ModelFiles:
        section = "drafter" if isinstance(self, Drafter) else "model"
        if self.source == "huggingface" and not self.repo:
            raise RuleError(
                f"{section}.repo",
                f"{section}.repo is required when source is huggingface (like org/name)",
                (f"{section}.source",),
            )
        if self.source == "copy" and not self.copy_from:
            raise RuleError(
                f"{section}.copy_from",
                f"{section}.copy_from is required when source is copy (a directory on the control node)",
                (f"{section}.source",),
            )
        return self


class TargetModel(ModelFiles):
    served_name: str | None = Field(default=None, min_length=1, max_length=256)
    trust_remote_code: bool = True


class Drafter(ModelFiles):
    block_size: int = Field(ge=2, le=64, description="the block size the drafter was trained with")


class DDTree(Section):
    budget: int = Field(default=8, ge=1, le=4096)
    topk: int = Field(default=4, ge=1, le=1024)


class CudaGraph(Section):
    enabled: bool = True
    prefill: bool = Field(default=True, description="capture prefill graphs too")
    max_bs: int | None = Field(default=None, ge=1, le=4096)


class Serve(Section):
    algorithm: Literal["DFLASH", "DDTREE", "NONE"] = "DFLASH"
    block_size: int = Field(default=8, ge=2, le=64)
    allow_untrained_depth: bool = False
    draft_window: int | None = Field(default=None, ge=1, le=10_000_000)
    ddtree: DDTree = DDTree()
    tp: int = Field(default=1, ge=1, le=1024)
    ep: int = Field(default=1, ge=1, le=1024)
    pp: int = Field(default=1, ge=1, le=1024)
    dp_attention: bool = False
    attention_backend: str | None = None
    draft_attention_backend: str | None = None
    cuda_graph: CudaGraph = CudaGraph()
    nccl_p2p_disable: bool = Field(default=False, description="NCCL_P2P_DISABLE=1 (PCIe P2P hangs, NVIDIA/nccl#1999)")
    context_length: int | None = Field(default=None, ge=1, le=10_000_000)
    mem_fraction: float | None = Field(default=None, gt=0, lt=1)
    kv_cache_dtype: Literal["auto", "fp8_e5m2", "fp8_e4m3", "bf16"] | None = None
    host: str = "127.0.0.1"
    # no capability is granted to the unprivileged service user, so no port below 1024
    port: int = Field(default=30000, ge=1024, le=65535)
    api_key_file: AbsPath | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    metrics: bool = True
    # read with SGLang's own grammar against the rendered flags: provision/planning/render.py check_extra_args
    extra_args: list[str] = []
    env: dict[str, str] = {}

    @field_validator("attention_backend", "draft_attention_backend")
    @classmethod
    def _known_backend(cls, value: str | None) -> str | None:
        known = compat().attention_backends
        if value is not None and value not in known:
            raise ValueError(f"unknown attention backend {value!r}; allowed: {', '.join(known)}")
        return value

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if SECRET_NAME.search(name):
                raise ValueError(
                    f"{name} looks like a secret; serve.env lands in a world-readable file: give the API key "
                    "as serve.api_key_file (a 0600 file) and a Hugging Face token as model.token_file"
                )
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
    version: Pep440 | None = Field(default=None, description="defaults to the SGLang build's pin")
    ptxas: Literal["auto", "toolkit", "bundled"] = Field(
        default="auto", description="auto: use the toolkit's ptxas only where Triton's bundled one is too old"
    )
    cache_dir: AbsPath = "/var/cache/sglang-dflash/triton"


FLASHINFER_MODULES = ("activation", "norm", "sampling", "rope", "page", "cascade", "batch_mla", "batch_prefill_mla",
                      "fmha_cutlass_mla")  # fmt: skip


class FlashinferSpec(Section):
    arch_list: str | None = Field(
        default=None,
        pattern=r"^\d+\.\d+[af]?( \d+\.\d+[af]?)*$",
        description="defaults to the arch in FlashInfer's spelling",
    )
    workspace_base: AbsPath = "/var/cache/sglang-dflash/flashinfer"
    aot_modules: list[Literal[FLASHINFER_MODULES]] = Field(  # type: ignore[valid-type]
        default=["norm", "batch_mla"], description="built ahead of time once per arch and shipped to the others"
    )
    max_jobs: int | None = Field(
        default=None, ge=1, le=1024, description="nvcc jobs; default: sized to cores and memory"
    )


class PythonEnvSpec(Section):
    """The service's virtualenv: torch and Triton pinned to the toolkit, from an index or a wheelhouse."""

    torch: Pep440 | None = Field(default=None, description="defaults to the SGLang build's pin")
    torch_variant: Literal["cuda", "cpu"] = Field(default="cuda", description="cuda: the build for torch's CUDA")
    torch_index_url: HttpUrl | Literal[""] | None = Field(
        default=None, description="defaults to download.pytorch.org's index for the variant; empty: none"
    )
    index_url: HttpUrl | None = Field(default=None, description="the package index; default: pip's own")
    wheelhouse: bool = Field(default=True, description="the control node downloads once and ships to the hosts")
    extra_requirements: list[Annotated[str, AfterValidator(_requirement)]] = []


class ServiceSpec(Section):
    # a unit name systemd accepts that is also a safe file and directory name (no "..", no leading dot)
    name: str = Field(default="sglang-dflash", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    user: str = Field(default="sglang", pattern=r"^[a-z_][a-z0-9_-]*$", max_length=32)
    venv: AbsPath = "/opt/sglang-dflash/venv"
    config_dir: AbsPath = "/etc/sglang-dflash"
    start_timeout_s: int = Field(default=1800, ge=5, le=86400, description="a 590B model loads for minutes")
    stop_timeout_s: int = Field(default=180, ge=5, le=86400, description="SIGTERM drains in-flight requests first")
    launcher: Literal["sglang", "standin"] = Field(
        default="sglang",
        description="standin: hosts without GPUs run the SGLang stand-in (a test double), same argv",
    )
    standin_path: AbsPath = "/opt/dflash-provision/libexec/sglang_standin.py"
    rdma: bool = Field(
        default=False, description="open the InfiniBand verbs and rdma_cm devices (multi-node instances always do)"
    )
    systemd_version: int | None = Field(
        default=None,
        ge=230,
        le=999,
        description="the host's systemd; unset: `provision plan` assumes 255 and the play renders for the "
        "version the host reports",
    )
    limit_nofile: int = Field(
        default=65536, ge=1024, le=1048576, description="open files (SGLang raises its soft limit to it)"
    )

    managed_roots: list[AbsPath] = Field(
        default=list(MANAGED_ROOTS),
        min_length=1,
        description="where apply may create the directories and files it manages, each in a directory of its own",
    )
    adopt: list[str] = Field(
        default=[],
        description="managed paths (or their own directories) and the service account that exist on the host "
        "without apply having created them, which apply may take over",
    )

    @field_validator("name")
    @classmethod
    def _one_name(cls, value: str) -> str:
        # the unit is NAME.service; a NAME that says .service would be NAME.service.service, and a second
        # spelling of one unit. Whether the name is another daemon's is the host's to say (the ownership guard).
        if value.endswith(".service"):
            raise ValueError(f"give the name without .service (the unit is NAME.service), like {value[:-8]!r}")
        return value

    @field_validator("managed_roots", "adopt")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        twice = sorted({v for v in value if value.count(v) > 1})
        if twice:
            raise ValueError(f"{twice[0]} is given twice")
        return value

    @field_validator("user")
    @classmethod
    def _unprivileged(cls, value: str) -> str:
        if value == "root":
            raise ValueError("must be an unprivileged account, not root: the unit's hardening assumes one")
        return value

    @field_validator("venv")
    @classmethod
    def _program_path(cls, value: str) -> str:
        # its bin/ goes on PATH (split at ':'); its python is ExecStart='s program, which systemd refuses with
        # quotes and takes both as a path (no $-expansion) and as argv[0] (with it)
        bad = sorted(set(value) & set(":$\"'"))
        if bad:
            raise ValueError(
                f"{' '.join(bad)} cannot be in the venv's path (PATH and ExecStart='s program), got {value!r}"
            )
        return value

    # The host paths the service's files take, derived here once: the plan carries them (Plan.paths) to the roles,
    # day 2, the sweep and verify, which never compose them again.
    @property
    def unit_path(self) -> str:
        return f"/etc/systemd/system/{self.name}.service"

    @property
    def env_path(self) -> str:
        return f"{self.config_dir}/{self.name}.env"

    @property
    def secrets_path(self) -> str:
        return f"{self.config_dir}/secrets.env"

    @property
    def build_json_path(self) -> str:
        return f"{self.config_dir}/{self.name}.build.json"

    @property
    def drafter_json_path(self) -> str:
        return f"{self.config_dir}/drafter.json"

    @property
    def state_dir(self) -> str:
        """The unit's StateDirectory= (its HOME)."""
        return f"/var/lib/{self.name}"

    @property
    def watchdog_settings_path(self) -> str:
        return f"{self.config_dir}/{self.name}-watchdog.json"

    @property
    def watchdog_dir(self) -> str:
        """The acceptance watchdog's StateDirectory= (DynamicUser: under /var/lib/private)."""
        return f"/var/lib/private/{self.name}-watchdog"


# provision's own places on every host: its scripts, and the serving record day 2 keeps (current, last good)
LIBEXEC_DIR = "/opt/dflash-provision/libexec"
SERVING_STATE_DIR = "/var/lib/dflash-provision/serving"


class MultiNode(Section):
    """Hosts that form one serving instance; a host's node rank is its place in `nodes`."""

    nodes: list[str] = Field(min_length=2)
    init_addr: str | None = Field(default=None, description="defaults to the first node's address")
    init_port: int = Field(default=50000, ge=1024, le=65535)

    @field_validator("init_addr")
    @classmethod
    def _addr(cls, value: str | None) -> str | None:
        if value is not None:
            check_init_addr(value)
        return value

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
    watchdog: Watchdog = Field(default_factory=lambda: Watchdog())

    @property
    def nnodes(self) -> int:
        return len(self.multinode.nodes) if self.multinode else 1

    @model_validator(mode="after")
    def _rules(self) -> Deployment:
        self._check_speculative()
        self._check_parallelism()
        self._check_backends()
        self._check_toolkit()
        self._check_parsers()
        self._check_requirements()
        self._check_arch_list()
        self._check_managed_paths()
        return self

    def pinned(self) -> dict[str, str]:
        """The packages the plan pins itself (canonical names) -> the field that decides each pin."""
        build = self.sglang
        release = "sglang.version" if build.source == "release" else "sglang.base_release"
        flashinfer = f"{release} (FlashInfer follows the SGLang release's pin)"
        sglang = {"release": "sglang.version", "git": "sglang.git_ref", "wheel": "sglang.wheel"}[build.source]
        pins = {"torch": "python_env.torch", "triton": "triton.version", "sglang": sglang,
                "flashinfer-python": flashinfer, "flashinfer": flashinfer}  # fmt: skip
        if self.cuda.method == "pip":
            for toolkit in compat().toolkits.values():
                for text in toolkit.pip.requirements if toolkit.pip else []:
                    pins[canonicalize_name(Requirement(text).name)] = "cuda.version"
        return pins

    def _check_requirements(self) -> None:
        """A package the plan pins cannot be given again in extra_requirements: pip would take either pin."""
        pins = self.pinned()
        for text in self.python_env.extra_requirements:
            name = canonicalize_name(Requirement(text).name)
            if name in pins:
                raise RuleError(
                    "python_env.extra_requirements",
                    f"{text!r} names {name}, which the plan pins itself; set {pins[name]} instead",
                )

    def _check_arch_list(self) -> None:
        """FlashInfer's JIT builds for the arch list: an entry for another GPU is a kernel this host cannot run."""
        entries = (self.flashinfer.arch_list or "").split()
        other = next((e for e in entries if e.rstrip("af") != self.gpu.arch), None)
        if other is not None:
            raise RuleError(
                "flashinfer.arch_list",
                f"{other} is not this host's GPU ({self.gpu.model}, compute capability {self.gpu.arch}); "
                f"allowed: {self.gpu.arch} with FlashInfer's suffix (a or f), or unset for the default",
                ("gpu.arch",),
            )
        if len(set(entries)) != len(entries):
            raise RuleError("flashinfer.arch_list", f"names an arch twice: {self.flashinfer.arch_list}")

    def managed(self, cuda_home: str | None = None) -> list[Managed]:
        """Every path apply creates, changes or reads on the host, with the field that names it.

        cuda_home: the toolkit's home the plan chose, where cuda.home is unset."""
        svc, key = self.service, self.serve.api_key_file
        conf, state, unit = svc.config_dir, svc.state_dir, svc.unit_path
        paths = [
            Managed("service.venv", svc.venv, "directory", "root", None),
            Managed("service.config_dir", conf, "directory", "root", "0755"),
            Managed("triton.cache_dir", self.triton.cache_dir, "directory", svc.user, "0750"),
            Managed("flashinfer.workspace_base", self.flashinfer.workspace_base, "directory", svc.user, "0750"),
            # systemd's places, whatever the roots: it creates the StateDirectory at start and chowns it to the
            # service user, recursively
            Managed("service.name", state, "directory", svc.user, None, "the unit's StateDirectory", rooted=False),
            Managed("service.name", unit, "file", "root", "0644", "the unit", rooted=False),
            # what the roles write into the config directory
            *(
                Managed(
                    "service.config_dir", path, "file", "root", mode, f"the config directory's {path[len(conf) + 1 :]}"
                )
                for path, mode, used in (
                    (svc.env_path, "0644", True),
                    (svc.build_json_path, "0644", True),
                    (svc.secrets_path, "0600", key is not None),
                    (svc.drafter_json_path, "0644", self.drafter is not None),
                )
                if used
            ),
        ]
        if key is not None:
            paths.append(Managed("serve.api_key_file", key, "file", "root", "0600"))
        if svc.launcher == "standin":
            paths.append(Managed("service.standin_path", svc.standin_path, "file", "root", "0644"))
        for section in ("model", "drafter"):
            files = getattr(self, section)
            if files is not None:
                # "present" is only read: the files are the user's own
                paths.append(Managed(f"{section}.path", files.path, "directory", "root", "0755", "",
                                     files.source != "present"))  # fmt: skip
        home = self.cuda.home or cuda_home
        if home is not None:
            # the pip method links it to the toolkit it builds; apt's package and a preinstalled toolkit own theirs
            method = self.cuda.method
            paths.append(Managed("cuda.home", home, "link", "root", None, "", method == "pip",
                                 method != "preinstalled"))  # fmt: skip
        return paths

    def own_dir(self, path: str) -> str | None:
        """The directory of its own a path lies in: one level below the nearest managed root; None outside them."""
        roots = [r for r in self.service.managed_roots if inside(path, r) and path != r]
        if not roots:
            return None
        root = max(roots, key=len)
        return root + "/" + path[len(root) + 1 :].split("/")[0]

    def _check_managed_paths(self) -> None:
        paths = self.managed()
        roots = self.service.managed_roots
        for entry in paths:
            # a file lies inside a directory of its own (/etc/NAME/key), never directly in a root (/etc/passwd)
            own = self.own_dir(entry.path)
            if entry.rooted and (own is None or (own == entry.path and entry.type == "file")):
                raise RuleError(
                    entry.field,
                    f"{entry.path} is not below a directory of its own in service.managed_roots ({', '.join(roots)}): "
                    f"apply creates {entry.label or entry.field} and sets its owner and mode; put it in one (like "
                    f"{roots[0]}/NAME), "
                    "or add the site's root to service.managed_roots",
                    ("service.managed_roots", *(("cuda.method",) if entry.field == "cuda.home" else ())),
                )
        for i, one in enumerate(paths):
            for other in paths[i + 1 :]:
                _check_apart(one, other, self.service.config_dir)
        self._check_adopt(paths)

    def _check_adopt(self, paths: list[Managed]) -> None:
        guarded = [p for p in paths if p.guarded]
        allowed = {p.path for p in guarded} | {d for p in guarded if p.rooted and (d := self.own_dir(p.path))}
        for entry in self.service.adopt:
            if entry != self.service.user and entry not in allowed:
                raise RuleError(
                    "service.adopt",
                    f"{entry} is neither a path apply manages nor the service account; allowed: "
                    f"{', '.join([*sorted(allowed), self.service.user])}",
                    ("service.user",),
                )

    def _check_parsers(self) -> None:
        known = parsers()[self.sglang.release_name]
        for field, names in (
            ("reasoning_parser", known.reasoning_parsers),
            ("tool_call_parser", known.tool_call_parsers),
        ):
            value = getattr(self.serve, field)
            if value is not None and value not in names:
                raise RuleError(
                    f"serve.{field}",
                    f"SGLang {self.sglang.release_name} has no {field.replace('_', ' ')} {value!r}; "
                    f"allowed: {', '.join(names)}",
                )

    def inert(self) -> list[tuple[str, str]]:
        """(field, why) for each setting given explicitly that has no effect under the resolved config."""
        serve, graph, build = self.serve, self.serve.cuda_graph, self.sglang
        no_spec = "serve.algorithm is NONE (no speculative decoding)"
        no_graph = "serve.cuda_graph.enabled is false"
        rules = [
            (not serve.speculative, "serve.block_size", no_spec),
            (not serve.speculative, "serve.draft_window", no_spec),
            (not serve.speculative, "serve.draft_attention_backend", no_spec),
            (
                serve.algorithm != "DDTREE",
                "serve.ddtree",
                f"serve.ddtree.* is read only by DDTREE, not {serve.algorithm}",
            ),
            (not graph.enabled, "serve.cuda_graph.max_bs", no_graph),
            (not graph.enabled, "serve.cuda_graph.prefill", no_graph),
            (build.source != "git", "sglang.git_url", f"sglang.source is {build.source}, not git"),
            (build.source != "git", "sglang.git_ref", f"sglang.source is {build.source}, not git"),
            (build.source != "wheel", "sglang.wheel", f"sglang.source is {build.source}, not wheel"),
            (build.source == "release", "sglang.base_release", "sglang.source is release (sglang.version names it)"),
            (
                build.source != "release" and build.base_release is not None,
                "sglang.version",
                f"sglang.source is {build.source} and sglang.base_release names the release",
            ),
            (
                not self._untrained_depth_asked(),
                "serve.allow_untrained_depth",
                "serve.block_size is not above the drafter's trained block size (or nothing is drafted)",
            ),
            (
                self.service.launcher != "standin",
                "service.standin_path",
                f"service.launcher is {self.service.launcher}, not standin",
            ),
            (self.multinode is not None, "service.rdma", "a multi-node instance always opens the RDMA devices"),
            # the watchdog judges generation tokens per verify call, read from /metrics
            (
                self.watchdog.enabled and not serve.speculative,
                "watchdog",
                f"{no_spec}: there is no acceptance to judge",
            ),
            (
                self.watchdog.enabled and serve.speculative and not serve.metrics,
                "watchdog",
                "serve.metrics is false: the watchdog reads the server's /metrics",
            ),
        ]
        for section in ("model", "drafter"):
            files = getattr(self, section)
            if files is None:
                continue
            hub, copy = files.source != "huggingface", files.source != "copy"
            source_is = f"{section}.source is {files.source}, not"
            rules += [
                (hub, f"{section}.{key}", f"{source_is} huggingface") for key in ("repo", "revision", "token_file")
            ]
            rules.append((copy, f"{section}.copy_from", f"{source_is} copy"))
            rules.append((files.source == "present", f"{section}.min_free_gb", f"{section}.source is present "
                          "(nothing is fetched)"))  # fmt: skip
        given = set(_given(self))
        return [
            (field, why)
            for inert, prefix, why in rules
            if inert
            for field in sorted(f for f in given if f == prefix or f.startswith(prefix + "."))
        ]

    def _untrained_depth_asked(self) -> bool:
        """Whether the block size reaches past the drafter's training (what allow_untrained_depth allows)."""
        serve, drafter = self.serve, self.drafter
        return serve.speculative and drafter is not None and serve.block_size > drafter.block_size

    def _check_parallelism(self) -> None:
        serve, gpus = self.serve, self.gpu.count * self.nnodes
        if serve.tp * serve.pp > gpus:
            where = f"{self.gpu.count} per node x {self.nnodes} nodes" if self.nnodes > 1 else "this host"
            raise RuleError(
                "serve.tp",
                f"tp {serve.tp} x pp {serve.pp} needs more GPUs than {gpus} ({where})",
                ("serve.pp", "gpu.count"),
            )
        if serve.ep not in (1, serve.tp):
            raise RuleError("serve.ep", f"must be 1 or equal to tp ({serve.tp}), got {serve.ep}", ("serve.tp",))

    def _check_speculative(self) -> None:
        serve = self.serve
        if not serve.speculative:
            return
        if serve.dp_attention:
            raise RuleError("serve.dp_attention", f"{serve.algorithm} does not support dp-attention; set false")
        if serve.pp > 1:
            raise RuleError("serve.pp", f"{serve.algorithm} does not support pipeline parallelism; allowed: 1")
        if self.drafter is None:
            raise RuleError(
                "drafter", f"{serve.algorithm} needs a drafter (path and trained block_size)", ("serve.algorithm",)
            )
        if serve.draft_window is not None and serve.draft_window < serve.block_size:
            raise RuleError(
                "serve.draft_window",
                f"must be >= block_size ({serve.block_size}), got {serve.draft_window}",
                ("serve.block_size",),
            )
        trained = self.drafter.block_size
        if serve.block_size > trained and not serve.allow_untrained_depth:
            raise RuleError(
                "serve.block_size",
                f"{serve.block_size} is above the drafter's trained block size {trained}: it asks for depths "
                f"{trained}..{serve.block_size - 1} the drafter never trained on (it predicts 1..{trained - 1}); "
                "allowed: <= "
                f"{trained}, or set serve.allow_untrained_depth=true",
                ("drafter.block_size",),
            )
        dialect = builds().resolved_dialect(self.sglang.dialect_name)
        if serve.algorithm not in dialect.algorithms:
            raise RuleError(
                "serve.algorithm",
                f"{serve.algorithm} is not spoken by the SGLang build (dialect {self.sglang.dialect_name}: "
                f"{dialect.description}); allowed: {', '.join([*dialect.algorithms, 'NONE'])}",
                ("sglang.dialect", "sglang.source", "sglang.version", "sglang.base_release"),
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
                    ("gpu.arch",),
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
                ("gpu.arch",),
            )
        torch_cuda = self.torch_cuda
        if version_tuple(pin)[0] != version_tuple(torch_cuda)[0]:
            raise RuleError(
                "cuda.version",
                f"CUDA {pin} does not match the CUDA {torch_cuda} build of torch that SGLang uses (JIT kernels "
                f"must be built with the same major version); pin {torch_cuda.split('.')[0]}.x or set "
                "sglang.torch_cuda to a matching torch build",
                ("sglang.torch_cuda", "sglang.version"),
            )

    @property
    def torch_cuda(self) -> str:
        return self.sglang.torch_cuda or builds().releases[self.sglang.release_name].torch_cuda


@dataclass(frozen=True)
class Managed:
    """A path on the host that the deployment names."""

    field: str  # the field that names it
    path: str
    type: Literal["directory", "file", "link"]
    owner: str
    mode: str | None  # None: another program sets it (a venv, systemd's StateDirectory, a link)
    label: str = ""  # how the messages call it, when not by its field
    guarded: bool = True  # apply creates or changes it: it must be apply's own on the host
    rooted: bool | None = None  # it must lie below service.managed_roots; default: as guarded

    def __post_init__(self) -> None:
        if self.rooted is None:
            object.__setattr__(self, "rooted", self.guarded)

    @property
    def name(self) -> str:
        return f"{self.label} {self.path} ({self.field})" if self.label else f"{self.field} {self.path}"


def _check_apart(one: Managed, other: Managed, config_dir: str) -> None:
    """Two managed paths must not be one, nor one inside the other: apply would change one through the other.

    Files may lie in the config directory (root's, 0755): the API key file is there by default."""
    if one.path == other.path:
        how = "is the same path as"
    elif inside(other.path, one.path) or inside(one.path, other.path):
        outer, inner = (one, other) if inside(other.path, one.path) else (other, one)
        if outer.path == config_dir and outer.field == "service.config_dir" and inner.type == "file":
            return
        one, other, how = inner, outer, "is inside"
    else:
        return
    # blamed on the field the user names rather than the one derived from it
    first, second = (one, other) if one.label == "" or other.label != "" else (other, one)
    if first is other:
        how = {"is inside": "contains", "is the same path as": how}[how]
    raise RuleError(
        first.field,
        f"{first.name} {how} {second.name}: apply would change one through the other; give each its own path",
        (second.field,),
    )


def _given(model: BaseModel, prefix: str = "") -> Iterator[str]:
    """Dotted paths of the leaf fields given explicitly (not left at their defaults)."""
    for name in model.model_fields_set:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from _given(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


class Watchdog(Section):
    """The acceptance watchdog on each host (roles/sglang_service/files/acceptance_watchdog.py): every interval it
    reads the server's counters and judges the window's acceptance, generation tokens / verify calls."""

    enabled: bool = True
    initial_delay_s: int = Field(
        default=300, ge=0, le=86400, description="after the server turns ready: warm-up and first requests"
    )
    interval_s: int = Field(default=60, ge=1, le=3600, description="one window")
    min_verify_calls: int = Field(
        default=100, ge=1, le=10_000_000, description="a window with fewer verify calls is inconclusive"
    )
    baseline: float | None = Field(
        default=None, ge=1, le=64, description="the config's acceptance (a sweep's); unset: its first healthy windows"
    )
    baseline_windows: int = Field(default=3, ge=1, le=1000, description="healthy windows averaged into the baseline")
    failure_fraction: float = Field(default=0.5, gt=0, lt=1, description="fails below this share of the baseline")
    failure_floor: float = Field(default=1.5, ge=1, le=64, description="and below this acceptance length")
    failure_limit: int = Field(default=3, ge=1, le=1000, description="consecutive failed windows before a rollback")


Deployment.model_rebuild()  # Deployment names Watchdog before it is defined
