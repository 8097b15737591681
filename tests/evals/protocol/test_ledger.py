"""The ledger: append-only hash chain, tamper detection, registration refusals."""
from __future__ import annotations

import sqlite3

import pytest

from exactedit.evals.protocol.ledger import (
    HEAD_NAME, Ledger, LedgerError, LedgerRefusal, register_protocol, require_registered, tree_sha256,
)
from exactedit.evals.protocol.protocol import load_protocol


@pytest.fixture
def ledger(tmp_path):
    with Ledger.open(tmp_path / "ws") as led:
        yield led


def _fill(ledger, n=4):
    for i in range(n):
        ledger.append("note", f"cmd {i}", {"x": f"{i:064x}"}, {"i": i, "text": "é"})


def test_chain_verifies_and_links(ledger):
    _fill(ledger)
    es = ledger.entries()
    assert [e.seq for e in es] == [1, 2, 3, 4]
    assert all(b.prev_hash == a.hash for a, b in zip(es, es[1:]))
    assert ledger.verify().ok and ledger.verify().entries == 4
    assert ledger.entries("note")[2].payload == {"i": 2, "text": "é"}


def test_sql_update_and_delete_are_refused(ledger):
    _fill(ledger, 2)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        ledger._conn.execute("UPDATE entries SET command = 'x' WHERE seq = 1")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        ledger._conn.execute("DELETE FROM entries WHERE seq = 2")


def _tamper(ledger, sql):
    c = ledger._conn
    c.executescript("DROP TRIGGER entries_no_update; DROP TRIGGER entries_no_delete;")
    c.execute(sql)


@pytest.mark.parametrize("sql, first_bad, why", [
    ("UPDATE entries SET payload = '{\"i\":9}' WHERE seq = 2", 2, "edited"),
    ("UPDATE entries SET time = '2000-01-01' WHERE seq = 3", 3, "edited"),
    ("DELETE FROM entries WHERE seq = 2", 3, "missing"),
    ("UPDATE entries SET prev_hash = hash WHERE seq = 3", 3, "link"),
    ("DELETE FROM entries WHERE seq = 4", 4, "cut off"),
])
def test_tampering_names_first_bad_entry(ledger, sql, first_bad, why):
    _fill(ledger)
    _tamper(ledger, sql)
    check = ledger.verify()
    assert not check.ok and check.first_bad == first_bad and why in check.reason
    with pytest.raises(LedgerError, match=f"entry {first_bad}"):
        ledger.require_intact()


def test_rechained_rewrite_is_caught_by_head(ledger):
    """Rewriting an entry and recomputing every later hash still leaves the head file behind."""
    from exactedit.evals.protocol.ledger import entry_hash
    _fill(ledger, 3)
    _tamper(ledger, "UPDATE entries SET payload = '{\"i\":7}' WHERE seq = 2")
    prev = ledger.entries()[0].hash
    for e in ledger._conn.execute("SELECT * FROM entries WHERE seq >= 2 ORDER BY seq").fetchall():
        h = entry_hash(e[0], e[1], e[2], e[3], e[4], e[5], prev)
        ledger._conn.execute("UPDATE entries SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, h, e[0]))
        prev = h
    check = ledger.verify()
    assert not check.ok and HEAD_NAME in check.reason


def test_missing_head_is_reported(ledger):
    _fill(ledger, 1)
    ledger.head_path.unlink()
    assert not ledger.verify().ok


def test_not_a_database(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "ledger.sqlite").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LedgerError, match="SQLite"):
        Ledger.open(ws)


def test_register_and_require(ledger, protocol_file):
    p = load_protocol(protocol_file)
    rec = register_protocol(ledger, p, "eval register")
    assert rec.registered and rec.sha256 == p.sha256
    assert register_protocol(ledger, p, "eval register") == rec  # same bytes: the first record
    assert require_registered(ledger, p) == rec
    assert len(ledger.entries("register")) == 1


def test_unregistered_protocol_is_refused_or_marked(ledger, protocol_file):
    p = load_protocol(protocol_file)
    with pytest.raises(LedgerRefusal, match="not registered"):
        require_registered(ledger, p, "solve head")
    assert ledger.entries("refusal")[-1].payload["reason"].startswith("protocol 'unit'")
    rec = require_registered(ledger, p, "solve head", unregistered=True)
    assert not rec.registered and rec.marker.startswith("UNREGISTERED PROTOCOL")


def test_changed_protocol_is_refused(ledger, protocol_file):
    register_protocol(ledger, load_protocol(protocol_file), "eval register")
    protocol_file.write_text(protocol_file.read_text().replace("seed = 7", "seed = 8"))
    changed = load_protocol(protocol_file)
    with pytest.raises(LedgerRefusal, match="changed since registration"):
        require_registered(ledger, changed, "solve head")
    with pytest.raises(LedgerRefusal, match="needs a new name"):
        register_protocol(ledger, changed, "eval register")
    assert require_registered(ledger, changed, unregistered=True).marker
    assert len(ledger.entries("refusal")) == 2


def test_tree_sha256_sees_every_file(tmp_path):
    d = tmp_path / "bundle"
    (d / "sub").mkdir(parents=True)
    (d / "manifest.json").write_text("{}")
    (d / "sub" / "x.bin").write_bytes(b"\x00\x01")
    h = tree_sha256(d)
    (d / "sub" / "x.bin").write_bytes(b"\x00\x02")
    assert tree_sha256(d) != h
    (d / "sub" / "x.bin").write_bytes(b"\x00\x01")
    assert tree_sha256(d) == h
    (d / "extra").write_text("")
    assert tree_sha256(d) != h
