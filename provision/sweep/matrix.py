"""The sweep matrix file: which server configs to try and which benchmark cells to measure on each.

    configs:
      - name: b8-t4-w2048
        set: {serve.algorithm: DDTREE, serve.ddtree.budget: 8, serve.ddtree.topk: 4, serve.draft_window: 2048}
    grid:
      - {concurrency: 1, input_tokens: 60}
      - {concurrency: 32, input_tokens: 4096, output_tokens: 256, prompts: 64}
    warmup_requests: 2
    coding: {enabled: true, problems: null, max_tokens: 2048, limit: null, gate: 1.0}
    bench_serving: {dataset: random, dataset_path: null}

`set` takes the dotted keys of `provision plan --set KEY=VALUE`; each key and value is checked here against
provision.model.deployment.Deployment, so a typo fails before any server is touched. Rules across fields (a block size
above the drafter's) are the planner's and fail per config when the sweep plans it.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from provision.errors import InputError
from provision.model import overrides
from provision.model.deployment import Deployment, Section
from provision.model.translate import describe, unwrap

NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
DEFAULT_OUTPUT_TOKENS = 256
Scalar = str | int | float | bool | None
# the key the config's own allow_untrained_depth field sets; refused in `set` so there is one place for it
UNTRAINED_KEY = "serve.allow_untrained_depth"


class MatrixRule(Exception):
    """A rule across entries failed; `loc` is the pydantic-style path of the entry to blame."""

    def __init__(self, loc: list[Any], message: str) -> None:
        self.loc = loc
        self.message = message
        super().__init__(message)


class SweepConfig(Section):
    name: str = Field(pattern=NAME_PATTERN, description="a file-name-safe id, used in results and the report")
    set: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict, description="dotted key: value")
    allow_untrained_depth: bool = False

    def overrides(self) -> dict[str, Any]:
        """The `--set` overrides this config applies on top of the host's deployment."""
        return {**self.set, UNTRAINED_KEY: True} if self.allow_untrained_depth else dict(self.set)


class GridCell(Section):
    concurrency: int = Field(ge=1)
    input_tokens: int = Field(ge=1)
    output_tokens: int = Field(default=DEFAULT_OUTPUT_TOKENS, ge=1)
    prompts: int = Field(default=0, ge=1, description="default max(4, 2 * concurrency)")

    @model_validator(mode="before")
    @classmethod
    def _default_prompts(cls, data: Any) -> Any:
        # a computed default: enough prompts to keep every slot busy twice over
        if isinstance(data, dict) and data.get("prompts") is None:
            try:
                return {**data, "prompts": max(4, 2 * int(data["concurrency"]))}
            except (KeyError, TypeError, ValueError):
                return data  # concurrency's own error says what is wrong
        return data

    @property
    def id(self) -> str:
        """Stable id for results and resume: c1-in60, c32-in4096 (-out32 when the output length is not 256)."""
        suffix = f"-out{self.output_tokens}" if self.output_tokens != DEFAULT_OUTPUT_TOKENS else ""
        return f"c{self.concurrency}-in{self.input_tokens}{suffix}"


def seed_grid() -> list[GridCell]:
    """The seed's table: C=1 at 60, 1k and 4k input tokens; C=32 at 60 and 4k."""
    cells = [(1, 60), (1, 1024), (1, 4096), (32, 60), (32, 4096)]
    return [GridCell(concurrency=c, input_tokens=n) for c, n in cells]


class Coding(Section):
    enabled: bool = True
    problems: Annotated[Path, Field(strict=False)] | None = Field(
        default=None, description="HumanEval-form JSONL; None: the shipped set"
    )
    max_tokens: int = Field(default=2048, ge=1)
    limit: int | None = Field(default=None, ge=1, description="run at most this many problems")
    gate: float = Field(default=1.0, ge=0, le=1, description="share of problems a config must pass to be recommended")


class BenchServing(Section):
    """How `python -m sglang.bench_serving` makes its prompts, where the sweep drives it."""

    dataset: Literal["random", "random-ids"] = Field(
        default="random", description="random: ShareGPT text cut to length (a download); random-ids: token ids"
    )
    dataset_path: str | None = Field(default=None, description="ShareGPT JSON on the host instead of the download")


class Matrix(Section):
    configs: list[SweepConfig] = Field(min_length=1)
    grid: list[GridCell] = Field(default_factory=seed_grid, min_length=1)
    warmup_requests: int = Field(default=2, ge=0)
    coding: Coding = Coding()
    bench_serving: BenchServing = BenchServing()

    @model_validator(mode="after")
    def _unique(self) -> Matrix:
        # a rule error, not a ValueError: pydantic lets it through, so the message can name the duplicate itself
        names = [c.name for c in self.configs]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise MatrixRule(
                    ["configs", i, "name"], f"{name!r} is already the name of configs[{names.index(name)}]"
                )
        ids = [cell.id for cell in self.grid]
        for i, cell_id in enumerate(ids):
            if cell_id in ids[:i]:
                raise MatrixRule(["grid", i], f"cell {cell_id} is already grid[{ids.index(cell_id)}]")
        return self

    def config(self, name: str) -> SweepConfig:
        return next(c for c in self.configs if c.name == name)


# ---- loading


def load_matrix(path: Path) -> Matrix:
    """The matrix in `path`; any problem is one InputError naming file[:line], the field and what is allowed."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise InputError(str(path), "", f"cannot read the matrix file: {err.strerror or err}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err)
        raise InputError(where, "", f"not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise InputError(str(path), "", "must be a mapping with configs (required), grid, warmup_requests and coding")
    try:
        matrix = Matrix.model_validate(data)
    except MatrixRule as err:
        raise InputError(_where(path, root, err.loc), _field(err.loc), err.message) from None
    except ValidationError as err:
        first = err.errors()[0]
        loc = list(first["loc"])
        raise InputError(_where(path, root, loc), _field(loc), describe(first, Matrix)) from None
    for i, config in enumerate(matrix.configs):
        for key, value in config.set.items():
            loc = ["configs", i, "set", key]
            try:
                config.set[key] = check_set(key, value)
            except InputError as err:
                raise InputError(_where(path, root, loc), _field(loc), err.message) from None
    if matrix.coding.problems is not None:
        problems = matrix.coding.problems
        problems = problems if problems.is_absolute() else path.parent / problems  # relative to the matrix file
        if not problems.is_file():
            loc = ["coding", "problems"]
            raise InputError(_where(path, root, loc), _field(loc), f"{problems} is not a file (a HumanEval-form JSONL)")
        matrix.coding.problems = problems
    return matrix


def check_set(key: str, value: Any) -> Any:
    """The value for one `set` entry (typed by the matrix file's YAML, never read a second time), checked as
    `provision plan --set` would; raises InputError."""
    if key == UNTRAINED_KEY:
        raise InputError("", key, "use the config's own allow_untrained_depth: true instead")
    overrides.check_key(key, "")  # unknown keys: names the allowed ones
    try:
        return _leaf_adapter(key.split(".")).validate_python(value)
    except ValidationError as err:
        first = err.errors()[0]
        # the error's place within the deployment, so an unknown key below a section names that section's keys
        raise InputError("", key, describe({**first, "loc": (*key.split("."), *first["loc"])}, Deployment)) from None


def _leaf_adapter(path: list[str]) -> TypeAdapter[Any]:
    """A validator for the field at `path` of Deployment, with its constraints (ge=1 and the like)."""
    current: Any = Deployment
    for i, step in enumerate(path):
        last = i == len(path) - 1
        models = [t for t in unwrap(current) if isinstance(t, type) and issubclass(t, BaseModel)]
        if models:
            info = models[0].model_fields[step]
            if last:
                return _strict(Annotated[info.annotation, info])
            current = info.annotation
        else:  # a dict section (serve.env): its value type
            dicts = [t for t in unwrap(current) if typing.get_origin(t) is dict]
            current = typing.get_args(dicts[0])[1]
            if last:
                return _strict(current)
    return TypeAdapter(current)  # an empty path: not reached, check_key refuses it


def _strict(annotation: Any) -> TypeAdapter[Any]:
    """As strict as the model itself (no "yes" for a port); a section's model carries its own config."""
    if any(isinstance(t, type) and issubclass(t, BaseModel) for t in unwrap(annotation)):
        return TypeAdapter(annotation)
    return TypeAdapter(annotation, config=ConfigDict(strict=True))


def _field(loc: list[Any]) -> str:
    """configs[2].set.serve.ddtree.budget"""
    out = ""
    for step in loc:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out


def _where(path: Path, root: yaml.Node | None, loc: list[Any]) -> str:
    """file:line of the deepest YAML node along `loc` (the value where it exists, else its parent)."""
    node, line = root, None
    for step in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == step), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            node = node.value[step]
        else:
            node = None
    if node is not None:
        line = node.start_mark.line + 1
    return f"{path}:{line}" if line else str(path)
