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


class ParserData(_Strict):
    """One SGLang release's argument parser: its options (each with its aliases) and parser names."""

    reasoning_parsers: list[str]
    tool_call_parsers: list[str]
    options: list[list[str]]

    def group_of(self, word: str) -> list[str] | None:
        """The option (with its aliases) a command-line word names, as argparse resolves it: exact, or
        an unambiguous prefix (SGLang's parser allows abbreviations)."""
        flag = word.split("=", 1)[0]
        exact = [g for g in self.options if flag in g]
        if exact:
            return exact[0]
        prefixed = [g for g in self.options if any(o.startswith(flag) for o in g if o.startswith("--"))]
        return prefixed[0] if flag.startswith("--") and len(prefixed) == 1 else None


@cache
def parsers() -> dict[str, ParserData]:
    data = _load("sglang_parsers.yml")
    assert isinstance(data, dict)
    return {release: ParserData.model_validate(value) for release, value in data.items()}
