"""The activation dump format (version 1): `write_dump`, `read_dump` (field hashes verified by
default: a dump's sha256 is the identity of its data), documents and row roles.

See docs/dump-format.md for the layout and how to mark roles and document tags.
"""
from exactedit import lazy_exports
from exactedit.dumps.errors import DumpFormatError
from exactedit.dumps.format import (
    ARCHS, FORMAT, ROLE_ANCHOR, ROLE_CODE, ROLE_NAMES, ROLE_PROMPT, ROLE_REPLY, ROLE_REPLY_END, ROLE_STEP0,
    ROLE_THINK, ROLE_TOOL, VERSION, DocInfo, DumpExpect,
)
from exactedit.dumps.reader import Dump, read_dump
from exactedit.dumps.verify import VerifyCache
from exactedit.dumps.writer import write_dump

# imported on first use: `dump inspect`'s summary and the engine contract's token file
_lazy, __getattr__ = lazy_exports(__name__, {
    "format_table": "summary",
    "inspect_dump": "summary",
    "read_tokens": "contract",
})
__all__ = _lazy + [
    "ARCHS", "FORMAT", "VERSION", "ROLE_ANCHOR", "ROLE_CODE", "ROLE_NAMES", "ROLE_PROMPT", "ROLE_REPLY",
    "ROLE_REPLY_END", "ROLE_STEP0", "ROLE_THINK", "ROLE_TOOL", "DocInfo", "Dump", "DumpExpect",
    "DumpFormatError", "VerifyCache", "read_dump", "write_dump",
]
