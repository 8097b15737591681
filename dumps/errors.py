"""The dump format's error type: every message names the dump, the field and what was expected."""
from __future__ import annotations

from exactedit.errors import FieldError


class DumpFormatError(FieldError):
    """A dump directory (or the arrays handed to the writer) does not match the format."""
