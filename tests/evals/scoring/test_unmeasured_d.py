"""Bar (d) on too few uses measures nothing (issue 43): a word with fewer than the protocol's
`collateral_min_uses` legitimate uses in the collateral fails both its (d) rows, labelled "not
measured (n uses < 5)", never a pass on a handful of uses and never a silent n/a; from the
minimum on, the bar is the old one. The verdict, the wfld report's JSON and its text agree."""
from __future__ import annotations

import pytest

from exactedit.evals.protocol.protocol import Bars
from exactedit.evals.scoring.bars import BarContext, anti_slop_bars, verdict
from exactedit.solvers.tail.scores import DocMeta
from tests.evals.scoring.test_bars import BARS, END, THAN, TOKENS, X, bar, make


def _collateral(n_end: int, n_than: int = 10, bars: Bars = BARS):
    docs = [DocMeta("c0", "coll", "collateral")]
    rows = [dict(tok=X, nxt=THAN, doc=0, lb=-1.0, le=-1.0) for _ in range(n_than)]
    rows += [dict(tok=X, nxt=END, doc=0, lb=-1.0, le=-1.0) for _ in range(n_end)]   # unmoved: would pass
    return anti_slop_bars(make(rows, docs), BarContext(TOKENS, bars, "dev"))


@pytest.mark.parametrize("n", [0, 1, 4])
def test_fewer_uses_than_the_minimum_fail_as_not_measured(n):
    out = _collateral(n)
    for key in (f"d_mean:{END}", f"d_low:{END}"):
        r = bar(out, key)
        assert r.passed is False and r.n == n and f"not measured ({n} uses < 5)" in r.label
    assert bar(out, f"d_mean:{THAN}").passed and bar(out, f"d_low:{THAN}").passed
    assert verdict(out) == "fail"


def test_the_minimum_itself_is_measured_and_the_protocol_sets_it():
    out = _collateral(5)
    assert bar(out, f"d_mean:{END}").passed and "not measured" not in bar(out, f"d_mean:{END}").label
    looser = Bars(bootstrap=200, collateral_min_uses=1)
    assert bar(_collateral(1, bars=looser), f"d_mean:{END}").passed
    assert Bars().collateral_min_uses == 5
    with pytest.raises(ValueError, match="collateral_min_uses"):
        Bars(collateral_min_uses=0)


def test_the_wfld_report_json_and_text_agree_on_a_word_not_measured():
    from exactedit.solvers.l47.report import bar_json

    out = _collateral(2)
    js = [bar_json(r) for r in out if r.bar == "(d)" and r.key.endswith(f":{END}")]
    assert len(js) == 2 and all(b["pass"] is False and b["n"] == 2 and "not measured (2 uses < 5)" in b["label"]
                                for b in js)
