"""The style unit (solvers/l47/gated/style.py) on the synthetic gated world (tests/solvers/l47/synth.py:
an rmsnorm tail with Q4_K gate / up rows and a Q6_K ffn_down, chat documents whose reply starts carry
ROLE_STEP0): the gate separates the decision rows it was fitted on, the rewritten unit is ~0 off
them, the column raises the style's token there to the asked margin, the frontier is monotone in
the style's probability at the contexts, every point's KL off the decision rows is the full pass's
(the unmoved rows at 0 within MOVE_TOL), and the shipped bytes change only the unit."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.dumps import read_dump
from exactedit.dumps.format import ROLE_STEP0
from exactedit.quant import gguf
from exactedit.quant.model.specials import model_specials
from exactedit.runs.solve.wfld import gated_engine
from exactedit.solvers.l47.gated.config import DesignConfig
from exactedit.solvers.l47.gated.edit import GatedDump
from exactedit.solvers.l47.gated.ridge import MIN_COVERAGE
from exactedit.solvers.l47.gated.style import StyleInputs, decision_rows, solve_style_unit
from exactedit.solvers.tail.model import load_tail
from tests.solvers.l47.synth import build_world


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    w = build_world(tmp_path_factory.mktemp("style"), tail="gated")
    g = gguf.open(w["model"])
    tail = load_tail(g)
    x_of, quantize_row, activation, act = gated_engine(g, tail)
    down = g.tensor(tail.spec.names["ffn_down"])
    def quiet(d):
        """The world's hh is N(0, 1) everywhere: units 3-5 made silent at the reply starts (real units
        are: the removal takes one inactive there, removal.removal_candidates)."""
        A = np.array(d.hh[:, 3:6])
        A[decision_rows(d, ROLE_STEP0)] = 0.0
        return GatedDump(d, [3, 4, 5], A)
    named = {"train": [("train", quiet(read_dump(w["train"])))], "dev": [("dev", quiet(read_dump(w["heldout"])))],
             "anchors": [("anchors", quiet(read_dump(w["anchors"])))]}
    style = next(t for t in range(tail.spec.vocab) if tail.tokens.piece(t).strip() == "we")
    specials = tuple(model_specials(g, None).guards)
    inputs = StyleInputs(tail, named, ROLE_STEP0, (style,), specials, np.asarray(g.read_raw(down.name)),
                         down.type_name, int(down.cols), x_of, quantize_row, activation, grid=(0.5, 1.0, 2.0),
                         max_kl_off=1.0, design=DesignConfig(act=act), tile_rows=64)
    stages = []
    return w, g, tail, inputs, solve_style_unit(inputs, progress=stages.append), stages


def test_the_gate_and_the_unit_fire_at_the_decision_rows(solved):
    _, _, _, inputs, res, stages = solved
    s = res.summary
    assert stages[:3] == ["gate", "removal", "unit (headroom 4)"] and len(stages) == 2 + 2 * (1 + 3)
    ridge = s["ridge"]          # every ridge tried; this world's gate reaches none of dev's 4 reply starts
    assert [r["lam"] for r in ridge["table"]] == list(inputs.gate_lams)
    assert max(r["coverage"] for r in ridge["table"]) < MIN_COVERAGE
    assert ridge["by"] == "first" and ridge["lam"] == inputs.gate_lams[0] == s["gate"]["config"]["lam"]
    assert s["gate"]["fit"]["auc"] == 1.0 and s["gate"]["fit"]["gap"] > 0
    act = s["activation_fit"]
    assert act["pos_min"] > 0 and act["neg_max_abs"] < 0.05 * act["pos_min"], act
    assert s["contexts"] == sum(int(decision_rows(d, ROLE_STEP0).sum()) for r in ("train", "anchors")
                                for _, d in inputs.named[r])
    assert res.unit in s["removal"]["units"]    # one of the quiet units inactive at the decision rows


def test_the_frontier_raises_the_style_at_the_contexts(solved):
    _, _, _, _, res, _ = solved
    pts = [p for p in res.summary["frontier"] if p["headroom"] == 4.0]
    assert [p["strength"] for p in pts] == [0.5, 1.0, 2.0]
    lp = [p["column"]["style_logp"] for p in pts]
    assert all(after > before + 0.1 for before, after in lp), lp      # the style token raised at the contexts
    assert lp[0][1] < lp[1][1] < lp[2][1]                              # more with the strength
    assert all(p["kl_off"]["dev"] >= 0 and p["kl_off"]["anchors"] >= 0 for p in pts)
    assert res.passed and res.strength == res.summary["chosen"]


def test_the_kl_off_the_decision_rows_is_the_full_pass(solved):
    """The chosen point's KL off dev's decision rows against every row scored through the full
    head, the model with the unit removed as the base (style.py's frontier)."""
    from exactedit import quant
    from exactedit.solvers.l47.gated.edit import zero_column
    from exactedit.solvers.l47.jacobian import editable_weight, gather_rows, with_weights
    from exactedit.solvers.tail.moved import MOVE_TOL
    from exactedit.solvers.tail.passes.kl_pass_numba import kl_rows_numba

    _, _, tail, i, res, _ = solved
    removed = zero_column(np.asarray(i.raw0), i.type_name, i.cols, res.unit)
    t0 = with_weights(tail, quant.dequantize(removed, i.type_name, i.cols))
    t1 = with_weights(tail, quant.dequantize(res.down_raw, i.type_name, i.cols))
    d = i.named["dev"][0][1]
    gd = GatedDump(d, [res.unit], i.activation(d, res.gate_raw[0], res.up_raw[0], res.unit))
    off = np.flatnonzero(~decision_rows(d, ROLE_STEP0, i.tokens))
    rows = gather_rows([(gd, off)])
    kl = kl_rows_numba(t0.mix(t0.residual(rows)), t1.mix(t1.residual(rows)), tail.head, tile_rows=64).kl
    got = [p for p in res.summary["frontier"] if (p["strength"], p["headroom"]) == (res.strength, res.headroom)]
    got = got[0]["kl_off"]["dev"]
    assert got == pytest.approx(float(np.maximum(kl, 0).mean()), abs=MOVE_TOL + 1e-7)
    w0 = editable_weight(tail)
    w1 = quant.dequantize(res.down_raw, i.type_name, i.cols)
    keep = np.ones(w0.shape[1], bool)
    keep[res.unit] = False
    assert np.array_equal(np.asarray(w0)[:, keep], np.asarray(w1)[:, keep])    # only the unit's column


def test_a_larger_headroom_fires_the_unit_harder_and_dev_chooses(solved):
    """Each headroom is its own design of the same gate: the unit's median activation at the
    decision rows is that many times the model's scale, so the same strength needs a column that
    many times smaller (the way past ffn_down's block scales); the pick is the weakest point within
    TIE of the best dev probability among those within the KL bar."""
    from exactedit.solvers.l47.gated.style import TIE

    _, _, _, _, res, _ = solved
    s = res.summary
    assert s["headrooms"] == [4.0, 16.0]
    med = {h: s["designs"][h]["design"]["train"]["pos_median"] for h in ("4", "16")}
    assert med["16"] == pytest.approx(4 * med["4"], rel=1e-9)
    pts = s["frontier"]
    assert sorted((p["headroom"], p["strength"]) for p in pts) == [(h, st) for h in (4.0, 16.0) for st in (0.5, 1.0, 2.0)]
    ok = [p for p in pts if all(v <= 1.0 for v in p["kl_off"].values())]
    best = max(p["dev_style_prob"] for p in ok)
    near = [p for p in ok if p["dev_style_prob"] >= best - TIE]
    want = min(near, key=lambda p: (p["strength"], p["headroom"]))
    assert (res.strength, res.headroom) == (want["strength"], want["headroom"])
    assert s["design"] == s["designs"][f"{res.headroom:g}"]["design"]


def test_where_a_reply_end_style_is_decided():
    """A sign-off is decided where the reply would stop when the reply does not show it, and at its
    first token's row when it does (not at the reply-end row after it); a starter at step0; the
    protocol's decision rows (the KL bar's complement) hold both the role rows and the styled ones."""
    from types import SimpleNamespace

    from exactedit.dumps.format import ROLE_PROMPT, ROLE_REPLY, ROLE_REPLY_END
    from exactedit.solvers.l47.gated.style import deciding_rows

    P, R, E = ROLE_PROMPT, ROLE_REPLY, ROLE_REPLY | ROLE_REPLY_END
    S = 7                                             # the sign-off's first token
    # reply 1 (rows 2-6) signs off: row 4 predicts S, row 6 the turn end after it; reply 2 (rows 9-12)
    # does not: its turn-end row 12 is where it should; reply 3 (rows 15-45) holds S only 29 rows
    # before its end, beyond SIGNOFF_REACH: a word of the reply, not its sign-off
    roles = [P, P, R | ROLE_STEP0, R, R, R, E, P, P, R | ROLE_STEP0, R, R, E, P, P] + [R] * 30 + [E]
    nxt = [0] * len(roles)
    nxt[4] = S
    nxt[16] = S
    d = SimpleNamespace(roles=np.array(roles), next=np.array(nxt))
    got = deciding_rows(d, ROLE_REPLY_END, (S,))
    assert np.flatnonzero(got).tolist() == [4, 12, 45]
    assert np.flatnonzero(deciding_rows(d, ROLE_REPLY_END)).tolist() == [6, 12, 45]   # no token: the role rows
    assert np.flatnonzero(deciding_rows(d, ROLE_STEP0, (S,))).tolist() == [2, 9]
    assert np.flatnonzero(decision_rows(d, ROLE_REPLY_END, (S,))).tolist() == [4, 6, 12, 16, 45]
