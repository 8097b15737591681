"""Test is scored once per bundle, through the evals ledger (`evals.protocol.testonce`).

The first scoring of a bundle's test rows appends a `test` entry; its result is an evals bar
report (`evals.scoring.report.report_to_json`, so `exactedit eval test` can print it) plus this solver's
per-split numbers under "head_test". A later request for the same bundle identity, from a re-run
of the solve or from `eval test BUNDLE`, is refused by the ledger (the refusal is recorded) and
reads nothing from the test dumps: the solve then reports the recorded numbers (status
"recorded", with the entry number). Runs that ship no edit, or that got no test dump, never read
test.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from exactedit.evals.protocol import testonce as evals_testonce
from exactedit.evals.scoring.bars import BarRow, verdict
from exactedit.evals.protocol.ledger import Ledger, LedgerRefusal, ProtocolRecord
from exactedit.evals.scoring.report import BarReport, report_from_json, report_to_json
from exactedit.solvers.head.scores import SplitReport

STATUSES = ("scored", "recorded", "not given", "no edit")


@dataclass(frozen=True)
class TestOutcome:
    __test__ = False  # not a pytest class

    status: str
    ledger_entry: int | None = None
    report: SplitReport | None = None


def to_json(obj):
    """JSON-safe copy: NaN and infinities become None (the ledger refuses NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    return obj


def bars_json(bars, heldout_role: str, marker: str = "", meta=None) -> dict:
    """The bars as an evals bar report (JSON)."""
    return report_to_json(BarReport("test" if heldout_role == "test" else "score", heldout_role, tuple(bars),
                                    verdict(bars), meta=dict(meta or {}), marker=marker))


def _split_from_json(d: dict) -> SplitReport:
    def fix(v):
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        return math.nan if v is None else v
    return SplitReport.from_json({k: (v if k == "name" else fix(v)) for k, v in d.items()})


def score_head_test(ledger: Ledger, record: ProtocolRecord, command: str, test_given: bool, has_edit: bool,
                    bundle_sha: str, score_test: Callable[[], tuple[SplitReport, tuple[BarRow, ...]]],
                    dev_bars: Callable[[], tuple[BarRow, ...]]) -> tuple[TestOutcome, tuple[BarRow, ...]]:
    """(outcome, bars): the bars hold out test when test was scored (now or before), else dev.
    The ledger key is the bundle's identity (`solvers.bundle.bundle_identity`: inputs, config and
    the edit's bytes), the same key `exactedit eval test BUNDLE` uses."""
    if not test_given:
        return TestOutcome("not given"), tuple(dev_bars())
    if not has_edit:
        return TestOutcome("no edit"), tuple(dev_bars())

    def compute():
        report, bars = score_test()
        return {**bars_json(bars, "test", record.marker, {"bundle_sha256": bundle_sha}),
                "head_test": to_json(report.to_json())}

    try:
        done = evals_testonce.score_test_once(ledger, bundle_sha, record, compute, command)
        status, seq, result = "scored", done.seq, done.result
    except evals_testonce.TestClaimed:
        raise  # another run is scoring it now: nothing recorded to report
    except LedgerRefusal as refusal:
        first = evals_testonce.recorded_test(ledger, bundle_sha)
        status, seq, result = "recorded", first.seq if first else refusal.seq, refusal.recorded or {}
    bars = report_from_json(result).rows if result.get("kind") else ()
    split = _split_from_json(result["head_test"]) if "head_test" in result else None
    return TestOutcome(status, seq, split), tuple(bars)
