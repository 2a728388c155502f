"""The errors users see, each printed as one line: where (file or option), which field, what is allowed."""

from __future__ import annotations


def one_line(text: str) -> str:
    """Control characters (newline, CR, escape, ...) written as escapes, so one error is one line of the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ProvisionError(Exception):
    """A failure the CLI reports as `provision: <label>: <message>` and exits with `exit_code`, no traceback."""

    exit_code = 1
    label = "error"

    def __str__(self) -> str:
        return one_line(super().__str__())


class InputError(ProvisionError):
    """Bad input. The CLI prints it as one line and exits 2; the Ansible plugin fails the host with it."""

    exit_code = 2

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source = source
        self.field = field
        self.message = message
        super().__init__(source, field, message)

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source else ""
        what = f"{self.field}: " if self.field else ""
        return one_line(f"{where}{what}{self.message}")


class SandboxError(ProvisionError):
    """The sandbox could not be brought into the asked state."""

    label = "sandbox"
