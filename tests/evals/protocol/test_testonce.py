"""Test once: the first scoring is recorded, a second request is refused and returns the first."""
from __future__ import annotations

import pytest

from exactedit.evals.protocol.ledger import Ledger, LedgerRefusal, register_protocol
from exactedit.evals.protocol.protocol import load_protocol
from exactedit.evals.protocol.testonce import recorded_test, score_test_once


def test_second_test_read_is_refused_without_recomputing(tmp_path, protocol_file):
    calls = []

    def compute():
        calls.append(1)
        return {"verdict": "pass", "number": 0.71}

    with Ledger.open(tmp_path / "ws") as led:
        rec = register_protocol(led, load_protocol(protocol_file), "eval register")
        first = score_test_once(led, "b" * 64, rec, compute, "eval test")
        assert first.result == {"verdict": "pass", "number": 0.71} and calls == [1]
        with pytest.raises(LedgerRefusal) as err:
            score_test_once(led, "b" * 64, rec, compute, "eval test")
        assert calls == [1]  # not recomputed
        assert err.value.recorded == first.result and "read once" in str(err.value)
        assert led.entries("refusal")[-1].seq == err.value.seq
        assert recorded_test(led, "b" * 64).seq == first.seq
        other = score_test_once(led, "c" * 64, rec, compute, "eval test")  # another bundle: its own first read
        assert other.seq > first.seq and calls == [1, 1]
        assert led.verify().ok


def test_a_failed_compute_records_nothing(tmp_path, protocol_file):
    with Ledger.open(tmp_path / "ws") as led:
        rec = register_protocol(led, load_protocol(protocol_file), "eval register")

        def boom():
            raise RuntimeError("forward failed")

        with pytest.raises(RuntimeError):
            score_test_once(led, "b" * 64, rec, boom, "eval test")
        assert recorded_test(led, "b" * 64) is None


# ---- claims: two runs at once, a crashed run's claim ---------------------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

from exactedit.evals.protocol.testonce import RELEASE_FLAG, TestClaimed, open_claim  # noqa: E402


def test_two_concurrent_runs_one_computes_the_other_is_refused(tmp_path, protocol_file):
    ws = tmp_path / "ws"
    with Ledger.open(ws) as led:
        rec = register_protocol(led, load_protocol(protocol_file), "eval register")
    computing, finish, calls, out = threading.Event(), threading.Event(), [], {}

    def compute():
        calls.append(1)
        computing.set()
        assert finish.wait(30)
        return {"verdict": "pass"}

    def first_run():
        with Ledger.open(ws) as led:
            out["first"] = score_test_once(led, "b" * 64, rec, compute, "eval test")

    t = threading.Thread(target=first_run)
    t.start()
    assert computing.wait(30)
    with Ledger.open(ws) as led, pytest.raises(TestClaimed) as err:  # while the first computes
        score_test_once(led, "b" * 64, rec, compute, "eval test")
    finish.set()
    t.join()
    assert calls == [1] and out["first"].result == {"verdict": "pass"}
    assert err.value.claim == out["first"].seq - 2 and RELEASE_FLAG in str(err.value)  # claim, refusal, test
    with Ledger.open(ws) as led:
        assert led.verify().ok and open_claim(led, "b" * 64) is None
        with pytest.raises(LedgerRefusal) as again:
            score_test_once(led, "b" * 64, rec, compute, "eval test")
        assert again.value.recorded == {"verdict": "pass"} and calls == [1]


def _stale_claim(led, rec, pid):
    led.append("test-claim", "eval test", {"bundle": "b" * 64},
               {"bundle_sha256": "b" * 64, "protocol_sha256": rec.sha256, "pid": pid,
                "host": __import__("socket").gethostname(), "time": "2000-01-01T00:00:00+00:00"})


def test_a_crashed_runs_claim_is_released_by_the_flag_and_recorded(tmp_path, protocol_file):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with Ledger.open(tmp_path / "ws") as led:
        rec = register_protocol(led, load_protocol(protocol_file), "eval register")
        _stale_claim(led, rec, int(gone.stdout))
        with pytest.raises(TestClaimed, match="crashed or was killed, rerun with --release-stale-claim"):
            score_test_once(led, "b" * 64, rec, lambda: {"n": 1}, "eval test")
        done = score_test_once(led, "b" * 64, rec, lambda: {"n": 1}, "eval test", release_stale=True)
        assert done.result == {"n": 1}
        release = led.entries("test-release")[-1]
        assert "released as stale" in release.payload["reason"] and led.verify().ok


def test_the_flag_does_not_release_a_claim_whose_run_is_alive(tmp_path, protocol_file):
    import os

    with Ledger.open(tmp_path / "ws") as led:
        rec = register_protocol(led, load_protocol(protocol_file), "eval register")
        _stale_claim(led, rec, os.getpid())
        with pytest.raises(TestClaimed, match="still running"):
            score_test_once(led, "b" * 64, rec, lambda: {"n": 1}, "eval test", release_stale=True)
        assert not led.entries("test-release") and open_claim(led, "b" * 64) is not None


def test_a_failed_compute_releases_its_claim(tmp_path, protocol_file):
    with Ledger.open(tmp_path / "ws") as led:
        rec = register_protocol(led, load_protocol(protocol_file), "eval register")
        with pytest.raises(RuntimeError):
            score_test_once(led, "b" * 64, rec, lambda: (_ for _ in ()).throw(RuntimeError("oom")), "eval test")
        assert "RuntimeError: oom" in led.entries("test-release")[-1].payload["reason"]
        assert score_test_once(led, "b" * 64, rec, lambda: {"n": 2}, "eval test").result == {"n": 2}
