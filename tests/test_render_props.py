"""Property: any value of any string or number field, and any `--set` text, is either refused (exit 2, one
line, no traceback) or rendered into a unit with exactly the expected directives, whose ExecStart= and
environment file read back (by systemd's quoting rules) as the plan's argv and env, word for word.

The decoder below follows systemd.service(5) ("Command lines") and systemd.exec(5) (EnvironmentFile=); the
round trip through a real systemd is tests/test_unit_roundtrip.py.
"""

from __future__ import annotations

import io
import json
import re
import types
import typing
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from provision.cli import main
from provision.model.deployment import Deployment
from provision.planning.render import API_KEY_REF, needs

HOST = "rtx6000"
# Fields that change which directives exist, on purpose: their own tests cover them.
SHAPE_FIELDS = {"service.rdma", "service.systemd_version", "serve.api_key_file", "service.launcher"}


def _leaves(model: type[BaseModel], prefix: str = "") -> list[tuple[str, set[type]]]:
    out: list[tuple[str, set[type]]] = []
    for name, info in model.model_fields.items():
        args = (
            typing.get_args(info.annotation)
            if typing.get_origin(info.annotation) in (typing.Union, types.UnionType)
            else (info.annotation,)
        )
        sub = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if sub:
            out += _leaves(sub[0], f"{prefix}{name}.")
            continue
        flat = {typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a for a in args}
        kinds = {k for k in flat if k in (str, int, float)}
        if kinds:
            out.append((prefix + name, kinds))
    return out


FIELDS = [(path, kinds) for path, kinds in _leaves(Deployment) if path not in SHAPE_FIELDS]
HOSTILE = st.sampled_from(
    list(" \"'%$\\;`{}[]#=:@~\n\r\t\x00\u2028é漢🙂") + ["${SGLANG_DFLASH_API_KEY}", "%n", "$$", "/.."]
)
TEXT = st.lists(st.one_of(HOSTILE, st.text(max_size=4)), max_size=6).map("".join)
PATHISH = st.lists(st.one_of(HOSTILE, st.sampled_from(["/", "a", "b b", "opt", "."])), max_size=6).map(
    lambda parts: "/" + "".join(parts)
)
NUMBER = st.one_of(st.integers(-(2**70), 2**70).map(str), st.floats(allow_nan=True).map(str),
                   st.sampled_from(["true", "yes", "on", "no", "1e3", "0x10", "30000", "8", "0.5"]))  # fmt: skip


def plan(*sets: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    argv = ["plan", "--json", "--host", HOST]
    for item in sets:
        argv += ["--set", item]
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = int(exc.code or 0)
    return rc, out.getvalue(), err.getvalue()


def exec_words(line: str) -> list[str]:
    """ExecStart='s words as systemd reads them: quotes, C escapes, %% and $$, a lone \\; ."""
    words, i = [], 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        word, quoted = "", line[i] == '"'
        i += quoted
        while i < len(line) and (quoted or line[i] != " "):
            c = line[i]
            if quoted and c == '"':
                i += 1
                break
            if c == "\\":
                word += line[i + 1]
                i += 2
                continue
            if c in "%$" and line[i + 1 : i + 2] == c:
                word += c
                i += 2
                continue
            assert c not in "%$" or line[i : i + len(API_KEY_REF)] == API_KEY_REF, f"unescaped {c} in {line!r}"
            word += c
            i += 1
        words.append(word)
    return words


def env_values(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\$`]|\\["\\$`])*)"', line)
        assert match, f"env line systemd would misread: {line!r}"
        env[match[1]] = re.sub(r"\\(.)", r"\1", match[2])
    return env


def directives(unit: str) -> Counter[str]:
    keys: Counter[str] = Counter()
    for line in unit.splitlines():
        if not line or line.startswith("#") or re.fullmatch(r"\[[A-Za-z]+\]", line):
            continue
        assert re.fullmatch(r"[A-Za-z]+=.*", line), f"not a directive: {line!r}"
        assert (len(line) - len(line.rstrip("\\"))) % 2 == 0, f"continues onto the next line: {line!r}"
        keys[line.split("=", 1)[0]] += 1
    return keys


_, BASE_OUT, _ = plan()
BASE = json.loads(BASE_OUT)
BASE_KEYS = directives(BASE["unit"])


def check(rc: int, out: str, err: str) -> None:
    if rc == 2:
        assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        return
    assert rc == 0, err
    got = json.loads(out)
    expected = BASE_KEYS.copy()
    expected["ReadWritePaths"] = len(
        {got["config"]["triton"]["cache_dir"], got["config"]["flashinfer"]["workspace_base"]}
    )
    assert directives(got["unit"]) == expected
    [exec_line] = [line for line in got["unit"].splitlines() if line.startswith("ExecStart=")]
    assert exec_words(exec_line.removeprefix("ExecStart=")) == got["argv"]
    assert exec_line.count(API_KEY_REF) - exec_line.count("$" + API_KEY_REF) == 1  # the key, by position only
    assert env_values(got["env_file"]) == got["env"]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_field_is_refused_or_rendered_faithfully(data: st.DataObject) -> None:
    path, kinds = data.draw(st.sampled_from(FIELDS))
    if str in kinds:
        value = data.draw(
            st.one_of(PATHISH, TEXT) if path.endswith(("path", "dir", "venv", "home", "base", "file")) else TEXT
        )
    else:
        value = data.draw(NUMBER)
    check(*plan(f"{path}={value}"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(st.text(max_size=40), st.builds(lambda k, v: f"{k}={v}", st.sampled_from([p for p, _ in FIELDS]), TEXT))
)
def test_any_set_text_is_refused_or_rendered_faithfully(item: str) -> None:
    check(*plan(item))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(list(" \"'%$\\;`é漢") + ["${SGLANG_DFLASH_API_KEY}", "x"]), min_size=1, max_size=8).map(
        "".join
    )
)
def test_extra_args_words_read_back_exactly(word: str) -> None:
    rc, out, err = plan("serve.extra_args=" + json.dumps(["--chat-template", word]))
    check(rc, out, err)


@settings(max_examples=40, deadline=None)
@given(st.integers(230, 300))
def test_a_unit_for_any_systemd_holds_only_what_that_systemd_reads(version: int) -> None:
    """Refused below the essential directives' floor; otherwise every directive left is one it knows."""
    rc, out, err = plan(f"service.systemd_version={version}")
    if rc == 2:
        assert version < 240 and "service.systemd_version" in err, err
        return
    assert rc == 0, err
    unit = json.loads(out)["unit"]
    assert all(needs(line)[1] <= version for line in unit.splitlines() if re.fullmatch(r"[A-Za-z]+=.*", line))
    assert ("\nRestartSteps=5" in unit) == (version >= 254)
