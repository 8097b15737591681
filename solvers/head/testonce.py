"""Test is scored once per bundle, through the evals ledger (`evals.testonce`).

The first scoring of a bundle's test rows appends a `test` entry holding the numbers; a later
request for the same bundle identity is refused by the ledger (the refusal is recorded), reads
nothing from the test dumps, and the solve reports the recorded numbers instead (status
"recorded", with the entry number). Runs that ship no edit, or that were given no test dump, never
read test.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from evals import testonce as evals_testonce
from evals.bars import BarRow
from evals.ledger import Ledger, LedgerRefusal, ProtocolRecord
from solvers.head.scores import SplitReport

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


def _nan(x):
    return float("nan") if x is None else x


def bar_to_json(b: BarRow) -> dict:
    return to_json(dict(b.__dict__))


def bar_from_json(d: dict) -> BarRow:
    floats = ("number", "threshold", "base", "edited")
    kw = {k: (_nan(v) if k in floats else v) for k, v in d.items()}
    kw["ci"] = tuple(_nan(x) for x in d.get("ci", (None, None)))
    return BarRow(**kw)


def report_from_json(d: dict) -> SplitReport:
    def fix(v):
        return {k: fix(x) for k, x in v.items()} if isinstance(v, dict) else _nan(v)
    return SplitReport.from_json({k: (fix(v) if k != "name" else v) for k, v in d.items()})


def score_test_once(ledger: Ledger, record: ProtocolRecord, command: str, test_given: bool, has_edit: bool,
                    bundle_sha: str, score_test: Callable[[], tuple[SplitReport, tuple[BarRow, ...]]],
                    dev_bars: Callable[[], tuple[BarRow, ...]]) -> tuple[TestOutcome, tuple[BarRow, ...]]:
    """(outcome, bars): the bars hold out test when test was scored (now or before), else dev.
    The ledger key is the bundle's identity (`solvers.bundle.bundle_identity`: inputs, config and
    the edit's bytes), the same key `exactedit eval test BUNDLE` uses: re-running the same solve, or
    scoring its bundle's test split later, never reads the test rows a second time."""
    if not test_given:
        return TestOutcome("not given"), tuple(dev_bars())
    if not has_edit:
        return TestOutcome("no edit"), tuple(dev_bars())

    def compute():
        report, bars = score_test()
        return {"report": to_json(report.to_json()), "bars": [bar_to_json(b) for b in bars]}

    try:
        done = evals_testonce.score_test_once(ledger, bundle_sha, record, compute, command)
        status, seq, result = "scored", done.seq, done.result
    except LedgerRefusal as refusal:
        first = evals_testonce.recorded_test(ledger, bundle_sha)
        status, seq, result = "recorded", first.seq if first else refusal.seq, refusal.recorded or {}
    bars = tuple(bar_from_json(b) for b in result.get("bars", []))
    return TestOutcome(status, seq, report_from_json(result["report"])), bars
