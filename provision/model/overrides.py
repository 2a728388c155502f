"""`--set KEY=VALUE` (and the `dflash_set` variable): one value of the resolved config, by dotted path."""

from __future__ import annotations

import copy
import re
import typing
from collections.abc import Iterable
from typing import Any

import yaml
from pydantic import BaseModel

from provision.errors import InputError
from provision.model.deployment import Deployment
from provision.model.translate import unwrap


def leaf_types(path: list[str]) -> list[Any]:
    """The types the field at `path` admits; raises KeyError naming the allowed keys where a step is unknown."""
    types_here: list[Any] = [Deployment]
    for i, step in enumerate(path):
        models = [t for t in types_here if isinstance(t, type) and issubclass(t, BaseModel)]
        dicts = [t for t in types_here if typing.get_origin(t) is dict]
        if models:
            model = models[0]
            if step not in model.model_fields:
                raise KeyError(".".join(path[:i]) or "top level", sorted(model.model_fields))
            types_here = unwrap(model.model_fields[step].annotation)
        elif dicts:
            types_here = unwrap(typing.get_args(dicts[0])[1])
        else:
            raise KeyError(".".join(path[:i]), [])
    return types_here


class _CoreLoader(yaml.SafeLoader):
    """YAML with the JSON schema of YAML 1.2 for plain scalars: only `true`/`false`, `null`, decimal integers and
    floats are typed. YAML 1.1's octal `030000`, sexagesimal `8:20:00`, `0x7530`, `3_0000`, `0b1000` and `no` stay
    text, which a strict field then refuses, instead of silently becoming another number or a boolean."""


_CoreLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in (
    ("bool", r"^(?:true|false)$", "tf"),
    ("null", r"^(?:null|~|)$", ["n", "~", ""]),
    ("int", r"^-?(?:0|[1-9][0-9]*)$", "-0123456789"),
    ("float", r"^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?$", "-0123456789"),
):
    _CoreLoader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(_pattern), list(_first))


def parse_value(admitted: list[Any], text: str) -> Any:
    """`--set` text: YAML scalars and lists (YAML 1.2 JSON schema), except that a string field keeps the text
    as written ("12.10" stays)."""
    if str in admitted and not ({int, float, bool} & set(admitted)):
        if text in ("null", "~") and type(None) in admitted:
            return None
        return text
    try:
        return yaml.load(text, Loader=_CoreLoader)  # noqa: S506 - a SafeLoader with fewer implicit types
    except yaml.YAMLError:
        return text
    except RecursionError:  # PyYAML composes nested flow collections recursively
        raise ValueError("nested too deeply") from None


def split_set(items: list[str], source: str = "--set") -> dict[str, str]:
    """`KEY=VALUE` items as {dotted key: text}; the keys are checked where they are applied."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise InputError(source, item, "expected KEY=VALUE, like serve.port=30001")
        if key.strip() in result:
            raise InputError(source, key.strip(), "given twice; give it once")
        result[key.strip()] = text
    check_overlaps(result, source)
    return result


def check_overlaps(keys: Iterable[str], source: str) -> None:
    """One source may not give a key and a key below it (serve.ddtree and serve.ddtree.budget): applied in
    turn, the section would replace the key, or the key a part of the section, without a word."""
    given = sorted(keys)
    for outer in given:
        inner = next((k for k in given if k.startswith(outer + ".")), None)
        if inner is not None:
            raise InputError(source, inner, f"is below {outer}, given too: one would replace the other; give one")


def check_key(key: str, source: str) -> list[Any]:
    """The types a known dotted key admits; unknown keys are refused naming the allowed ones."""
    try:
        return leaf_types(key.split("."))
    except KeyError as err:
        where, allowed = err.args
        hint = f"allowed under {where}: {', '.join(allowed)}" if allowed else f"{where} takes no sub-keys"
        raise InputError(source, key, f"unknown key; {hint}") from None


def parse_set(texts: dict[str, str], source: str = "--set") -> dict[str, Any]:
    """`--set` text, read once, here: every other source of overrides (dflash_set, the play's dflash_cli_set, a
    sweep matrix) is YAML or JSON already typed by its own parser and is never read a second time."""
    parsed: dict[str, Any] = {}
    for key, text in texts.items():
        admitted = check_key(key, f"{source} {key}={text}")
        try:
            parsed[key] = parse_value(admitted, text)
        except ValueError as err:
            raise InputError(f"{source} {key}={text}", key, f"cannot read the value: {err}") from None
    return parsed


def apply(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of `data` with each dotted key set (intermediate sections created as needed)."""
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        node = out
        *parents, leaf = key.split(".")
        for step in parents:
            child = node.get(step)
            if not isinstance(child, dict):
                child = {}
                node[step] = child
            node = child
        node[leaf] = value
    return out
