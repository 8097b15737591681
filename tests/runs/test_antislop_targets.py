"""The antislop report's bar lines and targets: a bar with no rows to stand on (Gemma's held-out
replies, all cut at --max-new, hold no turn end) reads n/a, not FAIL, and the bars' target names it
as not measured; a failed bar still reads FAIL."""
from __future__ import annotations

from exactedit.runs.antislop.report import _status, demo_targets


def _bar(name: str, passed):
    return {"bar": "(f)", "name": name, "label": name, "value": None if passed is None else 0.0, "op": "<=",
            "threshold": 0.0, "pass": passed}


def test_a_bar_without_rows_is_na_and_named_so():
    bars = [_bar("turn ends lost", None), _bar("argmax flips to specials", True), _bar("turn-end dlogp", False)]
    assert [_status(b["pass"]) for b in bars] == ["n/a", "pass", "FAIL"]
    t = next(x for x in demo_targets({}, [], bars, True, {}, {}) if x["name"] == "bars (a)-(g)")
    assert t["value"] == "1/3 pass" and t["pass"] is False
    assert t["failed"] == ["(f) turn ends lost (n/a: no rows to stand on)", "(f) turn-end dlogp"]
