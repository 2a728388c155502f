"""The sweep's coding check: code only from the final answer, only from a closed fence; a limited run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision.errors import InputError
from provision.sweep.coding import Problem, extract_code, grade, load_problems, prompt_for, run_check

PROBLEMS = {p.entry_point: p for p in load_problems()}
RLE = PROBLEMS["run_length_encode"]

RIGHT = """def run_length_encode(text):
    runs = []
    for ch in text:
        if runs and runs[-1][0] == ch:
            runs[-1] = (ch, runs[-1][1] + 1)
        else:
            runs.append((ch, 1))
    return runs
"""
# what a model drafts while thinking: plausible, complete, and wrong (it counts, it does not run)
DRAFT = """def run_length_encode(text):
    from collections import Counter
    return list(Counter(text).items())
"""


def fenced(code: str, tag: str = "python", fence: str = "```") -> str:
    return f"{fence}{tag}\n{code}{fence}\n"


# --- where the code comes from ----------------------------------------------------------------------


def test_regression_reasoning_draft_is_never_graded() -> None:
    # the seed story: the thinking holds an incomplete block, the answer the right one
    message = {
        "reasoning_content": "Let me draft it.\n```python\ndef run_length_encode(text):\n    runs = [",
        "content": "Here is the solution:\n\n" + fenced(RIGHT),
    }
    assert extract_code(message["content"], message["reasoning_content"]) == RIGHT
    score = grade([RLE], [message])
    assert (score.passed, score.total) == (1, 1), score.results


def test_reasoning_alone_is_not_an_answer() -> None:
    score = grade([RLE], [{"content": "", "reasoning_content": fenced(RIGHT)}])
    assert score.passed == 0
    assert score.results[0].reason.startswith("no code block in the answer")


@pytest.mark.parametrize("marker", ["</think>", "◁/think▷"])
def test_only_text_after_the_last_end_marker_counts(marker: str) -> None:
    content = f"◁think▷<think>first try\n{fenced(DRAFT)}hmm, no.{marker}\n\nFinal answer:\n{fenced(RIGHT)}"
    assert extract_code(content) == RIGHT
    assert grade([RLE], [{"content": content}]).passed == 1
    # and the draft, were it taken, fails: the test tells them apart
    assert not run_check(RLE, DRAFT).passed


def test_several_end_markers_use_the_last() -> None:
    content = f"a</think>{fenced(DRAFT)}b</think>{fenced(RIGHT)}"
    assert extract_code(content) == RIGHT


def test_thinking_that_never_ended_is_not_an_answer() -> None:
    content = f"<think>Let me try\n{fenced(DRAFT)}and then"
    assert extract_code(content) is None
    assert "thinking never ended" in grade([RLE], [{"content": content}]).results[0].reason


def test_unterminated_trailing_fence_is_ignored() -> None:
    content = f"{fenced(RIGHT)}\nA faster version:\n```python\ndef run_length_encode(text):\n    return ["
    assert extract_code(content) == RIGHT


def test_only_an_unterminated_fence_is_no_code() -> None:
    content = "```python\ndef run_length_encode(text):\n    return ["
    assert extract_code(content) is None
    assert "never closed" in grade([RLE], [{"content": content}]).results[0].reason


def test_no_block_is_no_code() -> None:
    assert extract_code("def f(): pass") is None
    assert extract_code(None) is None
    assert extract_code("inline ```python x = 1``` is not a block") is None
    result = grade([RLE], [{"content": "I would use a loop."}]).results[0]
    assert (result.passed, result.reason) == (False, "no code block in the answer")


def test_last_complete_block_wins() -> None:
    assert extract_code(fenced("a = 1\n") + "text\n" + fenced("b = 2\n", tag="")) == "b = 2\n"


def test_a_trailing_shell_block_does_not_displace_the_python() -> None:
    content = fenced(RIGHT) + "Run it with:\n" + fenced("python rle.py\n", tag="bash")
    assert extract_code(content) == RIGHT
    # with no python or untagged block at all, the last block is still taken
    assert extract_code(fenced("x\n", tag="text")) == "x\n"


def test_fences_per_commonmark() -> None:
    # a longer outer fence holds a shorter one; the closing fence must be the same char, at least as long
    outer = "````markdown\n```python\nx = 1\n```\n````\n"
    assert extract_code(outer) == "```python\nx = 1\n```\n"
    assert extract_code("~~~py\ny = 2\n```\n~~~~~\n") == "y = 2\n```\n"
    # a fence line with text after it does not close
    assert extract_code("```\nz = 3\n``` not a close\n```\n") == "z = 3\n``` not a close\n"
    # nested under a list item: the fence's indentation comes off the code
    assert extract_code("1. Code:\n   ```python\n   def f():\n       return 1\n   ```\n") == "def f():\n    return 1\n"
    assert extract_code("```python\n```\n") == ""


# --- running the code -------------------------------------------------------------------------------


def test_infinite_loop_times_out() -> None:
    result = run_check(RLE, "def run_length_encode(text):\n    while True:\n        pass\n", timeout_s=1)
    assert (result.passed, result.reason) == (False, "timeout after 1 s")
    assert result.seconds < 5


def test_timeout_kills_what_it_forked() -> None:
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\ndef run_length_encode(text):\n    time.sleep(60)\n"
    result = run_check(RLE, code, timeout_s=1)
    assert result.reason == "timeout after 1 s"


def test_two_gigabytes_hit_the_memory_limit() -> None:
    result = run_check(RLE, "blob = bytearray(2 * 1024**3)\n" + RIGHT)
    assert not result.passed
    assert "memory limit" in result.reason


def test_failing_assertion_is_reported() -> None:
    result = run_check(RLE, DRAFT)
    assert not result.passed
    assert result.reason.startswith("AssertionError")
    assert "test.py line" in result.reason and 'candidate("abab")' in result.reason


def test_errors_in_the_answer_name_its_line() -> None:
    assert "answer.py line 2" in run_check(RLE, "x = 1\ndef run_length_encode(:\n").reason
    assert "NameError" in run_check(RLE, "def run_length_encode(t: List[str]):\n    pass\n").reason
    missing = run_check(RLE, "def something_else():\n    pass\n")
    assert missing.reason == "the answer does not define run_length_encode()"


def test_exiting_early_is_not_a_pass() -> None:
    assert not run_check(RLE, "import sys\nsys.exit(0)\n").passed
    assert not run_check(RLE, "import os\nos._exit(0)\n").passed


def test_demo_code_under_main_does_not_run() -> None:
    assert run_check(RLE, RIGHT + "\nif __name__ == '__main__':\n    print(run_length_encode(input()))\n").passed


def test_no_secrets_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    code = "import os\nassert 'HF_TOKEN' not in os.environ, sorted(os.environ)\n" + RIGHT
    assert run_check(RLE, code).passed


def test_writing_big_files_is_refused() -> None:
    code = "open('big', 'wb').write(b'x' * (8 << 20))\n" + RIGHT
    result = run_check(RLE, code)
    assert not result.passed
    assert "File too large" in result.reason or "file size limit" in result.reason


def test_answers_pair_with_problems() -> None:
    with pytest.raises(ValueError):
        grade([RLE], [])
    assert grade([RLE], [None]).results[0].reason == "no answer (the request failed)"


# --- the problems -----------------------------------------------------------------------------------

# one reference and one plausible wrong solution per shipped problem: the tests pass what is right
# and fail what is not
SOLUTIONS: dict[str, tuple[str, str]] = {
    "run_length_encode": (RIGHT, DRAFT),
    "merge_ranges": (
        """def merge_ranges(ranges):
    merged = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
""",
        # forgets that a later range can end inside the current one
        """def merge_ranges(ranges):
    merged = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged
""",
    ),
    "brackets_balanced": (
        """def brackets_balanced(text):
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack
""",
        # counts instead of nesting
        """def brackets_balanced(text):
    return all(text.count(a) == text.count(b) for a, b in ("()", "[]", "{}"))
""",
    ),
    "summarize_numbers": (
        """def summarize_numbers(numbers):
    parts = []
    values = sorted(set(numbers))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)
""",
        # keeps duplicates, so a repeated number breaks a run
        """def summarize_numbers(numbers):
    parts = []
    values = sorted(numbers)
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)
""",
    ),
    "is_dotted_quad": (
        """def is_dotted_quad(text):
    parts = text.split(".")
    if len(parts) != 4:
        return False
    for part in parts:
        if not (1 <= len(part) <= 3 and all("0" <= c <= "9" for c in part)):
            return False
        if part != "0" and part.startswith("0") or int(part) > 255:
            return False
    return True
""",
        # lets leading zeros through
        """def is_dotted_quad(text):
    parts = text.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) <= 255 for p in parts)
""",
    ),
}


def test_five_problems_ship() -> None:
    assert sorted(PROBLEMS) == sorted(SOLUTIONS)
    assert len({p.task_id for p in PROBLEMS.values()}) == 5


@pytest.mark.parametrize("entry_point", sorted(SOLUTIONS))
def test_shipped_problem_passes_right_and_fails_wrong(entry_point: str) -> None:
    problem = PROBLEMS[entry_point]
    right, wrong = SOLUTIONS[entry_point]
    assert f"def {entry_point}(" in problem.prompt
    assert problem.entry_point in prompt_for(problem)
    assert run_check(problem, right).reason == "passed"
    failed = run_check(problem, wrong)
    assert not failed.passed and failed.reason.startswith("AssertionError"), failed.reason


def test_grade_counts() -> None:
    problems = [PROBLEMS[name] for name in sorted(SOLUTIONS)]
    answers = [{"content": fenced(SOLUTIONS[p.entry_point][i % 2])} for i, p in enumerate(problems)]
    score = grade(problems, answers)
    assert (score.passed, score.total) == (3, 5)
    assert [r.passed for r in score.results] == [True, False, True, False, True]
    assert [r.task_id for r in score.results] == [p.task_id for p in problems]


# --- a user's problems file -------------------------------------------------------------------------

GOOD = {"task_id": "t/0", "prompt": "def f(x):\n", "entry_point": "f", "test": "def check(c):\n    assert c(1) == 1\n"}


def write_jsonl(tmp_path: Path, *records: object) -> Path:
    path = tmp_path / "mine.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_user_problems_load(tmp_path: Path) -> None:
    humaneval = {**GOOD, "task_id": "t/1", "canonical_solution": "    return x\n"}
    problems = load_problems(write_jsonl(tmp_path, GOOD, "", humaneval))
    assert [p.task_id for p in problems] == ["t/0", "t/1"]
    assert isinstance(problems[0], Problem)
    assert run_check(problems[0], "def f(x):\n    return x\n").passed


def test_missing_field_names_file_line_and_field(tmp_path: Path) -> None:
    bad = {k: v for k, v in GOOD.items() if k != "test"}
    path = write_jsonl(tmp_path, GOOD | {"task_id": "t/1"}, bad)
    with pytest.raises(InputError) as caught:
        load_problems(path)
    assert (caught.value.source, caught.value.field) == (f"{path}:2", "test")
    assert str(caught.value).startswith(f"{path}:2: test: missing; each line needs task_id, prompt, entry_point")


@pytest.mark.parametrize(
    ("record", "field", "says"),
    [
        ("{not json", "", "not valid JSON"),
        ("[1, 2]", "", "must be a JSON object"),
        (GOOD | {"test": "assert True\n"}, "test", "def check(candidate)"),
        (GOOD | {"test": "def check(c:\n"}, "test", "not valid Python"),
        (GOOD | {"entry_point": "my func"}, "entry_point", "not a Python function name"),
        (GOOD | {"prompt": 3}, "prompt", "must be a string, got int"),
        (GOOD | {"tset": "x"}, "tset", "unknown field; allowed: task_id, prompt, entry_point, test"),
        (GOOD | {"task_id": " "}, "task_id", "must not be empty"),
    ],
)
def test_bad_records(tmp_path: Path, record: object, field: str, says: str) -> None:
    path = write_jsonl(tmp_path, record)
    with pytest.raises(InputError) as caught:
        load_problems(path)
    assert (caught.value.source, caught.value.field) == (f"{path}:1", field)
    assert says in caught.value.message


def test_duplicate_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r":2: task_id: 't/0' is already on line 1"):
        load_problems(write_jsonl(tmp_path, GOOD, GOOD))
    with pytest.raises(InputError, match="no problems"):
        load_problems(write_jsonl(tmp_path, ""))
    with pytest.raises(InputError, match="cannot read"):
        load_problems(tmp_path / "absent.jsonl")
