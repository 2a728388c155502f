"""How a pydantic validation error reads to the user: one translator for every input (the deployment, a
sweep matrix), naming what is allowed where a key is unknown."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

# Each pattern a field of the deployment or a sweep matrix holds to, in words: a regular expression is no
# answer to "what may I write here". A pattern missing here reads as the fallback below.
PATTERN_WORDS = {
    r"^(?!-)(?!.*\.\.)[A-Za-z0-9._/-]+$": "a git ref: letters, digits and . _ / -, not starting with - and without ..",
    r"^\d+\.\d+$": "a version of two numbers, like 12.9",
    r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$": "a Hugging Face repository like org/name (letters, digits and _ . -)",
    r"^\d+\.\d+[af]?( \d+\.\d+[af]?)*$": "compute capabilities separated by spaces, like 12.0f",
    r"^[A-Za-z0-9][A-Za-z0-9_.-]*$": "a name of letters, digits and _ . -, beginning with a letter or digit",
    r"^[a-z_][a-z0-9_-]*$": "a user name of lowercase letters, digits, _ and -, beginning with a letter or _",
    r"^[^:]*$": "a path without ':' (it goes on PATH)",
    r"^[A-Za-z0-9_.-]+$": "a name of letters, digits and _ . -",
}
# pydantic's errors that name a class ("a valid dictionary or instance of DDTree"): a mapping, in the user's words
MAPPING_TYPES = ("model_type", "model_attributes_type", "dict_type")
# what only pydantic or Python would say: a class path, a validator's name, an Ansible type
_INTERNAL = re.compile(r"function-|lambda|Tagged|<class|\b(provision|pydantic|ansible)\.\w|instance of|\[|\]")


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


def field_path(root: type[BaseModel], loc: Sequence[Any]) -> list[Any]:
    """The loc of an error as the user names the field: the steps pydantic adds for a union's members
    (function-after[<lambda>(), str], literal['']) dropped."""
    path: list[Any] = []
    kinds: list[Any] = [root]
    for step in loc:
        models = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        containers = [k for k in kinds if typing.get_origin(k) in (list, dict)]
        if models and str(step) in models[0].model_fields:
            kinds = unwrap(models[0].model_fields[str(step)].annotation)
        elif containers and (isinstance(step, int) or typing.get_origin(containers[0]) is dict):
            kinds = unwrap(typing.get_args(containers[0])[-1])
        elif len([k for k in kinds if k is not type(None)]) > 1:
            continue  # a union member's tag
        else:
            kinds = []
        path.append(step)
    return path


def first_error(err: ValidationError, root: type[BaseModel]) -> tuple[str, str]:
    """(dotted field, message) for the first field a validation error names; a union's members' messages
    joined by "or", the other fields counted."""
    errors = [(".".join(str(p) for p in field_path(root, e["loc"])), e) for e in err.errors()]
    field = errors[0][0]
    # a union's members each echo the value: once, at the end
    messages = list(dict.fromkeys(describe(e, root) for f, e in errors if f == field))
    value = errors[0][1].get("input")
    if len(messages) > 1:
        messages = [re.sub(r" \(got .*\)$", "", m) for m in messages]
        messages[-1] += f" (got {value!r})" if isinstance(value, (str, int, float, bool)) else ""
    others = len({f for f, _ in errors} - {field})
    return field, "; or ".join(messages) + (f" (and {others} more)" if others else "")


def describe(error: Mapping[str, Any], root: type[BaseModel]) -> str:
    """One pydantic error as a message: what is wrong and, where it helps, what was given or is allowed."""
    code, loc = error["type"], list(error["loc"])
    if code == "extra_forbidden":
        names = allowed_keys(root, loc[:-1])
        return "unknown key" + (f"; allowed: {', '.join(names)}" if names else "")
    if code == "missing":
        return "required"
    value = error.get("input")
    if code == "string_pattern_mismatch":
        pattern = str(error.get("ctx", {}).get("pattern", ""))
        message = "must be " + PATTERN_WORDS.get(pattern, "written in the form this field takes")
    elif code in MAPPING_TYPES:
        return f"must be a mapping, got {kind(value)}"
    else:
        message = str(error["msg"]).removeprefix("Value error, ").replace("Input should be", "must be")
    if code != "value_error" and _INTERNAL.search(message):
        message = "is not a value this field takes"
    if isinstance(value, (str, int, float, bool)) and code != "value_error":
        message += f" (got {str(value)!r})" if isinstance(value, str) else f" (got {value!r})"
    return message


def kind(value: Any) -> str:
    """A value's type in the user's words (never Ansible's internal tagged type names)."""
    for types_, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
                         (Mapping, "a mapping"), (list, "a list")):  # fmt: skip
        if isinstance(value, types_):
            return name
    return "null" if value is None else "a value of another type"
