"""The project's domain errors. Each names the file, the field and what was expected."""
from __future__ import annotations


class ExacteditError(Exception):
    """Base of every error exactedit raises on bad input; the CLI turns it into a clean message."""


class GGUFFormatError(ExacteditError):
    """A GGUF file is malformed, truncated, or lacks what was asked of it."""

    def __init__(self, path, field: str, message: str, offset: int | None = None):
        self.path, self.field, self.offset = str(path), field, offset
        where = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"{self.path}: {field}{where}: {message}")


class QuantError(ExacteditError):
    """A quantize/dequantize request is impossible (unsupported type, bad shape)."""
