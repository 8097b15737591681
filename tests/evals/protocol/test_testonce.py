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
