"""SGLang's server command line read the way its own parser reads it.

SGLang builds a plain argparse.ArgumentParser (allow_abbrev on, prefix "-", no positionals), so a word
names an option exactly, as an unambiguous prefix of one (`--admin-api-k`), with its value after "="
(`--port=1`), or as `-h` with more letters glued on; "--" ends the options. This follows CPython
3.11's argparse (_parse_optional, _get_option_tuples, consume_optional); tests/test_sglang_parser.py
compares it with the installed parser, case by case and on random command lines. Values are not
converted or checked: the build's own parser does that on the host before the service is touched
(roles/sglang/files/sglang_argcheck.py), whatever Python the build runs.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import NamedTuple

from provision.model.tables import ParserOption

# argparse reads such a word as a value unless the parser has options that look like negative numbers
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
END_OF_OPTIONS = "--"


class GrammarError(Exception):
    """A word SGLang's parser stops at (it prints usage and exits 2)."""

    def __init__(self, index: int, message: str) -> None:
        self.index = index
        self.message = message
        super().__init__(message)


class Named(NamedTuple):
    """What an option-like word names: the option (None when the parser has none), as spelled in full."""

    option: ParserOption | None
    spelled: str
    explicit: str | None


class Occurrence(NamedTuple):
    """One option the command line sets: the word that names it, where, and the values it takes."""

    index: int
    word: str
    option: ParserOption
    spelled: str
    values: tuple[str, ...]


class Resolved(NamedTuple):
    occurrences: list[Occurrence]
    # words argparse leaves over ("unrecognized arguments"): unknown options and stray values, by index
    extras: list[int]


class Grammar:
    def __init__(self, options: Sequence[ParserOption]) -> None:
        self.options = {name: option for option in options for name in option.names}

    def nearest(self, word: str) -> list[str]:
        return difflib.get_close_matches(word.split("=", 1)[0], list(self.options), n=3)

    def name(self, word: str) -> Named | None:
        """argparse's _parse_optional: None for a value, else what the word names.
        Raises GrammarError(-1, ...) for a prefix that fits several options."""
        if not word or word[0] != "-":
            return None
        if word in self.options:
            return Named(self.options[word], word, None)
        if len(word) == 1:
            return None
        if "=" in word:
            flag, explicit = word.split("=", 1)
            if flag in self.options:
                return Named(self.options[flag], flag, explicit)
        matches = self._prefixed(word)
        if len(matches) > 1:
            raise GrammarError(-1, f"ambiguous option: {word} could match {', '.join(m.spelled for m in matches)}")
        if matches:
            return matches[0]
        if _NEGATIVE_NUMBER.match(word) or " " in word:
            return None
        return Named(None, word, None)

    def _prefixed(self, word: str) -> list[Named]:
        """argparse's _get_option_tuples: every option the word abbreviates (one per spelling)."""
        if word[1] == "-":
            prefix, explicit = word.split("=", 1) if "=" in word else (word, None)
            return [Named(o, name, explicit) for name, o in self.options.items() if name.startswith(prefix)]
        # a single dash: `-hVALUE` glues a value (or more short flags) to a one-letter option
        found = []
        for name, option in self.options.items():
            if name == word[:2]:
                found.append(Named(option, name, word[2:]))
            elif name.startswith(word):
                found.append(Named(option, name, None))
        return found

    def resolve(self, argv: Sequence[str]) -> Resolved:
        """Which options the command line sets, and the words left over, as parse_args sees them.
        Raises GrammarError where argparse would stop (ambiguous prefix, missing or unwanted value)."""
        named: list[Named | None] = []
        pattern = ""
        for index, word in enumerate(argv):
            if word == END_OF_OPTIONS:
                named += [None] * (len(argv) - index)
                pattern += "-" + "A" * (len(argv) - index - 1)
                break
            try:
                found = self.name(word)
            except GrammarError as err:
                raise GrammarError(index, err.message) from None
            named.append(found)
            pattern += "A" if found is None else "O"
        occurrences: list[Occurrence] = []
        extras: list[int] = []
        index = 0
        while index < len(argv):
            found = named[index]
            if found is None or found.option is None:
                extras.append(index)
                index += 1
            else:
                index = self._consume(argv, pattern, index, found, occurrences)
        return Resolved(occurrences, extras)

    def _consume(self, argv: Sequence[str], pattern: str, index: int, found: Named, out: list[Occurrence]) -> int:
        """argparse's consume_optional: the option at index takes its values; returns the next index."""
        option, spelled, explicit = found
        assert option is not None
        taken: list[Occurrence] = []
        while explicit is not None:
            if option.nargs == 0 and spelled[1] != "-" and explicit != "":
                # `-hx`: more one-letter flags glued on
                taken.append(Occurrence(index, argv[index], option, spelled, ()))
                glued = "-" + explicit[0]
                if glued not in self.options:
                    raise GrammarError(index, f"argument {_label(option)}: ignored explicit argument {explicit!r}")
                option, spelled, explicit = self.options[glued], glued, explicit[1:] or None
                continue
            if option.nargs == 0:
                raise GrammarError(index, f"argument {_label(option)}: ignored explicit argument {explicit!r}")
            if isinstance(option.nargs, int) and option.nargs > 1:
                raise GrammarError(index, f"argument {_label(option)}: {_expected(option.nargs)}")
            out += [*taken, Occurrence(index, argv[index], option, spelled, (explicit,))]
            return index + 1
        following = pattern[index + 1 :]
        count = _count(option, len(following) - len(following.lstrip("A")))
        if count is None:
            raise GrammarError(index, f"argument {_label(option)}: {_expected(option.nargs)}")
        out += [*taken, Occurrence(index, argv[index], option, spelled, tuple(argv[index + 1 : index + 1 + count]))]
        return index + 1 + count


def _count(option: ParserOption, available: int) -> int | None:
    """How many of the values that follow an option it takes (argparse's _match_argument); None: too few."""
    nargs = option.nargs
    if nargs == "?":
        return min(available, 1)
    if nargs == "*":
        return available
    needed = 1 if nargs == "+" else nargs
    assert isinstance(needed, int)
    if available < needed:
        return None
    return available if nargs == "+" else needed


def _expected(nargs: int | str) -> str:
    if nargs == "+":
        return "expected at least one argument"
    return "expected one argument" if nargs == 1 else f"expected {nargs} arguments"


def _label(option: ParserOption) -> str:
    return "/".join(option.names)
