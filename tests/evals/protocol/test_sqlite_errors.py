"""SQLite and file-system failures after open are the project's errors naming the file: a
page-corrupted ledger or blind registry, a workspace or EXACTEDIT_HOME this process cannot write
(refused before any work)."""
from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactedit.evals.protocol.ledger import DB_NAME, Ledger, LedgerError, LedgerRefusal
from exactedit.evals.protocol.registry import DB_NAME as REG_NAME, BlindRegistry


def _ledger_bytes(tmp_path_factory) -> bytes:
    ws = tmp_path_factory.mktemp("src")
    with Ledger.open(ws) as led:
        for i in range(60):  # several pages
            led.append("note", "cmd " + "x" * 200, {"i": f"{i:064x}"}, {"i": i, "pad": "y" * 300})
    return (ws / DB_NAME).read_bytes(), (ws / "ledger.head").read_text()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return _ledger_bytes(tmp_path_factory)


def test_a_page_corrupted_ledger_is_a_clean_error(pristine, tmp_path):
    data, head = pristine
    ws = tmp_path / "ws"
    ws.mkdir()
    bad = bytearray(data)
    bad[4096 * 2:4096 * 4] = b"\xa5" * 8192  # pages 3 and 4: table b-tree pages
    (ws / DB_NAME).write_bytes(bytes(bad))
    (ws / "ledger.head").write_text(head)
    with pytest.raises(LedgerError, match=f"{DB_NAME}: database: .*malformed"):
        with Ledger.open(ws) as led:
            led.verify()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 255)), min_size=1, max_size=16))
@example([(4096 * 2 + 8, 0xFF)])
@example([(100, 0)])  # the header's page count
@example([(3984, 128)])  # a text value no longer UTF-8 (CI found it: sqlite3 raised UnicodeDecodeError)
def test_byte_mutations_of_a_ledger_raise_only_our_errors(pristine, tmp_path, edits):
    data, head = pristine
    bad = bytearray(data)
    for at, byte in edits:
        bad[at % len(bad)] = byte
    ws = tempfile.mkdtemp(dir=tmp_path)
    with open(os.path.join(ws, DB_NAME), "wb") as fh:
        fh.write(bytes(bad))
    with open(os.path.join(ws, "ledger.head"), "w") as fh:
        fh.write(head)
    try:
        with Ledger.open(ws) as led:
            led.verify()
            led.entries()
            led.require_intact()
            led.append("note", "after", {}, {})
    except (LedgerError, LedgerRefusal):
        pass


def test_a_page_corrupted_registry_is_a_clean_error(tmp_path):
    home = tmp_path / "home"
    with BlindRegistry.open(home) as reg:
        for i in range(200):
            reg.claim(f"{i:064x}", f"{i + 1000:064x}", "ledger " + "z" * 200, "eval blind")
    data = bytearray((home / REG_NAME).read_bytes())
    data[4096 * 2:4096 * 4] = b"\xa5" * 8192
    (home / REG_NAME).write_bytes(bytes(data))
    with pytest.raises(LedgerError, match=f"{REG_NAME}: database: .*malformed"):
        with BlindRegistry.open(home) as reg:
            reg.runs()
            reg.claim("a" * 64, "b" * 64, "ledger", "eval blind")


def _unwritable(monkeypatch, directory):
    """What a read-only directory does to this process (tests may run as root, where chmod does not)."""
    real = tempfile.mkstemp

    def mkstemp(*a, dir=None, **k):
        if dir is not None and os.path.samefile(dir, directory):
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_a_read_only_workspace_is_refused_on_open_for_writing(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    with Ledger.open(ws) as led:
        led.append("note", "x", {}, {})
    _unwritable(monkeypatch, ws)
    with pytest.raises(LedgerError, match="workspace: not writable .Permission denied.: the run could not be recorded"):
        Ledger.open(ws)
    with Ledger.open(ws, write=False) as led:  # verify, export, listing: reading is enough
        assert led.verify().ok


def test_a_read_only_exactedit_home_is_refused(tmp_path, monkeypatch):
    home = tmp_path / "home"
    BlindRegistry.open(home).close()
    _unwritable(monkeypatch, home)
    with pytest.raises(LedgerError, match="EXACTEDIT_HOME: not writable"):
        BlindRegistry.open(home)
    with BlindRegistry.open(home, write=False) as reg:
        assert reg.runs() == ()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file modes")
def test_a_chmod_read_only_workspace_is_refused(tmp_path):
    ws = tmp_path / "ws"
    Ledger.open(ws).close()
    ws.chmod(0o500)
    try:
        with pytest.raises(LedgerError, match="not writable"):
            Ledger.open(ws)
    finally:
        ws.chmod(0o700)


def test_a_read_only_ledger_file_fails_cleanly_on_write(tmp_path):
    """A database opened read-only under the workspace check (another process made it so): the
    write is a LedgerError naming the file, not a traceback."""
    import sqlite3

    ws = tmp_path / "ws"
    Ledger.open(ws).close()
    led = Ledger.open(ws)
    led._conn.close()
    led._conn = sqlite3.connect(f"file:{ws / DB_NAME}?mode=ro", uri=True, isolation_level=None)
    with pytest.raises(LedgerError, match=f"{DB_NAME}: database: .*readonly"):
        led.append("note", "x", {}, {})
    led.close()
