"""The coding check of `provision sweep`: HumanEval-form problems, the answer's code, a sandboxed run.

The check exists to catch a config that serves garbage fast, so its grading has to be beyond doubt. The
bug it was written against: a harness graded 0/5 because it took an incomplete code block out of the
model's reasoning instead of the final answer. Hence the rules below: code comes from the final answer
only, and only from a fenced block that was closed.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import os
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from provision.errors import InputError

# SGLang's reasoning parsers split the thinking into message.reasoning_content; without one (or when
# a parser misses) the raw text holds thinking, an end marker, then the answer. Kimi K2 spells the
# markers ◁think▷ ◁/think▷, most other models <think> </think>.
THINK_END = ("</think>", "◁/think▷")
THINK_START = ("<think>", "◁think▷")
PYTHON_TAGS = frozenset({"python", "py", "python3", "py3"})

SHIPPED = "provision/data/coding/problems.jsonl"


# ---------------------------------------------------------------------------------------------------
# The code in an answer


@dataclass(frozen=True)
class _Block:
    lang: str  # the info string's first word, lower-cased ("" when untagged)
    code: str


def _final_answer(content: str) -> str:
    """The text after the last reasoning end marker; a thinking section opened after it and never
    closed (the model ran out of tokens while thinking) is cut off, since none of it is the answer."""
    end = max((content.rfind(m) + len(m) for m in THINK_END if m in content), default=0)
    answer = content[end:]
    starts = [answer.find(m) for m in THINK_START if m in answer]
    return answer[: min(starts)] if starts else answer


def _opening_fence(line: str) -> tuple[str, int, str] | None:
    """(fence char, fence length, info string) when `line` opens a fenced block, else None."""
    body = line.lstrip(" ")
    char = body[:1]
    if char not in ("`", "~"):
        return None
    run = len(body) - len(body.lstrip(char))
    info = body[run:].strip()
    # CommonMark: at least three; a backtick fence's info string may not hold a backtick, which keeps
    # inline code such as ```x``` on one line from opening a block
    if run < 3 or (char == "`" and "`" in info):
        return None
    return char, run, info


def _closes(line: str, char: str, run: int) -> bool:
    """CommonMark: the same char, at least as many, nothing after them but blanks."""
    body = line.strip(" \t")
    return len(body) >= run and body == char * len(body)


def _fenced_blocks(text: str) -> tuple[list[_Block], bool]:
    """The complete fenced blocks of `text`, in order, and whether a fence was left open at the end.

    Line-based, per CommonMark's fence rules; it does not parse the rest of Markdown. Fences may be
    indented by any number of spaces (models nest code under list items, where that is legal) and the
    opening fence's indentation is taken off the code's lines, as in a list item."""
    blocks: list[_Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = _opening_fence(lines[i])
        if fence is None:
            i += 1
            continue
        char, run, info = fence
        indent = len(lines[i]) - len(lines[i].lstrip(" "))
        body: list[str] = []
        i += 1
        while i < len(lines) and not _closes(lines[i], char, run):
            line = lines[i]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))) :])
            i += 1
        if i == len(lines):  # an unterminated fence runs to the end: an answer cut short, not code
            return blocks, True
        blocks.append(_Block(info.split()[0].lower() if info else "", "\n".join(body) + "\n" if body else ""))
        i += 1
    return blocks, False


def extract_code(content: str | None, reasoning_content: str | None = None) -> str | None:
    """The code of the final answer: the last complete fenced block after the last reasoning end marker.

    `reasoning_content` is taken so callers pass the whole message, and deliberately never read: the
    thinking holds drafts, and grading a draft is the bug this module exists to avoid. Blocks tagged
    python/py (or untagged) are preferred, so a trailing ```bash block of install steps does not
    displace the solution; failing those, the last complete block of any tag. None when there is none.
    """
    del reasoning_content  # never the source of code; see above
    if not content:
        return None
    blocks, _ = _fenced_blocks(_final_answer(content))
    python = [b for b in blocks if b.lang in PYTHON_TAGS or not b.lang]
    candidates = python or blocks
    return candidates[-1].code if candidates else None


def _no_code_reason(content: str | None, reasoning_content: str | None) -> str:
    """Why extract_code found nothing, in words that point at the cause."""
    if not content or not content.strip():
        if reasoning_content:
            return "no code block in the answer (the answer is empty; the reasoning was not used)"
        return "no code block in the answer (the answer is empty)"
    _, unterminated = _fenced_blocks(_final_answer(content))
    if unterminated:
        return "no code block in the answer (its last fence is never closed: cut short?)"
    if any(m in content for m in THINK_START) and not any(m in content for m in THINK_END):
        return "no code block in the answer (the thinking never ended: out of tokens?)"
    return "no code block in the answer"


# ---------------------------------------------------------------------------------------------------
# Problems


class Problem(BaseModel):
    """One problem in HumanEval form: the function to write, and a test defining check(candidate)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    prompt: str
    entry_point: str
    test: str
    canonical_solution: str | None = None  # HumanEval's files carry it; accepted so they load, not used

    @field_validator("task_id", "prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("entry_point")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not value.isidentifier() or keyword.iskeyword(value):
            raise ValueError(f"{value!r} is not a Python function name; give the name of the function to write")
        return value

    @field_validator("test")
    @classmethod
    def _defines_check(cls, value: str) -> str:
        try:
            tree = ast.parse(value)
        except SyntaxError as exc:
            raise ValueError(f"is not valid Python (line {exc.lineno}: {exc.msg})") from None
        checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
        if not checks or len(checks[-1].args.args) != 1:
            raise ValueError("must define a top-level `def check(candidate):` that raises when the candidate is wrong")
        return value


_FIELDS = "task_id, prompt, entry_point and test (strings; test defines check(candidate))"


def _field_error(source: str, exc: ValidationError) -> InputError:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    if kind == "missing":
        message = f"missing; each line needs {_FIELDS}"
    elif kind == "extra_forbidden":
        message = f"unknown field; allowed: {', '.join(Problem.model_fields)}"
    elif kind == "string_type":
        message = f"must be a string, got {type(err['input']).__name__}"
    else:
        message = err["msg"].removeprefix("Value error, ")
    return InputError(source, field, message)


def _parse(text: str, source: str) -> list[Problem]:
    problems: list[Problem] = []
    first_line: dict[str, int] = {}
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{line_no}"
        try:
            record: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            message = f"not valid JSON ({exc.msg}, column {exc.colno}); one object per line"
            raise InputError(where, "", message) from None
        if not isinstance(record, dict):
            raise InputError(where, "", f"must be a JSON object with {_FIELDS}, got {type(record).__name__}")
        try:
            problem = Problem.model_validate(record)
        except ValidationError as exc:
            raise _field_error(where, exc) from None
        if (seen := first_line.get(problem.task_id)) is not None:
            raise InputError(where, "task_id", f"{problem.task_id!r} is already on line {seen}; must be unique")
        first_line[problem.task_id] = line_no
        problems.append(problem)
    if not problems:
        raise InputError(source, "", f"no problems; one JSON object per line with {_FIELDS}")
    return problems


def load_problems(path: Path | None = None) -> list[Problem]:
    """The user's JSONL problems, or the shipped ones when `path` is None; InputError naming file:line."""
    if path is None:
        text = resources.files("provision").joinpath("data", "coding", "problems.jsonl").read_text(encoding="utf-8")
        return _parse(text, SHIPPED)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), "", f"cannot read the problems file: {exc}") from None
    return _parse(text, str(path))


def prompt_for(problem: Problem) -> str:
    """The chat message for `problem`. One complete fenced block is what extract_code takes, so ask for it."""
    return (
        f"Write the Python function `{problem.entry_point}` below.\n\n"
        f"```python\n{problem.prompt.rstrip()}\n```\n\n"
        "Reply with the complete solution (the function with its imports and any helpers it needs) "
        "in one fenced ```python code block. No tests, no example usage, no input()."
    )


# ---------------------------------------------------------------------------------------------------
# Running a candidate


class CheckResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    passed: bool
    reason: str  # "passed", or why not, in one line
    seconds: float


class TaskResult(CheckResult):
    task_id: str


class CodingScore(BaseModel):
    model_config = ConfigDict(frozen=True)

    passed: int
    total: int
    results: list[TaskResult] = []


# Runs in the child. The answer and the test are separate files so a failure says which one broke;
# they share one namespace, which is what `code + test + check(entry_point)` amounts to. __name__ is not
# "__main__" so an answer's demo under `if __name__ == "__main__":` stays out. The verdict is the last
# stderr line, behind a per-run nonce so the candidate's own output cannot pass for it, and "passed"
# is written only once check() has returned: an answer calling exit(0) does not pass.
_HARNESS = r"""
import sys, traceback
nonce, entry = sys.argv[1], sys.argv[2]

def verdict(text):
    sys.stdout.flush()
    sys.stderr.write("\n" + nonce + " " + " ".join(text.split())[:400] + "\n")
    sys.stderr.flush()

def failure(exc, stage):
    if isinstance(exc, MemoryError):
        return "MemoryError"
    msg = traceback.format_exception_only(type(exc), exc)[-1].strip()
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename in ("answer.py", "test.py")]
    if frames:
        f = frames[-1]
        return msg + " (" + f.filename + " line " + str(f.lineno) + ": " + (f.line or "").strip() + ")"
    if isinstance(exc, SyntaxError) and exc.filename == "answer.py":
        return msg + " (answer.py line " + str(exc.lineno) + ")"
    return msg + " (" + stage + ")"

ns = {"__name__": "solution"}
stage = "answer"
outcome = "passed"
try:
    exec(compile(open("answer.py").read(), "answer.py", "exec"), ns)
    stage = "test"
    exec(compile(open("test.py").read(), "test.py", "exec"), ns)
    stage = "check"
    if callable(ns.get(entry)):
        ns["check"](ns[entry])
    else:
        outcome = "the answer does not define " + entry + "()"
except BaseException as exc:
    outcome = failure(exc, stage)
verdict(outcome)
sys.exit(0 if outcome == "passed" else 1)
"""

_NOFILE = 32  # the interpreter, the two files and the pipes; enough to import the standard library
_FSIZE = 1 << 20  # 1 MiB: a solution has no business writing files


def _cap(which: int, value: int) -> None:
    _, hard = resource.getrlimit(which)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(which, (value, value))


def _limits(memory_mb: int, cpu_s: int) -> Callable[[], None]:
    def apply() -> None:  # in the child, after fork and before exec: soft = hard, so it cannot raise them
        _cap(resource.RLIMIT_AS, memory_mb << 20)
        _cap(resource.RLIMIT_CPU, cpu_s)
        _cap(resource.RLIMIT_NOFILE, _NOFILE)
        _cap(resource.RLIMIT_FSIZE, _FSIZE)
        _cap(resource.RLIMIT_CORE, 0)

    return apply


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the child leads its own session: this takes anything it forked
    except (ProcessLookupError, PermissionError):
        pass


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def run_check(problem: Problem, code: str, timeout_s: float = 10, memory_mb: int = 512) -> CheckResult:
    """Run `code`, then problem.test, then check(entry_point) in a limited subprocess; never raises for
    anything the code does."""
    start = time.monotonic()

    def result(passed: bool, reason: str) -> CheckResult:
        return CheckResult(passed=passed, reason=reason, seconds=round(time.monotonic() - start, 3))

    nonce = secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="dflash-coding-") as tmp:
        Path(tmp, "answer.py").write_text(code, encoding="utf-8")
        Path(tmp, "test.py").write_text(problem.test, encoding="utf-8")
        # nothing of ours: no tokens, no proxies, no HF_* or CUDA settings; -I drops PYTHON* and user site
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tmp, "TMPDIR": tmp}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", _HARNESS, nonce, problem.entry_point],
            cwd=tmp,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            # CPU a second past the wall clock: the wall clock decides a busy loop, this is the backstop
            preexec_fn=_limits(memory_mb, math.ceil(timeout_s) + 1),
        )
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            # wait, not communicate: something that left the session could hold the pipes open forever
            proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe:
                    pipe.close()
            return result(False, f"timeout after {timeout_s:g} s")
        finally:
            _kill_group(proc.pid)  # anything it left running in the background
    lines = err.decode("utf-8", "replace").splitlines()
    verdict = next((ln.removeprefix(nonce + " ") for ln in reversed(lines) if ln.startswith(nonce + " ")), None)
    if proc.returncode == 0 and verdict == "passed":
        return result(True, "passed")
    if verdict == "MemoryError":
        return result(False, f"memory limit ({memory_mb} MB): MemoryError")
    if verdict is not None:
        return result(False, verdict)
    if proc.returncode == -signal.SIGXCPU:
        return result(False, f"cpu time limit ({math.ceil(timeout_s) + 1} s)")
    if proc.returncode == -signal.SIGXFSZ:
        return result(False, f"file size limit ({_FSIZE >> 20} MB)")
    if proc.returncode < 0:
        name = _signal_name(-proc.returncode)
        return result(False, f"killed by {name} (a crash, or the {memory_mb} MB memory limit)")
    tail = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
    detail = f": {tail}" if tail else ""
    return result(False, f"exited with status {proc.returncode} before check() finished{detail}")


def grade(
    problems: Sequence[Problem],
    answers: Sequence[Mapping[str, Any] | None],
    timeout_s: float = 10,
    memory_mb: int = 512,
) -> CodingScore:
    """Score chat answers against problems, pairwise; each answer is a response's `message` dict
    (content, reasoning_content), or None where the request failed."""
    if len(problems) != len(answers):
        raise ValueError(f"{len(problems)} problems but {len(answers)} answers")
    results: list[TaskResult] = []
    for problem, answer in zip(problems, answers, strict=True):
        content = answer.get("content") if answer else None
        reasoning = answer.get("reasoning_content") if answer else None
        code = extract_code(content, reasoning)
        if answer is None:
            check = CheckResult(passed=False, reason="no answer (the request failed)", seconds=0.0)
        elif code is None:
            check = CheckResult(passed=False, reason=_no_code_reason(content, reasoning), seconds=0.0)
        else:
            check = run_check(problem, code, timeout_s=timeout_s, memory_mb=memory_mb)
        results.append(TaskResult(task_id=problem.task_id, **check.model_dump()))
    return CodingScore(passed=sum(r.passed for r in results), total=len(results), results=results)
