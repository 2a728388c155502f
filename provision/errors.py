"""The errors users see, each printed as one line: where (file or option), which field, what is allowed; and the
exit codes of the CLI, one per kind of failure."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """`provision`'s exit codes (README.md, "Exit codes")."""

    OK = 0
    FAILED = 1  # checks failed, a run failed, or an internal error
    BAD_INPUT = 2  # refused before anything changed
    BUSY = 3  # another run holds the lock of a host (or of the sandbox)
    WRITE_ERROR = 4  # the output could not be written: stdout closed, disk full, I/O error
    INTERRUPTED = 130  # 128 + SIGINT
    CLOSED_PIPE = 141  # 128 + SIGPIPE: the reader went away (`| head`), as a shell reports a tool SIGPIPE ended


def one_line(text: str, keep_newlines: bool = False) -> str:
    """The text as it is safe to print: every character str.isprintable() refuses written as its Python escape.
    That is the C0 and C1 controls (newline, CR, ESC, CSI, ...), the format characters (Cf: bidi overrides and
    isolates U+202A-E, U+2066-9, marks U+200E/F, zero-width U+200B-D, U+FEFF), line and paragraph separators (Zl,
    Zp), other spaces than ' ' (Zs), private use, surrogates and unassigned code points: nothing printed can move
    the cursor, recolour the terminal, reorder what follows, hide or fake text. The escapes are those of Python and
    of bash's $'...'. keep_newlines keeps "\\n" as is, for text printed on several lines on purpose."""
    return "".join(c if c.isprintable() or (keep_newlines and c == "\n") else repr(c)[1:-1] for c in text)


class ProvisionError(Exception):
    """A failure the CLI reports as `provision: <label>: <message>` and exits with `exit_code`, no traceback."""

    exit_code = ExitCode.FAILED
    label = "error"

    def __str__(self) -> str:
        return one_line(super().__str__())


class InputError(ProvisionError):
    """Bad input. The CLI prints it as one line and exits 2; the Ansible plugin fails the host with it."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source = source
        self.field = field
        self.message = message
        super().__init__(source, field, message)

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source else ""
        what = f"{self.field}: " if self.field else ""
        return one_line(f"{where}{what}{self.message}")


class OutputError(ProvisionError):
    """stdout cannot be written (closed, a full disk, an I/O error); a reader that went away is not one (141)."""

    exit_code = ExitCode.WRITE_ERROR

    def __init__(self, err: OSError) -> None:
        super().__init__(f"cannot write the output: {err.strerror or err}")


class BusyError(ProvisionError):
    """Another run holds the lock this one needs; nothing was changed."""

    exit_code = ExitCode.BUSY
    label = "busy"


class SandboxError(ProvisionError):
    """The sandbox could not be brought into the asked state."""

    label = "sandbox"
