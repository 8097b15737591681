"""The activation dump format (version 1): `write_dump`, `read_dump` (field hashes verified by
default: a dump's sha256 is the identity of its data), documents and row roles.

See docs/dump-format.md for the layout and how to mark roles and document tags.
"""
from exactedit.dumps.errors import DumpFormatError
from exactedit.dumps.format import (
    ARCHS, FORMAT, ROLE_ANCHOR, ROLE_CODE, ROLE_NAMES, ROLE_PROMPT, ROLE_REPLY, ROLE_REPLY_END, ROLE_STEP0,
    ROLE_THINK, ROLE_TOOL, VERSION, DocInfo, DumpExpect,
)
from exactedit.dumps.reader import Dump, read_dump
from exactedit.dumps.verify import VerifyCache
from exactedit.dumps.writer import write_dump

__all__ = [
    "ARCHS", "FORMAT", "VERSION", "ROLE_ANCHOR", "ROLE_CODE", "ROLE_NAMES", "ROLE_PROMPT", "ROLE_REPLY",
    "ROLE_REPLY_END", "ROLE_STEP0", "ROLE_THINK", "ROLE_TOOL", "DocInfo", "Dump", "DumpExpect",
    "DumpFormatError", "VerifyCache", "read_dump", "write_dump",
]
