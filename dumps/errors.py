"""The dump format's error type: every message names the dump, the field and what was expected."""
from __future__ import annotations

from quant.errors import ExacteditError


class DumpFormatError(ExacteditError):
    """A dump directory (or the arrays handed to the writer) does not match the format."""

    def __init__(self, path, field: str, message: str):
        self.path, self.field, self.message = str(path), field, message
        super().__init__(f"{self.path}: {field}: {message}")
