"""The compatibility tables and SGLang dialects, loaded once from provision/data."""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArchInfo(_Strict):
    first_cuda: str
    family: str


class PipToolkit(_Strict):
    requirements: list[str]
    prefix_subdir: str


class ToolkitInfo(_Strict):
    driver_branch: str
    driver_min: str
    pip: PipToolkit | None


class TritonPtxas(_Strict):
    ptxas: str
    ptxas_blackwell: str | None


class Compat(_Strict):
    archs: dict[str, ArchInfo]
    toolkits: dict[str, ToolkitInfo]
    triton_ptxas: dict[str, TritonPtxas]
    attention_refused: dict[str, dict[str, str]]
    attention_backends: list[str]


class Release(_Strict):
    dialect: str
    torch: str
    torch_cuda: str
    triton: str
    flashinfer: str


class AlgorithmSpelling(_Strict):
    args: list[str]
    env: dict[str, str]
    note: str | None = None


class Dialect(_Strict):
    description: str
    inherits: str | None = None
    algorithms: dict[str, AlgorithmSpelling] = {}
    flags: dict[str, str] = {}


class Builds(_Strict):
    releases: dict[str, Release]
    dialects: dict[str, Dialect]

    def resolved_dialect(self, name: str) -> Dialect:
        """The dialect with everything it inherits folded in (its own spellings win)."""
        own = self.dialects[name]
        if own.inherits is None:
            return own
        base = self.resolved_dialect(own.inherits)
        return Dialect(
            description=own.description,
            algorithms={**base.algorithms, **own.algorithms},
            flags={**base.flags, **own.flags},
        )


def _load(name: str) -> object:
    return yaml.safe_load(resources.files("provision").joinpath("data", name).read_text())


@cache
def compat() -> Compat:
    return Compat.model_validate(_load("compat.yml"))


@cache
def builds() -> Builds:
    return Builds.model_validate(_load("sglang_builds.yml"))


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))
