"""The one-shot blind sign-off: refusals (second run, wrong bundle, unrecorded dev report, used
document), the claim-before-compute rule, and the within-1.5x comparison."""
from __future__ import annotations

import json
import math

import pytest

from exactedit.evals.scoring.bars import BarRow, PhraseRow
from exactedit.runs.eval.blind import compare_to_dev, run_blind
from exactedit.evals.protocol.ledger import Ledger, LedgerRefusal, register_protocol
from exactedit.evals.protocol.protocol import load_protocol
from exactedit.evals.protocol.registry import BlindRegistry, exactedit_home
from exactedit.evals.scoring.report import BarReport

BUNDLE, OTHER_BUNDLE = "b" * 64, "e" * 64
DOC, DOC2, TRAIN_DUMP, BLIND_TRACE = "d" * 64, "f" * 64, "1" * 64, "9" * 64
DEV_SHA = "7" * 64


def report(red, flips, kld, ordinary, kind="score", role="dev"):
    rows = (BarRow("c_reduction", "(c)", "", red, 0.5, ">=", red >= 0.5, 21),
            BarRow("f_flips", "(f)", "", flips, 0, "<=", flips <= 0, 1000),
            BarRow("g_kld", "(g)", "", kld, 0.005, "<=", kld <= 0.005, 1000),
            BarRow("g_ordinary", "(g)", "", ordinary, -0.01, ">=", ordinary >= -0.01, 900))
    phrases = (PhraseRow(0, (1, 2, 3), 3, 0.98, 0.26, " end to end"), PhraseRow(1, (4, 5), 0, math.nan, math.nan))
    return BarReport(kind, role, rows, "pass", phrases)


DEV = report(0.70, 0, 0.0047, 0.021)


def open_workspace(ws, protocol_file):
    led = Ledger.open(ws)
    p = load_protocol(protocol_file)
    hashes = {"chat": TRAIN_DUMP, "anchors": "2" * 64, "blind": BLIND_TRACE}
    rec = register_protocol(led, p, "eval register", hashes)
    led.append("score", "eval score", {"protocol": p.sha256, "dump:chat": TRAIN_DUMP, "dump:extra": "3" * 64,
                                       "report": DEV_SHA},
               {"report_sha256": DEV_SHA, "bundle_sha256": BUNDLE, "protocol_sha256": p.sha256,
                "heldout_role": "dev"})
    led.record = rec
    return led


@pytest.fixture
def ledger(tmp_path, protocol_file):
    with open_workspace(tmp_path / "ws", protocol_file) as led:
        yield led


def run(ledger, tmp_path, blind=report(0.60, 0, 0.0030, 0.012), **kw):
    with BlindRegistry.open() as registry:  # the test's own EXACTEDIT_HOME (tests/conftest.py)
        args = dict(record=ledger.record, bundle_sha256=BUNDLE, doc_sha256=DOC, dev_report=DEV,
                    dev_report_sha256=DEV_SHA, compute=lambda: blind, out_dir=tmp_path / "signoff",
                    command="eval blind", registry=registry)
        args.update(kw)
        return run_blind(ledger, **args)


def test_pass_writes_and_records(ledger, tmp_path):
    res = run(ledger, tmp_path)
    assert res.passed and all(c.passed for c in res.comparisons)
    assert set(res.files.paths) == {"json", "md", "png"}
    md = res.files.paths["md"].read_text()
    assert "Sign-off: **PASS**" in md and "end to end" in md
    assert json.loads(res.files.paths["json"].read_text())["meta"]["signoff"] == "pass"
    assert res.files.paths["png"].read_bytes()[:4] == b"\x89PNG"
    kinds = [e.kind for e in ledger.entries()]
    assert kinds[-2:] == ["blind", "blind-result"] and ledger.verify().ok
    assert ledger.entries("blind-result")[0].inputs["out:md"] == res.files.sha256["md"]


def test_second_blind_run_is_refused(ledger, tmp_path):
    run(ledger, tmp_path)
    with pytest.raises(LedgerRefusal, match="already had its blind run"):
        run(ledger, tmp_path)  # same document, same bundle
    with pytest.raises(LedgerRefusal, match="bundle .* already had its blind run"):
        run(ledger, tmp_path, doc_sha256=DOC2)  # a new document does not buy a second run of the bundle
    assert len(ledger.entries("refusal")) == 2 and len(ledger.entries("blind")) == 1


def test_wrong_bundle_hash_is_refused(ledger, tmp_path):
    with pytest.raises(LedgerRefusal, match="not the registered one"):
        run(ledger, tmp_path, bundle_sha256=OTHER_BUNDLE)
    assert not ledger.entries("blind")


def test_unrecorded_dev_report_is_refused(ledger, tmp_path):
    with pytest.raises(LedgerRefusal, match="not written by a recorded"):
        run(ledger, tmp_path, dev_report_sha256="0" * 64)


@pytest.mark.parametrize("doc, why", [("3" * 64, "already used by a score run"), (TRAIN_DUMP, "'chat' \\(pool\\)"),
                                      ("2" * 64, "anchors")])
def test_used_document_is_refused(ledger, tmp_path, doc, why):
    with pytest.raises(LedgerRefusal, match=why):
        run(ledger, tmp_path, doc_sha256=doc)


def test_registered_blind_trace_is_allowed(ledger, tmp_path):
    assert run(ledger, tmp_path, doc_sha256=BLIND_TRACE).passed


def test_interrupted_run_still_counts(ledger, tmp_path):
    def boom():
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        run(ledger, tmp_path, compute=boom)
    with pytest.raises(LedgerRefusal, match="already had its blind run"):
        run(ledger, tmp_path)


def test_fail_outside_the_factor(ledger, tmp_path):
    res = run(ledger, tmp_path, blind=report(0.54, 2, 0.0030, 0.012))  # the seed's blind numbers
    assert not res.passed
    by = {c.metric.split()[0]: c for c in res.comparisons}
    assert not by["slop"].passed and by["slop"].allowed == pytest.approx(1.5 * 0.30)
    assert not by["(f)"].passed and by["(g)"].passed
    assert "Sign-off: **FAIL**" in res.files.paths["md"].read_text()


@pytest.mark.parametrize("blind, ok", [
    (report(0.70, 0, 0.00705, 0.0), [True, True, True, True]),      # KLD at 1.5x dev: inside
    (report(0.70, 0, 0.0071, -0.0316), [True, True, False, False]),  # KLD and ordinary loss past 1.5x
    (report(0.70, 1, 0.001, 0.5), [True, False, True, True]),        # a flip where dev had none
])
def test_compare_to_dev(blind, ok):
    assert [c.passed for c in compare_to_dev(DEV, blind, 1.5)] == ok


def test_dev_report_without_slop_positions_fails_cleanly(ledger, tmp_path):
    """A dev report whose (c) is n/a (no slop in dev): the run completes, fails, and records JSON."""
    na = BarRow("c_reduction", "(c)", "", math.nan, 0.5, ">=", None, 0)
    na_dev = BarReport("score", "dev", (na,) + DEV.rows[1:], "incomplete")
    res = run(ledger, tmp_path, dev_report=na_dev)
    assert not res.passed and not res.comparisons[0].passed and all(c.passed for c in res.comparisons[1:])
    rec = ledger.entries("blind-result")[0].payload
    assert rec["comparisons"][0]["dev"] is None and ledger.verify().ok


def test_missing_numbers_fail():
    na = BarReport("blind", "blind", (BarRow("c_reduction", "(c)", "", math.nan, 0.5, ">=", None, 0),), "incomplete")
    assert not any(c.passed for c in compare_to_dev(DEV, na, 1.5))


def test_a_fresh_workspace_does_not_buy_a_second_run(ledger, tmp_path, protocol_file):
    """One-shot across workspaces: the user-level registry refuses the same document or bundle
    from another workspace, and the refusal is recorded in that workspace's ledger and the registry."""
    first = run(ledger, tmp_path)
    with open_workspace(tmp_path / "fresh", protocol_file) as fresh:
        with pytest.raises(LedgerRefusal, match=f"document {DOC} already had its blind run "
                                                r"\(registry run 1, .*ledger .*ws/ledger.sqlite\)"):
            run(fresh, tmp_path)
        with pytest.raises(LedgerRefusal, match=f"bundle {BUNDLE} already had its blind run"):
            run(fresh, tmp_path, doc_sha256=DOC2)
        assert not fresh.entries("blind") and len(fresh.entries("refusal")) == 2
    with BlindRegistry.open() as reg:
        assert [(r.bundle_sha256, r.doc_sha256) for r in reg.runs()] == [(BUNDLE, DOC)]
        kinds = [e["kind"] for e in reg.events()]
        assert kinds == ["ledger-claim", "result", "refused", "refused"]
        claim = reg.claims_of(str((tmp_path / "ws" / "ledger.sqlite").resolve()))[0]
        assert (claim.seq, claim.hash) == (first.claim_seq, ledger.entries("blind")[0].hash)
        with pytest.raises(Exception, match="append-only"):
            reg._conn.execute("DELETE FROM runs")


def test_the_registry_lives_in_exactedit_home(monkeypatch, tmp_path):
    monkeypatch.setenv("EXACTEDIT_HOME", str(tmp_path / "h"))
    assert exactedit_home() == tmp_path / "h"
    monkeypatch.delenv("EXACTEDIT_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    import sys

    if sys.platform.startswith("linux"):
        assert exactedit_home() == tmp_path / "data" / "exactedit"
