"""The ledger at every crash point of a write: killed (os._exit in a child process) or failing with
an I/O error before each step (os.fsync, os.replace, each SQL statement), the workspace reopens
to a chain that verifies, ending where it did or one entry later, and takes the next write. What
a crash can leave is told apart from what an attacker who edits only the database can make."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading

import pytest

from exactedit.evals.protocol import ledger as ledger_mod
from exactedit.evals.protocol.ledger import HEAD_NAME, Ledger
from exactedit.evals.protocol.storage import LedgerError, parse_head

CHILD = r"""
import os, sqlite3, sys
from exactedit.evals.protocol.ledger import Ledger

ws, stop = sys.argv[1], int(sys.argv[2])
steps = []

def step(name):
    steps.append(name)
    if len(steps) == stop:
        os._exit(3)  # killed here: no cleanup, no rollback

real_fsync, real_replace = os.fsync, os.replace
os.fsync = lambda fd: (step("fsync"), real_fsync(fd))[1]
os.replace = lambda a, b: (step("replace"), real_replace(a, b))[1]

class Conn:
    def __init__(self, c):
        self.c = c
    def execute(self, sql, *a):
        step(sql.split()[0])
        return self.c.execute(sql, *a)
    def __getattr__(self, k):
        return getattr(self.c, k)

led = Ledger.open(ws)
led._conn = Conn(led._conn)
led.append("note", "crash", {}, {"i": "last"})
print(len(steps), " ".join(steps))
"""


def _fill(ws, n=3):
    with Ledger.open(ws) as led:
        for i in range(n):
            led.append("note", f"cmd {i}", {}, {"i": i})


def _child(ws, stop):
    return subprocess.run([sys.executable, "-c", CHILD, str(ws), str(stop)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=120)


def _reopens_intact(ws, n):
    """The chain verifies with n or n + 1 entries, and the next write lands on it."""
    with Ledger.open(ws, write=False) as led:
        check = led.verify()
        assert check.ok, check
        assert check.entries in (n, n + 1)
    with Ledger.open(ws) as led:
        assert parse_head(led.head_path.read_text()).pending is None  # open finalized it
        led.append("note", "after", {}, {})
        assert led.verify().ok and led.verify().entries == check.entries + 1
    return check.entries


def test_every_crash_point_of_an_append_reopens_intact(tmp_path):
    _fill(tmp_path / "probe")
    done = _child(tmp_path / "probe", 0)
    assert done.returncode == 0, done.stderr
    n_steps, names = int(done.stdout.split()[0]), done.stdout.split()[1:]
    assert {"BEGIN", "COMMIT", "replace", "fsync"} <= set(names), names
    seen = set()
    for stop in range(1, n_steps + 1):
        ws = tmp_path / f"ws{stop}"
        _fill(ws)
        killed = _child(ws, stop)
        assert killed.returncode == 3, (stop, killed.stderr)
        seen.add(_reopens_intact(ws, 3))
    assert seen == {3, 4}  # crashes before the commit lose the entry, after it keep it


@pytest.mark.parametrize("stop", range(1, 16))
def test_an_io_error_at_every_step_is_a_clean_error_and_reopens_intact(tmp_path, monkeypatch, stop):
    ws = tmp_path / "ws"
    _fill(ws)
    steps = []

    def step(name, exc):
        steps.append(name)
        if len(steps) == stop:
            raise exc

    real_fsync, real_replace = os.fsync, os.replace
    led = Ledger.open(ws)

    class Conn:
        def __init__(self, c):
            self.c = c

        def execute(self, sql, *a):
            step(sql.split()[0], sqlite3.OperationalError("disk I/O error"))
            return self.c.execute(sql, *a)

        def __getattr__(self, k):
            return getattr(self.c, k)

    real_conn, led._conn = led._conn, Conn(led._conn)
    monkeypatch.setattr(os, "fsync", lambda fd: (step("fsync", OSError(5, "Input/output error")), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (step("replace", OSError(5, "Input/output error")),
                                                     real_replace(a, b))[1])
    try:
        led.append("note", "io", {}, {})
    except LedgerError as exc:  # before the commit: the entry is not there, the error names a file
        assert str(ws) in str(exc)
        assert exc.path.endswith((ledger_mod.DB_NAME, HEAD_NAME, HEAD_NAME + ".tmp"))
    finally:
        monkeypatch.undo()
        real_conn.close()
    assert stop <= len(steps), f"an append has {len(steps)} steps now: fit the parametrized range to it"
    _reopens_intact(ws, 3)


def _ledger(ws, n=3):
    _fill(ws, n)
    return Ledger.open(ws)


def test_a_final_head_still_catches_a_cut_off_last_entry(tmp_path):
    led = _ledger(tmp_path / "ws")
    led._conn.executescript("DROP TRIGGER entries_no_delete; DELETE FROM entries WHERE seq = 3;")
    check = led.verify()
    assert not check.ok and "cut off" in check.reason
    with pytest.raises(LedgerError, match="cut off.*refusing to write"):
        led.append("note", "launder", {}, {})  # a write does not paper over the cut
    led.close()


def test_a_head_one_behind_the_chain_is_not_taken_for_a_crash(tmp_path):
    """An entry appended to the database alone (no pending line in the head): refused."""
    led = _ledger(tmp_path / "ws")
    head = led.head_path.read_text()
    led.append("note", "forged", {}, {})
    led.head_path.write_text(head)
    assert not led.verify().ok
    led.close()


@pytest.mark.parametrize("cut", [1, 2])
def test_a_pending_head_covers_only_its_own_transaction(tmp_path, cut):
    """head `3 H3 / pending 4 H4`: a chain of 3 or 4 verifies; cut to 2 or 1 it does not."""
    led = _ledger(tmp_path / "ws", 4)
    es = led.entries()
    led.head_path.write_text(f"3 {es[2].hash}\npending 4 {es[3].hash}\n")
    assert led.verify().ok
    led._conn.executescript("DROP TRIGGER entries_no_delete;")
    led._conn.execute("DELETE FROM entries WHERE seq = 4")
    assert led.verify().ok  # the one uncertain transaction: not committed
    led._conn.execute("DELETE FROM entries WHERE seq > ?", (3 - cut,))
    check = led.verify()
    assert not check.ok and "cut off" in check.reason
    led.close()


def test_a_pending_head_must_sit_on_the_chain(tmp_path):
    led = _ledger(tmp_path / "ws", 4)
    es = led.entries()
    led.head_path.write_text(f"3 {'f' * 64}\npending 4 {es[3].hash}\n")  # its base is not entry 3
    assert not led.verify().ok
    led.head_path.write_text(f"4 {es[3].hash}\npending 4 {es[3].hash}\n")  # pending not after base
    assert not led.verify().ok
    led.close()


def test_concurrent_appends_from_two_connections_keep_chain_and_head(tmp_path):
    ws = tmp_path / "ws"
    Ledger.open(ws).close()
    errors = []

    def writer(k):
        try:
            with Ledger.open(ws) as led:
                for i in range(15):
                    led.append("note", f"w{k}", {}, {"i": i})
                    assert led.verify().ok
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with Ledger.open(ws) as led:
        assert led.verify().ok and led.verify().entries == 30
        assert parse_head(led.head_path.read_text()).pending is None
