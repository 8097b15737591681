"""The strength frontier along a line (solvers/tail/passes/line_pass.py, its scorer made by
solvers/l47/frontier.py `line_scorer`): its log-probabilities against the direct path
(`frontier._logp`: the residual, the norm and a full-vocabulary pass at the summed edit) and the
float64 reference forward, on a plain RMSNorm tail (the synthetic "gated" world's); a coordinate
search costs one head pass a step; the dense solve's frontier and choice through it are the
direct path's."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from exactedit.quant import gguf
from exactedit.solvers.l47 import frontier as fr_mod
from exactedit.solvers.tail.passes import line_pass as line_mod
from exactedit.solvers.l47.jacobian import gather_rows
from exactedit.solvers.tail.passes.line_pass import LINE_TOL, LineScorer, line_ready, plan, span_logp
from exactedit.solvers.l47.frontier import line_scorer
from exactedit.solvers.tail.model import load_tail
from exactedit.dumps import read_dump
from tests.solvers.l47.synth import build_world

P = 5


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    root = tmp_path_factory.mktemp("line")
    w = build_world(root, tail="gated")
    g = gguf.open(w["model"])
    tail = load_tail(g)
    dump = read_dump(w["train"])
    rows = gather_rows([(dump, np.arange(0, min(120, len(dump.next)), dtype=np.int64))])
    token = np.asarray(dump.next, np.int64)[:rows.rows]
    token = np.where(token < 0, 0, token)
    rng = np.random.default_rng(7)
    w0 = np.asarray(tail.l47.w_down, np.float64)
    parts = rng.normal(size=(P,) + w0.shape) * 0.3 * np.abs(w0).mean()
    return dict(w=w, g=g, tail=tail, rows=rows, token=token, parts=parts)


def _direct(tail, rows, token, parts, sv):
    dW = np.tensordot(np.asarray(sv, np.float64), parts, axes=1)
    return fr_mod._logp(tail, rows, token, dW if np.any(sv) else None, 64)


def _reference(tail, rows, token, parts, sv):
    dW = np.tensordot(np.asarray(sv, np.float64), parts, axes=1)
    mix = np.asarray(tail.mix(tail.residual(rows, None, dW, reference=True), reference=True), np.float64)
    lg = mix @ np.asarray(tail.head.read(0, tail.head.rows), np.float64).T
    m = lg.max(1, keepdims=True)
    lse = np.log(np.exp(lg - m).sum(1)) + m[:, 0]
    return lg[np.arange(len(token)), token] - lse


def test_a_coordinate_search_is_the_direct_path_at_one_pass_a_step(plain):
    tail, rows, token, parts = plain["tail"], plain["rows"], plain["token"], plain["parts"]
    assert line_ready(tail)
    sc = line_scorer(tail, parts, rows, token, tile_rows=64)
    assert sc.passes == 1
    np.testing.assert_allclose(sc.base, _direct(tail, rows, token, parts, (0,) * P), atol=LINE_TOL, rtol=0)
    grid = (0.2, 0.5, 1.0)
    shared = [(g,) * P for g in grid]                      # the search's start: one line from the base
    got = sc.logp(shared)
    assert sc.passes == 2
    best = shared[1]
    steps = []
    for ph in range(P):                                    # each step: one phrase along its axis from the best
        combos = [best[:ph] + (g,) + best[ph + 1:] for g in grid if g != best[ph]]
        before = sc.passes
        lp = sc.logp(combos)
        assert sc.passes == before + 1, ph
        steps.append((combos, lp))
        best = combos[-1] if ph % 2 else best              # the anchor moves along the line, or stays
    for sv, lp in zip(shared, got):
        ref, direct = _reference(tail, rows, token, parts, sv), _direct(tail, rows, token, parts, sv)
        assert np.abs(direct - ref).max() < LINE_TOL
        np.testing.assert_allclose(lp, direct, atol=LINE_TOL, rtol=0)
    for combos, lp in steps:
        for sv, x in zip(combos, lp):
            np.testing.assert_allclose(x, _direct(tail, rows, token, parts, sv), atol=LINE_TOL, rtol=0)
            np.testing.assert_allclose(x, _reference(tail, rows, token, parts, sv), atol=LINE_TOL, rtol=0)


def test_a_small_grid_is_a_plane_and_anything_else_a_point_at_a_time(plain):
    tail, rows, token, parts = plain["tail"], plain["rows"], plain["token"], plain["parts"]
    sc = line_scorer(tail, parts[:2], rows, token, tile_rows=64)
    combos = [(a, b) for a in (0.5, 1.0) for b in (0.5, 1.0)]
    lp = sc.logp(combos)
    assert sc.passes == 3                                  # the base, then one product per phrase moved
    for sv, x in zip(combos, lp):
        np.testing.assert_allclose(x, _direct(tail, rows, token, parts[:2], sv), atol=LINE_TOL, rtol=0)
    sc = line_scorer(tail, parts, rows, token, tile_rows=64)
    scattered = [(1.0, 0.2, 0.5, 0.3, 0.1), (0.1, 0.9, 0.4, 0.2, 0.7), (0.3, 0.3, 0.6, 0.8, 0.2)]
    lp = sc.logp(scattered)                                # 5 axes, not one line
    for sv, x in zip(scattered, lp):
        np.testing.assert_allclose(x, _direct(tail, rows, token, parts, sv), atol=LINE_TOL, rtol=0)


def test_a_capped_start_is_two_lines(plain):
    """The search's shared strengths with one phrase capped (a word not measured on dev): one line
    from the base up to the cap, a second from the cap's point on: a pass each."""
    tail, rows, token, parts = plain["tail"], plain["rows"], plain["token"], plain["parts"]
    sc = line_scorer(tail, parts, rows, token, tile_rows=64)
    combos = [(g,) * (P - 1) + (min(g, 0.3),) for g in (0.2, 0.3, 0.45, 0.6, 1.0)]
    lp = sc.logp(combos)
    assert sc.passes == 3
    for sv, x in zip(combos, lp):
        np.testing.assert_allclose(x, _direct(tail, rows, token, parts, sv), atol=LINE_TOL, rtol=0)


def test_unformed_parts_score_as_the_formed_ones(plain):
    """`PartFactors` (dW_p = (U lam_p)^T G never formed) give the formed parts' values, and their
    `dense()` is the edits themselves."""
    from exactedit.solvers.l47.gauss_newton import PartFactors

    tail, rows, token = plain["tail"], plain["rows"], plain["token"]
    n, h = np.asarray(tail.l47.w_down).shape
    rng = np.random.default_rng(11)
    K = 9
    f = PartFactors(rng.normal(size=(K, n)), rng.normal(size=(K, 3)), rng.normal(size=(K, h)) * 1e-3)
    dense = f.dense()
    np.testing.assert_allclose(dense[1], (f.U * f.lam[:, 1][:, None]).T @ f.G, rtol=1e-12, atol=0)
    a = line_scorer(tail, f, rows, token, tile_rows=64)
    b = line_scorer(tail, dense, rows, token, tile_rows=64)
    combos = [(0.5, 0.5, 0.5), (1.0, 1.0, 1.0)]
    np.testing.assert_allclose(a.logp(combos), b.logp(combos), atol=1e-6, rtol=0)
    steps = [(0.5, 0.2, 0.5), (0.5, 0.8, 0.5)]
    np.testing.assert_allclose(a.logp(steps), b.logp(steps), atol=1e-6, rtol=0)
    for sv, x in zip(steps, a.logp(steps)):
        np.testing.assert_allclose(x, _direct(tail, rows, token, dense, sv), atol=LINE_TOL, rtol=0)


def test_rows_in_chunks_give_the_same_values(plain):
    """Too little room to keep the anchor's product: the rows go in chunks, each line two passes."""
    tail, rows, token, parts = plain["tail"], plain["rows"], plain["token"], plain["parts"]
    V = tail.head.rows
    whole = line_scorer(tail, parts, rows, token, tile_rows=64)
    tight = line_scorer(tail, parts, rows, token, tile_rows=64, max_elems=V * 50)
    assert not tight.keep
    combos = [(g,) * P for g in (0.3, 0.7)]
    # the same products but for the sgemm's rounding, which depends on a row's place in the product
    # (OpenBLAS 0.3.x, solvers/tail/passes/kl_pass_numba.py): float32 logits, ~1e-7 nats
    np.testing.assert_allclose(tight.base, whole.base, atol=1e-5, rtol=0)
    np.testing.assert_allclose(whole.logp(combos), tight.logp(combos), atol=1e-5, rtol=0)


def test_the_head_is_kept_only_when_small(plain):
    """A head within the budget is dequantized once and kept; a larger one streams on every pass;
    both give the same products, the float64 reference's within float32 rounding."""
    tail = plain["tail"]
    X = np.random.default_rng(1).normal(size=(7, tail.head.cols)).astype(np.float32)
    kept, streamed = line_mod.HeadTiles(tail, 64), line_mod.HeadTiles(tail, 64, keep_bytes=0)
    assert kept.keep and not streamed.keep
    a = line_mod.head_products(kept, X)
    assert kept._kept is not None and len(kept._kept) == -(-tail.head.rows // 64)
    np.testing.assert_array_equal(line_mod.head_products(kept, X), a)
    np.testing.assert_array_equal(line_mod.head_products(streamed, X), a)
    assert streamed._kept is None
    ref = X.astype(np.float64) @ np.asarray(tail.head.read(0, tail.head.rows), np.float64).T
    np.testing.assert_allclose(a, ref, rtol=0, atol=1e-4 * np.abs(ref).max())


def test_other_tails_are_refused(tmp_path):
    w = build_world(tmp_path, tail="post")
    tail = load_tail(gguf.open(w["model"]))
    assert not line_ready(tail)
    with pytest.raises(ValueError, match="post-FFN norm"):
        LineScorer(tail, None, 1, None, np.zeros(0, np.int64))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.data())
@example(3, 4, None)
def test_plan_rebuilds_the_differences(P_, B, data):
    if data is None:
        diffs = np.array([[0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [-0.25, -0.25, -0.25], [0, 0, 0]], float)
    else:
        vals = st.sampled_from([0.0, 0.0, 0.1, 0.2, 0.5, -0.3, 1.0])
        diffs = np.array(data.draw(st.lists(st.lists(vals, min_size=P_, max_size=P_), min_size=B, max_size=B)))
    got = plan(diffs)
    axes = int((np.abs(diffs).max(axis=0) > 0).sum())
    if got is None:
        assert axes > line_mod.MAX_SPAN
        return
    dirs, coef = got
    np.testing.assert_allclose(coef @ dirs, diffs, atol=1e-12, rtol=0)
    assert len(dirs) <= max(line_mod.MAX_SPAN, 1)


@pytest.mark.parametrize("cap", [None, 7.5])
def test_the_fold_is_a_float64_log_softmax(cap):
    rng = np.random.default_rng(3)
    T, V, K = 9, 301, 2
    Ua = rng.normal(size=(T, V)).astype(np.float32) * 8
    Us = rng.normal(size=(K, T, V)).astype(np.float32) * 3
    c = np.array([0.4, -1.3])
    y = rng.normal(size=(T, 16))
    tok = rng.integers(0, V, T)
    got = span_logp(Ua, Us, c, y, 1e-6, cap, tok)
    r = np.sqrt(np.mean(y * y, axis=1) + 1e-6)
    lg = (Ua.astype(np.float64) + np.tensordot(c, Us.astype(np.float64), axes=1)) / r[:, None]
    if cap is not None:
        lg = cap * np.tanh(lg / cap)
    ref = lg[np.arange(T), tok] - np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1)) - lg.max(1)
    np.testing.assert_allclose(got, ref, atol=1e-10, rtol=0)


def test_the_dense_solve_chooses_the_same_through_lines(tmp_path, monkeypatch):
    """`solve wfld` (dense) on the plain tail, its strength searched by coordinates: the frontier and
    the choice through lines are the direct path's (within LINE_TOL in each cut and mean)."""
    from exactedit.runs.solve.wfld import WfldInputs, solve_wfld
    from exactedit.solvers.l47.config import WfldConfig

    (tmp_path / "w").mkdir()
    w = build_world(tmp_path / "w", tail="gated")
    cfg = WfldConfig(gn_iters=1, special_rows=48, tile_rows=64, strength_grid=(1.0, 0.6, 0.3, 0.1), word_holds=4,
                     key_floor=0.01, unmeasured_strength=1.0)
    inputs = WfldInputs(str(w["model"]), str(w["phrases"]), (str(w["train"]),), (str(w["heldout"]),),
                        (str(w["collateral"]),), (str(w["anchors"]),))
    monkeypatch.setattr(fr_mod, "GRID_LIMIT", 8)           # 4^3 = 64 combinations: the coordinate search
    lines = solve_wfld(cfg, inputs, tmp_path / "lines").report["strength"]
    monkeypatch.setattr(fr_mod, "line_ready", lambda tail: False)
    direct = solve_wfld(cfg, inputs, tmp_path / "direct").report["strength"]
    assert lines["search"]["kind"] == "coordinate" and lines["search"] == direct["search"]
    assert lines["chosen"] == direct["chosen"]
    assert len(lines["frontier"]) == len(direct["frontier"])
    for a, b in zip(lines["frontier"] + lines.get("collateral_frontier", []),
                    direct["frontier"] + direct.get("collateral_frontier", [])):
        assert a["strength"] == b["strength"]
        for ph in b["cut"]:
            assert a["cut"][ph] == pytest.approx(b["cut"][ph], abs=LINE_TOL)
        for wd in b["collateral"]:
            assert a["collateral"][wd]["mean"] == pytest.approx(b["collateral"][wd]["mean"], abs=LINE_TOL)
