"""The one error type users see: where (file or option), which field, what is allowed."""

from __future__ import annotations


class InputError(Exception):
    """Bad input. The CLI prints it as one line and exits 2; the Ansible plugin fails the host with it."""

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source = source
        self.field = field
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source else ""
        what = f"{self.field}: " if self.field else ""
        return f"{where}{what}{self.message}"
