"""The evaluation ledger: an append-only SQLite hash chain in a workspace directory.

Every entry holds its time, kind, command line, input hashes (name -> sha256) and a JSON payload,
plus the previous entry's hash; its own hash covers all of that, so editing, deleting or reordering
any entry breaks the chain from that entry on and `verify()` names it. SQLite triggers refuse
UPDATE and DELETE, so honest code cannot rewrite history by accident; the chain catches the rest.
A chain alone cannot show that its last entries were cut off, so every append also rewrites
`ledger.head` (the last number and hash, written to a temporary file, fsynced and renamed) and
`verify()` checks the chain's end against it. Refusals are recorded as entries too, then raised
as `LedgerRefusal`.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from exactedit.quant.errors import ExacteditError, FieldError
from exactedit.quant.files import atomic_write_text, file_sha256  # file_sha256: re-exported

DEFAULT_WORKSPACE = Path(".exactedit")
DB_NAME = "ledger.sqlite"
HEAD_NAME = "ledger.head"
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


class LedgerError(FieldError):
    """The ledger cannot be opened, or its hash chain is broken."""


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

    @classmethod
    def open(cls, workspace=DEFAULT_WORKSPACE) -> "Ledger":
        workspace = Path(workspace)
        if workspace.exists() and not workspace.is_dir():
            raise LedgerError(workspace, "workspace", "exists and is not a directory")
        workspace.mkdir(parents=True, exist_ok=True)
        path = workspace / DB_NAME
        try:
            conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
            conn.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise LedgerError(path, "database", f"not a usable SQLite ledger: {exc}") from exc
        return cls(path, conn)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def append(self, kind: str, command: str, inputs: Mapping[str, str], payload: Mapping[str, Any],
               *, time: str | None = None) -> Entry:
        """Add one entry at the end of the chain (in one IMMEDIATE transaction)."""
        time = time or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")
        inputs_s, payload_s = canonical(dict(inputs)), canonical(dict(payload))
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            last = c.execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
            seq, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
            h = entry_hash(seq, time, kind, command, inputs_s, payload_s, prev)
            c.execute("INSERT INTO entries VALUES (?,?,?,?,?,?,?,?)",
                      (seq, time, kind, command, inputs_s, payload_s, prev, h))
            self._write_head(seq, h)
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return Entry(seq, time, kind, command, json.loads(inputs_s), json.loads(payload_s), prev, h)

    def head(self) -> LedgerHead:
        """The last entry's number and hash, as the chain holds them now."""
        last = self._conn.execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
        return LedgerHead(int(last[0]), str(last[1])) if last else LedgerHead(0, GENESIS)

    def entry(self, seq: int) -> Entry | None:
        row = self._conn.execute("SELECT * FROM entries WHERE seq = ?", (seq,)).fetchone()
        return self._entry(row) if row else None

    @property
    def head_path(self) -> Path:
        return self.path.parent / HEAD_NAME

    def _write_head(self, seq: int, h: str) -> None:
        atomic_write_text(self.head_path, f"{seq} {h}\n")

    def _read_head(self) -> tuple[int, str] | None:
        try:
            seq, h = self.head_path.read_text(encoding="utf-8").split()
            return int(seq), h
        except FileNotFoundError:
            return None
        except (ValueError, OSError):
            return (-1, "")

    def entries(self, kind: str | None = None) -> tuple[Entry, ...]:
        q = "SELECT * FROM entries" + (" WHERE kind = ?" if kind else "") + " ORDER BY seq"
        rows = self._conn.execute(q, (kind,) if kind else ()).fetchall()
        return tuple(self._entry(r) for r in rows)

    def _entry(self, r) -> Entry:
        try:
            return Entry(r[0], r[1], r[2], r[3], json.loads(r[4]), json.loads(r[5]), r[6], r[7])
        except (json.JSONDecodeError, TypeError) as exc:
            raise LedgerError(self.path, f"entry {r[0]}", f"unreadable JSON: {exc}") from exc

    def verify(self) -> ChainCheck:
        """Recompute the chain; report the first entry whose hash, link or numbering is wrong."""
        rows = self._conn.execute("SELECT * FROM entries ORDER BY seq").fetchall()
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
        head = self._read_head()
        if rows and head is None:
            return ChainCheck(False, len(rows), len(rows), f"{HEAD_NAME} is missing")
        if head is not None and head != (len(rows), prev):
            n = head[0] if head[0] > 0 else None
            if n is not None and n > len(rows):
                return ChainCheck(False, len(rows), len(rows) + 1,
                                  f"{HEAD_NAME} records {n} entries, the chain ends at {len(rows)} (entries cut off)")
            return ChainCheck(False, len(rows), max(len(rows), 1), f"{HEAD_NAME} does not match the chain's last entry")
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
