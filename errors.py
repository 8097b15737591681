"""The project's domain errors. Each names the file, the field and what was expected."""
from __future__ import annotations


class ExacteditError(Exception):
    """Base of every error exactedit raises on bad input; the CLI turns it into a clean message."""


class FieldError(ExacteditError):
    """Bad input at one place: `WHERE: FIELD[ at offset N]: MESSAGE`, WHERE the file, directory or
    input it came from. The base of every error that names a file and a field."""

    def __init__(self, path, field: str, message: str, offset: int | None = None):
        self.path, self.field, self.message, self.offset = str(path), field, message, offset
        at = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"{self.path}: {field}{at}: {message}")


class GGUFFormatError(FieldError):
    """A GGUF file is malformed, truncated, or lacks what was asked of it."""


class QuantError(ExacteditError):
    """A quantize/dequantize request is impossible (unsupported type, bad shape)."""
