"""The compatibility tables and SGLang dialects, loaded once from provision/data."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field


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


# libyaml's safe loader where PyYAML was built with it: the parsers table is read by every plan, in every
# Ansible worker, and the pure-Python loader takes ten times as long
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_data(name: str) -> object:
    """One of the tables shipped in provision/data (trusted YAML)."""
    return yaml.load(resources.files("provision").joinpath("data", name).read_text(), Loader=_SAFE_LOADER)  # noqa: S506


@cache
def compat() -> Compat:
    return Compat.model_validate(load_data("compat.yml"))


@cache
def builds() -> Builds:
    return Builds.model_validate(load_data("sglang_builds.yml"))


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


class ParserOption(_Strict):
    """One argparse action of SGLang's parser: its spellings, the destination it sets, the values it takes."""

    names: list[str] = Field(min_length=1)
    dest: str
    # argparse's nargs, with its default (exactly one value, not a list) written 1
    nargs: int | Literal["?", "*", "+"]
    secret: bool = False


class ParserData(_Strict):
    """One SGLang release's argument parser: its options and the parser names it accepts."""

    reasoning_parsers: list[str]
    tool_call_parsers: list[str]
    options: list[ParserOption]


@cache
def parsers() -> dict[str, ParserData]:
    data = load_data("sglang_parsers.yml")
    assert isinstance(data, dict)
    return {release: ParserData.model_validate(value) for release, value in data.items()}
