"""The user-level registry of blind runs: one-shot across workspaces.

A workspace's ledger can only refuse what it has seen; a fresh `--workspace` has seen nothing. So
every blind sign-off also claims its run here, in a registry shared by all of a user's workspaces
(`$EXACTEDIT_HOME/blind-runs.sqlite`; EXACTEDIT_HOME defaults to the user's data directory:
`$XDG_DATA_HOME/exactedit` or `~/.local/share/exactedit` on Linux, `~/Library/Application
Support/exactedit` on macOS, `%APPDATA%\\exactedit` on Windows). A run is keyed by the bundle's
sha256 and the blind document's data sha256 (its verified dump identity): a second run of either,
from any workspace, is refused, and the refusal is recorded in the requesting workspace's ledger
as today and here too.

The claim is one IMMEDIATE transaction (check, then insert), so two workspaces racing for the same
document cannot both win. Tables are append-only (triggers refuse UPDATE and DELETE); the ledger
entry of each claim is recorded as an event with its hash, which makes the registry an anchor of
that workspace's ledger as well (evals.protocol.anchors). SQLite failures (a corrupted file, a
read-only EXACTEDIT_HOME) are `LedgerError`s naming the registry file; a blind run checks that it
can write the registry before anything is computed.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from exactedit.evals.protocol.storage import LedgerError, require_writable, sqlite_errors

HOME_ENV = "EXACTEDIT_HOME"
DB_NAME = "blind-runs.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    bundle_sha256 TEXT NOT NULL,
    doc_sha256 TEXT NOT NULL,
    ledger TEXT NOT NULL,
    command TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    run INTEGER,
    time TEXT NOT NULL,
    kind TEXT NOT NULL,
    ledger TEXT NOT NULL,
    seq INTEGER,
    hash TEXT,
    detail TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS runs_no_update BEFORE UPDATE ON runs
BEGIN SELECT RAISE(ABORT, 'the blind registry is append-only'); END;
CREATE TRIGGER IF NOT EXISTS runs_no_delete BEFORE DELETE ON runs
BEGIN SELECT RAISE(ABORT, 'the blind registry is append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'the blind registry is append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'the blind registry is append-only'); END;
"""


def exactedit_home() -> Path:
    """EXACTEDIT_HOME, else the user's data directory for exactedit (see the module docstring)."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "exactedit"
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming") / "exactedit"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "exactedit"


@dataclass(frozen=True)
class BlindRun:
    """One claimed blind run: which bundle on which document, from which workspace's ledger."""

    id: int
    time: str
    bundle_sha256: str
    doc_sha256: str
    ledger: str
    command: str

    def describe(self) -> str:
        return f"registry run {self.id}, {self.time}, ledger {self.ledger}"


@dataclass(frozen=True)
class ClaimEvent:
    """A run's claim entry in its workspace's ledger: (seq, hash) there, an anchor of that ledger."""

    run: int
    ledger: str
    seq: int
    hash: str
    source: str


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


class BlindRegistry:
    """The registry file. Open with `BlindRegistry.open(home)`; close with `close()` or `with`."""

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path, self._conn = path, conn

    @classmethod
    def open(cls, home=None, *, write: bool = True) -> "BlindRegistry":
        """Open (creating) the registry; `write=True` first refuses a home this process cannot write."""
        home = Path(home) if home is not None else exactedit_home()
        if home.exists() and not home.is_dir():
            raise LedgerError(home, HOME_ENV, "exists and is not a directory")
        try:
            home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(home, HOME_ENV, f"cannot be created ({exc.strerror or exc})") from exc
        if write:
            require_writable(home, (DB_NAME,), HOME_ENV)
        path = home / DB_NAME
        try:
            conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
            conn.executescript(_SCHEMA)
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # a corrupted schema text too
            raise LedgerError(path, "database", f"not a usable blind-run registry: {exc}") from exc
        return cls(path, conn)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "BlindRegistry":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _rows(self, sql: str, args=()) -> list:
        with sqlite_errors(self.path, "cannot read the blind-run registry"):
            return self._conn.execute(sql, args).fetchall()

    def _exec(self, sql: str, args=()):
        with sqlite_errors(self.path, "cannot write the blind-run registry"):
            return self._conn.execute(sql, args)

    def _run(self, row) -> BlindRun:
        return BlindRun(int(row[0]), row[1], row[2], row[3], row[4], row[5])

    def earlier(self, bundle_sha256: str, doc_sha256: str) -> tuple[str, BlindRun] | None:
        """The first run of this document or of this bundle, with which of the two matched."""
        rows = self._rows("SELECT * FROM runs WHERE doc_sha256 = ? OR bundle_sha256 = ? ORDER BY id LIMIT 1",
                          (doc_sha256, bundle_sha256))
        if not rows:
            return None
        run = self._run(rows[0])
        return ("document" if run.doc_sha256 == doc_sha256 else "bundle"), run

    def claim(self, bundle_sha256: str, doc_sha256: str, ledger, command: str
              ) -> tuple[BlindRun | None, tuple[str, BlindRun] | None]:
        """Atomically: refuse (None, (what, earlier run)) when this document or bundle already had a
        run, else insert and return (the new run, None)."""
        self._exec("BEGIN IMMEDIATE")
        try:
            first = self.earlier(bundle_sha256, doc_sha256)
            if first is not None:
                self._exec("COMMIT")
                return None, first
            cur = self._exec("INSERT INTO runs (time, bundle_sha256, doc_sha256, ledger, command) VALUES (?,?,?,?,?)",
                             (_now(), bundle_sha256, doc_sha256, str(ledger), command))
            run_id = int(cur.lastrowid)
            self._exec("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
            raise
        return self._run(self._rows("SELECT * FROM runs WHERE id = ?", (run_id,))[0]), None

    def event(self, run: int | None, kind: str, ledger, seq: int | None = None, hash: str | None = None,
              detail: Mapping[str, Any] | None = None) -> None:
        """Append one event: "ledger-claim" (the claim's ledger entry), "result", "refused"."""
        self._exec("INSERT INTO events (run, time, kind, ledger, seq, hash, detail) VALUES (?,?,?,?,?,?,?)",
                   (run, _now(), kind, str(ledger), seq, hash,
                    json.dumps(dict(detail or {}), sort_keys=True, allow_nan=False)))

    def runs(self) -> tuple[BlindRun, ...]:
        return tuple(self._run(r) for r in self._rows("SELECT * FROM runs ORDER BY id"))

    def events(self, kind: str | None = None) -> tuple[dict, ...]:
        q = "SELECT run, time, kind, ledger, seq, hash, detail FROM events" + (" WHERE kind = ?" if kind else "")
        rows = self._rows(q + " ORDER BY id", (kind,) if kind else ())
        try:
            return tuple({"run": r[0], "time": r[1], "kind": r[2], "ledger": r[3], "seq": r[4], "hash": r[5],
                          "detail": json.loads(r[6])} for r in rows)
        except (TypeError, ValueError) as exc:
            raise LedgerError(self.path, "events", f"unreadable event: {exc}") from exc

    def claims_of(self, ledger) -> tuple[ClaimEvent, ...]:
        """The ledger entries (seq, hash) of every blind claim made from the ledger at `ledger`."""
        return tuple(ClaimEvent(e["run"], e["ledger"], int(e["seq"]), str(e["hash"]), str(self.path))
                     for e in self.events("ledger-claim") if e["ledger"] == str(ledger))
