"""The evaluation ledger: an append-only SQLite hash chain in a workspace directory.

Every entry holds its time, kind, command line, input hashes (name -> sha256) and a JSON payload,
plus the previous entry's hash; its own hash covers all of that, so editing, deleting or reordering
any entry breaks the chain from that entry on and `verify()` names it. SQLite triggers refuse
UPDATE and DELETE, so honest code cannot rewrite history by accident; the chain catches the rest.
A chain alone cannot show that its last entries were cut off, so every write also rewrites
`ledger.head` (the last number and hash, written to a temporary file, fsynced and renamed) and
`verify()` checks the chain's end against it. Refusals are recorded as entries too, then raised
as `LedgerRefusal`.

Crash safety. A transaction writes the head twice: before COMMIT a pending head (`N HASH` and
`pending M HASH_M`: the chain ends at N now and at M once this commits), after COMMIT the final
one (`M HASH_M`), under the write lock both times. A crash at any point leaves a chain that ends
exactly where the head says, or at its pending line: both verify, and the next writer (or
`Ledger.open`) finalizes the head. Nothing but an interrupted write leaves a pending line, so a
cut-off or rewrite of a head that is final is still caught; while a pending line is there, its one
uncertain transaction is the only thing a truncation could hide (docs/evals.md, crash safety).
SQLite and I/O failures are `LedgerError`s naming the file.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from exactedit.evals.protocol.storage import (_BAD_HEAD, HeadFile, LedgerError, parse_head, require_writable,
                                             sqlite_errors)
from exactedit.errors import ExacteditError
from exactedit.files import atomic_write_text, check_regular, file_sha256, open_regular  # file_sha256: re-exported

DEFAULT_WORKSPACE = Path(".exactedit")
DB_NAME = "ledger.sqlite"
HEAD_NAME = "ledger.head"
MAX_HEAD_BYTES = 4096     # "N HASH" and a pending "pending M HASH": about 150 bytes
GENESIS = "0" * 64

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    kind TEXT NOT NULL,
    command TEXT NOT NULL,
    inputs TEXT NOT NULL,
    payload TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS entries_no_update BEFORE UPDATE ON entries
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS entries_no_delete BEFORE DELETE ON entries
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
"""


class LedgerRefusal(ExacteditError):
    """The protocol forbids the request; the refusal is recorded in the ledger as entry `seq`.
    `recorded` carries the earlier result a refused repeat asked for, when there is one."""

    def __init__(self, message: str, seq: int, recorded: Mapping[str, Any] | None = None):
        self.seq, self.recorded = seq, dict(recorded) if recorded is not None else None
        super().__init__(f"refused (ledger entry {seq}): {message}")


@dataclass(frozen=True)
class Entry:
    seq: int
    time: str
    kind: str
    command: str
    inputs: dict
    payload: dict
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class LedgerHead:
    """The chain's last entry (seq 0 and the genesis hash for an empty ledger). Outputs record it
    when they are written (evals.protocol.anchors): an anchor outside the ledger that a rewrite cannot reach."""

    seq: int
    hash: str

    def to_json(self) -> dict:
        return {"seq": self.seq, "hash": self.hash}


@dataclass(frozen=True)
class ChainCheck:
    """Result of `Ledger.verify`: ok, the number of entries, and the first bad entry with why."""

    ok: bool
    entries: int
    first_bad: int | None = None
    reason: str = ""


def canonical(obj) -> str:
    """The JSON text hashed and stored: sorted keys, no whitespace, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def entry_hash(seq: int, time: str, kind: str, command: str, inputs: str, payload: str, prev: str) -> str:
    text = canonical([seq, time, kind, command, inputs, payload, prev])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tree_sha256(path) -> str:
    """sha256 of a file, or of a directory as the sorted list of (relative path, file sha256)."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    if not path.is_dir():
        raise LedgerError(path, "path", "expected a file or a directory")
    items = [(p.relative_to(path).as_posix(), file_sha256(p)) for p in sorted(path.rglob("*")) if p.is_file()]
    return hashlib.sha256(canonical(items).encode("utf-8")).hexdigest()


class Ledger:
    """One workspace's ledger. Open with `Ledger.open(workspace)`; close with `close()` or `with`."""

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path, self._conn = path, conn
        self._txn: tuple[int, str] | None = None  # the chain's end when the open transaction began

    @classmethod
    def open(cls, workspace=DEFAULT_WORKSPACE, *, write: bool = True) -> "Ledger":
        """Open (creating) the ledger. `write=True` (every command that records) first refuses a
        workspace it cannot write, before any work, and finalizes a head an interrupted write left
        pending; `write=False` (verify, export, listing) only reads."""
        workspace = Path(workspace)
        if workspace.exists() and not workspace.is_dir():
            raise LedgerError(workspace, "workspace", "exists and is not a directory")
        path = workspace / DB_NAME
        try:
            workspace.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(workspace, "workspace", f"cannot be created ({exc.strerror or exc})") from exc
        if write:
            require_writable(workspace, (DB_NAME, HEAD_NAME))
        try:
            conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
            conn.executescript(_SCHEMA)
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # a corrupted schema text too
            raise LedgerError(path, "database", f"not a usable SQLite ledger: {exc}") from exc
        ledger = cls(path, conn)
        try:
            head = ledger._read_head()
            if write and head is not None and head.pending is not None:
                with ledger.transaction():
                    pass  # a transaction's start checks the head and rewrites it final
        except BaseException:
            conn.close()
            raise
        return ledger

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- SQL, every failure a LedgerError ------------------------------------------------------

    def _rows(self, sql: str, args=()) -> list:
        with sqlite_errors(self.path, "cannot read the ledger"):
            return self._conn.execute(sql, args).fetchall()

    def _exec(self, sql: str, args=(), what: str = "cannot write the ledger") -> None:
        with sqlite_errors(self.path, what):
            self._conn.execute(sql, args)

    def _last(self) -> tuple[int, str]:
        rows = self._rows("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1")
        return (int(rows[0][0]), str(rows[0][1])) if rows else (0, GENESIS)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """One read transaction (inside a write transaction: that one): the chain and the head file
        read while no writer can commit, so they are seen at one moment."""
        if self._conn.in_transaction:
            yield
            return
        self._exec("BEGIN", what="cannot read the ledger")
        try:
            yield
        finally:
            self._exec("COMMIT", what="cannot read the ledger")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One IMMEDIATE transaction: reads inside it see no other writer's changes, entries appended
        inside it commit together. A head that does not match the chain refuses the write (a write
        never launders a cut-off). A transaction opened inside another joins it."""
        if self._txn is not None:
            yield
            return
        self._exec("BEGIN IMMEDIATE", what="cannot lock the ledger for writing")
        try:
            start = self._last()
            self._check_head(start)
            self._txn = start
            yield
            end = self._last()
            if end != start:
                self._write_head(HeadFile(start, end))  # pending: valid whether or not COMMIT lands
            elif self._read_head() not in (None, HeadFile(start)):
                self._write_head(HeadFile(start))  # an interrupted write's pending line, resolved
            self._exec("COMMIT", what="cannot commit to the ledger")
        except BaseException:
            self._txn = None
            if self._conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
            raise
        self._txn = None
        if end != start:
            self._finalize(start, end)

    def _finalize(self, start: tuple[int, str], end: tuple[int, str]) -> None:
        """The final head after COMMIT, under the write lock so that a later writer's head is never
        overwritten. A failure here leaves the pending head, which verifies and which the next
        writer or open finalizes: the entries are committed, so it is not an error."""
        with contextlib.suppress(LedgerError, sqlite3.Error, OSError):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                if self._last() == end and self._read_head() == HeadFile(start, end):
                    self._write_head(HeadFile(end))
            finally:
                self._conn.execute("COMMIT")

    def _check_head(self, last: tuple[int, str]) -> None:
        head = self._read_head()
        if head is None:
            if last[0] > 0:
                raise LedgerError(self.head_path, HEAD_NAME, f"missing, the chain has {last[0]} entries: "
                                  "refusing to write (run `exactedit eval ledger --verify`)")
            return
        why = self._head_mismatch(head, last)
        if why:
            raise LedgerError(self.head_path, HEAD_NAME, f"{why}: refusing to write "
                              "(run `exactedit eval ledger --verify`)")

    def _head_mismatch(self, head: HeadFile, last: tuple[int, str], rows=None) -> str:
        """Why `head` does not describe a chain ending at `last` ("" when it does): it must be the
        committed end, or a pending end whose committed end is the entry it was written after.
        `rows`: the chain as verify read it (else the database is asked)."""
        if head.committed == last:
            return ""
        if head.pending == last:
            seq, h = head.committed
            if rows is not None:
                at = [(r[7],) for r in rows if r[0] == seq]
            else:
                at = self._rows("SELECT hash FROM entries WHERE seq = ?", (seq,))
            if (seq == 0 and h == GENESIS) or at == [(h,)]:
                return ""
        n = head.committed[0]
        if n > last[0]:
            return f"{HEAD_NAME} records {n} entries, the chain ends at {last[0]} (entries cut off)"
        return f"{HEAD_NAME} does not match the chain's last entry"

    # ---- entries ------------------------------------------------------------------------------

    def append(self, kind: str, command: str, inputs: Mapping[str, str], payload: Mapping[str, Any],
               *, time: str | None = None) -> Entry:
        """Add one entry at the end of the chain (in its own IMMEDIATE transaction, or in the one
        open on this ledger)."""
        time = time or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")
        inputs_s, payload_s = canonical(dict(inputs)), canonical(dict(payload))
        with self.transaction():
            seq, prev = self._last()
            seq += 1
            h = entry_hash(seq, time, kind, command, inputs_s, payload_s, prev)
            self._exec("INSERT INTO entries VALUES (?,?,?,?,?,?,?,?)",
                       (seq, time, kind, command, inputs_s, payload_s, prev, h))
        return Entry(seq, time, kind, command, json.loads(inputs_s), json.loads(payload_s), prev, h)

    def head(self) -> LedgerHead:
        """The last entry's number and hash, as the chain holds them now."""
        return LedgerHead(*self._last())

    def entry(self, seq: int) -> Entry | None:
        rows = self._rows("SELECT * FROM entries WHERE seq = ?", (seq,))
        return self._entry(rows[0]) if rows else None

    @property
    def head_path(self) -> Path:
        return self.path.parent / HEAD_NAME

    def _write_head(self, head: HeadFile) -> None:
        try:
            atomic_write_text(self.head_path, head.text())
        except OSError as exc:
            raise LedgerError(exc.filename or self.head_path, HEAD_NAME,
                              f"cannot be written ({exc.strerror or exc})") from exc

    def _read_head(self) -> HeadFile | None:
        """The head file: None when there is none; a FIFO, device or symlink loop standing there is
        refused by name (LedgerError), never waited on or read on (before: a FIFO hung every command
        that opens the ledger, /dev/zero read until memory ran out); a file that does not parse, or
        longer than a head is, is a bad head (`_BAD_HEAD`: it matches no chain)."""
        path = self.head_path
        if not os.path.lexists(path):
            return None
        check_regular(path, None, LedgerError, HEAD_NAME)
        try:
            with open_regular(path, None, LedgerError, HEAD_NAME) as fh:
                data = fh.read(MAX_HEAD_BYTES + 1)
        except (LedgerError, OSError):
            return _BAD_HEAD
        if len(data) > MAX_HEAD_BYTES:
            return _BAD_HEAD
        try:
            return parse_head(data.decode("utf-8"))
        except ValueError:
            return _BAD_HEAD

    def entries(self, kind: str | None = None) -> tuple[Entry, ...]:
        q = "SELECT * FROM entries" + (" WHERE kind = ?" if kind else "") + " ORDER BY seq"
        return tuple(self._entry(r) for r in self._rows(q, (kind,) if kind else ()))

    def _entry(self, r) -> Entry:
        try:
            return Entry(r[0], r[1], r[2], r[3], json.loads(r[4]), json.loads(r[5]), r[6], r[7])
        except (json.JSONDecodeError, TypeError) as exc:
            raise LedgerError(self.path, f"entry {r[0]}", f"unreadable JSON: {exc}") from exc

    def verify(self) -> ChainCheck:
        """Recompute the chain; report the first entry whose hash, link or numbering is wrong."""
        with self._reading():
            rows = self._rows("SELECT * FROM entries ORDER BY seq")
            head = self._read_head()
        prev = GENESIS
        for i, (seq, time, kind, command, inputs, payload, prev_hash, h) in enumerate(rows, start=1):
            if seq != i:
                return ChainCheck(False, len(rows), seq, f"expected entry number {i}, found {seq} (entries missing)")
            if prev_hash != prev:
                return ChainCheck(False, len(rows), seq, "its previous-hash link does not match the entry before it")
            if not all(isinstance(x, str) for x in (time, kind, command, inputs, payload, prev_hash, h)):
                return ChainCheck(False, len(rows), seq, "a field has the wrong type")
            if entry_hash(seq, time, kind, command, inputs, payload, prev_hash) != h:
                return ChainCheck(False, len(rows), seq, "its contents do not match its hash (edited)")
            prev = h
        if rows and head is None:
            return ChainCheck(False, len(rows), len(rows), f"{HEAD_NAME} is missing")
        if head is not None:
            why = self._head_mismatch(head, (len(rows), prev), rows)
            if why:
                cut = "cut off" in why
                return ChainCheck(False, len(rows), len(rows) + 1 if cut else max(len(rows), 1), why)
        return ChainCheck(True, len(rows))

    def require_intact(self) -> None:
        """Raise LedgerError unless the chain verifies; every gatekeeping read starts here."""
        check = self.verify()
        if not check.ok:
            raise LedgerError(self.path, f"entry {check.first_bad}", f"hash chain broken: {check.reason}")

    def refuse(self, command: str, inputs: Mapping[str, str], reason: str,
               recorded: Mapping[str, Any] | None = None) -> LedgerRefusal:
        """Record a refusal and return the error for the caller to raise."""
        e = self.append("refusal", command, inputs, {"reason": reason})
        return LedgerRefusal(reason, e.seq, recorded)


def ledger_id(ledger: Ledger) -> str:
    """The ledger's file, resolved: how outputs and the blind registry name the ledger they anchor."""
    return str(Path(ledger.path).resolve())


def head_json(ledger: Ledger) -> dict:
    """The `ledger_head` every bundle, report and sign-off records when it is written."""
    return {**ledger.head().to_json(), "ledger": ledger_id(ledger)}


# ---- protocol registration --------------------------------------------------------------------

@dataclass(frozen=True)
class ProtocolRecord:
    """The registration a run stands on. `registered` is False only under `--unregistered`;
    then `marker` is the line every report written from this run must print."""

    name: str
    sha256: str
    path: str
    registered: bool
    seq: int | None = None
    marker: str = ""


def register_protocol(ledger: Ledger, protocol, command: str, trace_hashes: Mapping[str, str] | None = None
                      ) -> ProtocolRecord:
    """Register `protocol` (a `evals.protocol.protocol.Protocol`). Registering the same bytes again returns
    the first record; a different file under an already registered name is refused: a changed
    protocol must be registered under a new name, so that the change shows."""
    ledger.require_intact()
    for e in ledger.entries("register"):
        if e.payload.get("name") != protocol.name:
            continue
        if e.payload.get("sha256") == protocol.sha256:
            return _record(e)
        raise ledger.refuse(command, {"protocol": protocol.sha256},
                            f"protocol {protocol.name!r} is already registered with sha256 "
                            f"{e.payload.get('sha256')} (entry {e.seq}); a changed protocol needs a new name")
    inputs = {"protocol": protocol.sha256, **{f"trace:{k}": v for k, v in (trace_hashes or {}).items()}}
    e = ledger.append("register", command, inputs,
                      {"name": protocol.name, "sha256": protocol.sha256, "path": str(protocol.path),
                       "traces": {t.name: t.role for t in protocol.traces}})
    return _record(e)


def require_registered(ledger: Ledger, protocol, command: str = "", unregistered: bool = False
                       ) -> ProtocolRecord:
    """The registration of this exact protocol file. Raises LedgerRefusal when it is unregistered
    or changed since registration, unless `unregistered=True`: then returns a record whose
    `marker` reports must print."""
    ledger.require_intact()
    regs = [e for e in ledger.entries("register") if e.payload.get("name") == protocol.name]
    if regs and regs[0].payload.get("sha256") == protocol.sha256:
        return _record(regs[0])
    if regs:
        why = (f"protocol {protocol.name!r} changed since registration (entry {regs[0].seq}: sha256 "
               f"{regs[0].payload.get('sha256')}, file now {protocol.sha256})")
    else:
        why = f"protocol {protocol.name!r} (sha256 {protocol.sha256}) is not registered in {ledger.path}"
    if unregistered:
        return ProtocolRecord(protocol.name, protocol.sha256, str(protocol.path), False,
                              marker=f"UNREGISTERED PROTOCOL: {why}")
    raise ledger.refuse(command, {"protocol": protocol.sha256}, why + "; register it first or pass --unregistered")


def _record(e: Entry) -> ProtocolRecord:
    return ProtocolRecord(e.payload["name"], e.payload["sha256"], e.payload.get("path", ""), True, e.seq)
