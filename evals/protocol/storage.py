"""The workspace's storage, beneath the ledger and the blind registry: SQLite and I/O failures as
`LedgerError`s naming the file, a directory refused before any work when this process cannot write
it, and `ledger.head`'s two-line format (the chain's end, and the end a transaction in flight will
commit: evals/protocol/ledger.py, crash safety)."""
from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from exactedit.errors import FieldError


class LedgerError(FieldError):
    """The ledger cannot be opened, or its hash chain is broken."""


@contextlib.contextmanager
def sqlite_errors(path, what: str) -> Iterator[None]:
    """Turn a SQLite failure (a corrupted page, a read-only or full disk, a lock held too long)
    into a LedgerError naming the database file."""
    try:
        yield
    except sqlite3.Error as exc:
        raise LedgerError(path, "database", f"{what}: {exc}") from exc
    except UnicodeDecodeError as exc:  # a corrupted TEXT value: SQLite hands back bytes that are not UTF-8
        raise LedgerError(path, "database", f"{what}: a stored text is not UTF-8 (corrupted): {exc}") from exc


def require_writable(directory, files=(), what: str = "workspace") -> None:
    """Refuse, before any work, a directory this process cannot write: a probe file is created and
    removed in it and each existing file of `files` is opened for writing (nothing is changed)."""
    directory = Path(directory)
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
        for name in files:
            if (directory / name).exists():
                open(directory / name, "r+b").close()
    except OSError as exc:
        raise LedgerError(exc.filename or directory, what,
                          f"not writable ({exc.strerror or exc}): the run could not be recorded") from exc


@dataclass(frozen=True)
class HeadFile:
    """`ledger.head` as read: the chain's end, and the end a transaction in flight will commit."""

    committed: tuple[int, str]
    pending: tuple[int, str] | None = None

    def text(self) -> str:
        pend = f"pending {self.pending[0]} {self.pending[1]}\n" if self.pending else ""
        return f"{self.committed[0]} {self.committed[1]}\n{pend}"


_BAD_HEAD = HeadFile((-1, ""))


def parse_head(text: str) -> HeadFile:
    """`N HASH` or `N HASH` + `pending M HASH` (M > N); anything else is `_BAD_HEAD`."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    try:
        seq, h = lines[0].split(" ")
        head = HeadFile((int(seq), h))
        if len(lines) == 2:
            word, pseq, ph = lines[1].split(" ")
            if word != "pending" or int(pseq) <= head.committed[0]:
                return _BAD_HEAD
            head = HeadFile(head.committed, (int(pseq), ph))
        elif len(lines) != 1:
            return _BAD_HEAD
    except (ValueError, IndexError):
        return _BAD_HEAD
    return head if head.committed[0] >= 0 else _BAD_HEAD
