"""How a pydantic validation error reads to the user: one translator for every input (the deployment, a
sweep matrix), naming what is allowed where a key is unknown."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel


def unwrap(annotation: Any) -> list[Any]:
    """The concrete types an annotation admits (Optional, unions and Annotated flattened)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in unwrap(arg)]
    if typing.get_origin(annotation) is typing.Annotated:
        return unwrap(typing.get_args(annotation)[0])
    return [annotation]


def _model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, a list's items or a mapping's values."""
    for kind in unwrap(annotation):
        if typing.get_origin(kind) in (list, dict):
            kind = typing.get_args(kind)[-1]
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return kind
    return None


def allowed_keys(root: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """The keys a model allows at `loc` (list indexes and mapping keys pass through), or none known."""
    model: type[BaseModel] | None = root
    for step in loc:
        if model is None:
            return []
        field = model.model_fields.get(str(step))
        if field is None:
            continue  # a list index or a mapping key: the same model goes on
        model = _model(field.annotation)
    return sorted(model.model_fields) if model is not None else []


def describe(error: Mapping[str, Any], root: type[BaseModel]) -> str:
    """One pydantic error as a message: what is wrong and, where it helps, what was given or is allowed."""
    kind, loc = error["type"], list(error["loc"])
    if kind == "extra_forbidden":
        names = allowed_keys(root, loc[:-1])
        return "unknown key" + (f"; allowed: {', '.join(names)}" if names else "")
    if kind == "missing":
        return "required"
    message = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    if isinstance(value, (str, int, float, bool)) and kind != "value_error":
        message += f" (got {value!r})"
    return message
