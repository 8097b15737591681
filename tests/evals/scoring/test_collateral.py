"""Bar (d) use by use: which uses, their base p and change, the likely/rare counts."""
from __future__ import annotations

import math

import pytest

from exactedit.evals.scoring.collateral import collateral_lines, collateral_uses
from exactedit.solvers.tail.scores import DocMeta

from tests.evals.scoring.test_bars import END, RATHER, THAN, TO, TOKENS, X, make

VOCAB = ("end", " to", " rather", " than", "owo", "<im_end>", "<think>", " x", " y")


def test_uses_worst_first_with_base_p_and_domain():
    docs = [DocMeta("c0", "coll", "collateral", tags=("chat",)), DocMeta("c1", "coll", "collateral", tags=("plain",)),
            DocMeta("t0", "train", "train")]
    rows = [dict(tok=X, nxt=THAN, doc=0, lb=math.log(0.6), le=math.log(0.6) - 0.02),   # likely, kept
            dict(tok=X, nxt=THAN, doc=0, lb=math.log(0.5), le=math.log(0.5) - 0.30),   # likely, lost
            dict(tok=X, nxt=X, doc=1),
            dict(tok=X, nxt=THAN, doc=1, lb=math.log(0.01), le=math.log(0.01) - 0.40),  # rare, drifted
            dict(tok=RATHER, nxt=THAN, doc=1, lb=math.log(0.9), le=math.log(0.1)),      # a slop position: not a use
            dict(tok=X, nxt=THAN, doc=2, lb=math.log(0.5), le=math.log(0.1)),           # train: not collateral
            dict(tok=X, nxt=END, doc=0)]
    s = make(rows, docs)
    t = collateral_uses(s, TOKENS.phrases, (THAN, END, TO), lambda w: repr(VOCAB[w]), VOCAB)
    than = t[0]
    assert [round(u["dlogp"], 6) for u in than["uses"]] == [-0.4, -0.3, -0.02]
    assert [u["chat"] for u in than["uses"]] == [False, True, True]
    assert [u["row"] for u in than["uses"]] == [1, 1, 0]             # within its document
    assert than["uses"][0]["p_base"] == pytest.approx(0.01, abs=1e-12)
    assert than["uses"][0]["context"] == " x x"                      # its document's tokens up to the row
    assert than["by_base_p"]["likely"] == {"uses": 2, "low": 1, "low_chat": 1, "mean_dlogp": pytest.approx(-0.16)}
    assert than["by_base_p"]["rare"]["uses"] == 1 and than["by_base_p"]["rare"]["low_chat"] == 0
    assert [len(x["uses"]) for x in t] == [3, 1, 0]  # END's one use (unchanged), TO never the next token
    text = "\n".join(collateral_lines(t))
    assert "' than': 3 uses; below -0.1: 1 of 2 with base p >= 0.2, 1 of 1 rarer (0 of those in chat)" in text
