"""The bound on how far a down-projection edit moves a row's logits (solvers/tail/moved.py): never
below the change a float64 forward measures (hypothesis, with a softcap and with Gemma's post-FFN
norm, edits from 1e-9 to 1 of the weights' scale), and the frontier's and the KL bar's scoring with
the unmoved rows at their base values against the full pass on every row."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactedit.solvers.l47.jacobian import RowSet
from exactedit.solvers.tail.forward.head_ref import RmsnormHead
from exactedit.solvers.tail.forward.last_layer_ref import RmsnormL47
from exactedit.solvers.tail.model import RmsnormTail
from exactedit.solvers.tail.moved import MOVE_TOL, head_norm, logit_bound
from exactedit.solvers.tail.passes.vocab_pass import ArrayRows


def _case(seed, *, softcap=None, post=False, T=12, n=32, h=16, V=40):
    rng = np.random.default_rng(seed)
    w_down = (0.1 * rng.standard_normal((n, h))).astype(np.float32)
    w_post = (1 + 0.5 * rng.standard_normal(n)).astype(np.float32) if post else None
    tail = RmsnormTail(None, "mem", RmsnormL47(w_down, w_post, 1e-6),
                       RmsnormHead(1 + 0.1 * rng.standard_normal(n), 1e-6, softcap),
                       ArrayRows(rng.standard_normal((V, n))), None)
    rows = RowSet(rng.standard_normal((T, n)).astype(np.float32), rng.standard_normal((T, h)).astype(np.float32))
    return tail, rows


def _norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps) * w


def _logits64(tail, rows, dW=None):
    """The tail's math in float64 at W + dW (the bound's own statement)."""
    W = np.asarray(tail.l47.w_down, np.float64) + (0.0 if dW is None else dW)
    hh, R = np.asarray(rows.hh, np.float64), np.asarray(rows.R, np.float64)
    F = hh @ W.T
    eps = float(tail.l47.eps)
    y = R + (F if tail.l47.w_post is None else _norm(F, np.asarray(tail.l47.w_post, np.float64), eps))
    mp = tail.mix_params
    z = _norm(y, np.asarray(mp.w_norm, np.float64), float(mp.eps)) @ np.asarray(tail.head.read(0, tail.head.rows),
                                                                                 np.float64).T
    return z if mp.softcap is None else mp.softcap * np.tanh(z / mp.softcap)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([None, 4.0]), st.booleans(), st.integers(1, 4),
       st.floats(-9, 0))
def test_the_bound_holds_against_a_float64_forward(seed, softcap, post, k, log_scale):
    tail, rows = _case(seed, softcap=softcap, post=post)
    rng = np.random.default_rng(seed + 1)
    dW = np.zeros(tail.l47.w_down.shape)
    cols = rng.choice(dW.shape[1], size=k, replace=False)
    dW[:, cols] = rng.standard_normal((dW.shape[0], k)) * 0.1 * 10.0 ** log_scale
    B = logit_bound(tail, rows, dW)
    moved = np.max(np.abs(_logits64(tail, rows, dW) - _logits64(tail, rows)), axis=1)
    assert np.all(moved <= B * (1 + 1e-9) + 1e-12), (moved / B).max()
    assert np.all(np.isfinite(B[np.abs(np.asarray(rows.hh, np.float64)[:, cols]).sum(1) * 10.0 ** log_scale < 1e-3]))


def test_the_head_norm_and_the_zero_edit():
    tail, rows = _case(3)
    H = np.asarray(tail.head.read(0, tail.head.rows), np.float64) * np.asarray(tail.mix_params.w_norm, np.float64)
    assert head_norm(tail) == pytest.approx(float(np.max(np.linalg.norm(H, axis=1))), rel=1e-12)
    assert np.all(logit_bound(tail, rows, np.zeros(tail.l47.w_down.shape)) == 0.0)


def _gated_world(seed=5, T=60):
    """A unit (column 3) ~0 on most rows, as a rewritten gated unit is: its edit moves only the
    rows where it fires."""
    tail, rows = _case(seed, T=T, V=300)
    hh = np.array(rows.hh)
    hh[:, 3] = 0.0
    hh[::7, 3] = 2.0                    # the contexts
    hh[1::7, 3] = 1e-13                 # leaks far below a float32 logit's rounding
    rows = RowSet(rows.R, hh)
    dW = np.zeros(tail.l47.w_down.shape)
    dW[:, 3] = 0.5 * np.random.default_rng(seed).standard_normal(dW.shape[0])
    return tail, rows, dW


def test_the_frontier_scores_only_the_moved_rows_and_matches_the_full_pass():
    from exactedit.solvers.l47 import frontier as fr_mod

    tail, rows, dW = _gated_world()
    T = rows.hh.shape[0]
    tok = np.arange(T, dtype=np.int64) % 300
    fr = fr_mod.FrontierRows(rows, tok, 10, np.zeros(10, np.int64), np.zeros(T - 10, np.int64))
    base = fr_mod.frontier_base(tail, fr, tile_rows=64)
    lp, scored = fr_mod.edited_logp(tail, fr, base, dW, tile_rows=64)
    full = fr_mod._logp(tail, fr.rows, fr.token, dW, 64)
    fires = np.asarray(rows.hh)[:, 3] > 1.0
    assert scored == int(fires.sum()) < T
    np.testing.assert_array_equal(lp[~fires], base.logp[~fires])
    np.testing.assert_allclose(lp, full, atol=MOVE_TOL + 1e-5)     # float32 rounding of the two passes
    assert np.abs(lp - base.logp)[fires].max() > 1e-2


def test_the_kl_bar_counts_unmoved_rows_as_zero_and_matches_the_full_pass():
    from exactedit.solvers.l47.gated.down import mean_kl, with_memo
    from exactedit.solvers.tail.passes.kl_pass_numba import kl_rows_numba

    tail, rows, dW = _gated_world()
    bar = with_memo(tail, rows, 64)
    kl, scored = mean_kl(tail, bar, dW, 64)
    full = kl_rows_numba(tail.mix(bar.y), tail.mix(tail.residual(rows, None, dW)), tail.head, tile_rows=64).kl
    assert scored == int((np.asarray(rows.hh)[:, 3] > 1.0).sum())
    assert kl == pytest.approx(float(np.maximum(full, 0).mean()), abs=MOVE_TOL + 1e-7) and kl > 1e-4


def test_a_dense_edit_is_not_bounded():
    from exactedit.solvers.tail import moved

    tail, rows = _case(2, h=moved.MAX_COLUMNS + 1)
    dW = np.full(tail.l47.w_down.shape, 1e-12)
    assert np.all(np.isinf(logit_bound(tail, rows, dW)))
    dW[:, 1:] = 0.0
    assert np.all(np.isfinite(logit_bound(tail, rows, dW)))


def test_the_memo_reuses_a_scored_point_and_stays_within_its_tolerance():
    """Two units, each firing on its own rows: scoring (unit a at s, unit b at t) and then (a at s,
    b at t') recomputes only b's rows, and every value stays within MOVE_TOL of the full pass."""
    from exactedit.solvers.l47 import frontier as fr_mod

    tail, rows = _case(8, T=70, V=300)
    hh = np.array(rows.hh)
    hh[:, [3, 4]] = 0.0
    hh[::7, 3] = 2.0
    hh[3::7, 4] = 2.0
    rows = RowSet(rows.R, hh)
    rng = np.random.default_rng(1)
    col_a, col_b = rng.standard_normal((2, tail.l47.w_down.shape[0])) * 0.5

    def edit(s, t):
        dW = np.zeros(tail.l47.w_down.shape)
        dW[:, 3], dW[:, 4] = s * col_a, t * col_b
        return dW
    T = hh.shape[0]
    fr = fr_mod.FrontierRows(rows, np.arange(T, dtype=np.int64) % 300, 0, np.zeros(0, np.int64), np.zeros(T, np.int64))
    base = fr_mod.frontier_base(tail, fr, tile_rows=64)
    first, n1 = fr_mod.edited_logp(tail, fr, base, edit(1.0, 1.0), tile_rows=64)
    second, n2 = fr_mod.edited_logp(tail, fr, base, edit(1.0, 2.0), tile_rows=64)
    assert n1 == int(((hh[:, 3] > 0) | (hh[:, 4] > 0)).sum()) and n2 == int((hh[:, 4] > 0).sum())
    for got, dW in ((first, edit(1.0, 1.0)), (second, edit(1.0, 2.0))):
        np.testing.assert_allclose(got, fr_mod._logp(tail, fr.rows, fr.token, dW, 64), atol=MOVE_TOL + 1e-5)
    np.testing.assert_array_equal(second[hh[:, 3] > 0], first[hh[:, 3] > 0])     # a's rows carried over


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([None, 4.0]), st.floats(-5, -1))
def test_the_kl_from_the_base_is_within_half_the_squared_bound(seed, softcap, log_scale):
    """KL(p || p') <= B^2 / 2 (Hoeffding's lemma on the logit change d in [-B, B], a range of 2B)
    against the float64 forward, edits from 1e-5 to 0.1 of the weights' scale."""
    tail, rows = _case(seed, softcap=softcap)
    dW = np.zeros(tail.l47.w_down.shape)
    dW[:, 2] = np.random.default_rng(seed).standard_normal(dW.shape[0]) * 0.1 * 10.0 ** log_scale
    B = logit_bound(tail, rows, dW)
    z0, z1 = _logits64(tail, rows), _logits64(tail, rows, dW)
    lp0 = z0 - np.logaddexp.reduce(z0, axis=1, keepdims=True)
    lp1 = z1 - np.logaddexp.reduce(z1, axis=1, keepdims=True)
    kl = np.sum(np.exp(lp0) * (lp0 - lp1), axis=1)
    assert np.all(kl <= 0.5 * B * B * (1 + 1e-9) + 1e-15), (kl / (0.5 * B * B)).max()


def test_the_kl_bar_skips_rows_moved_below_the_square_root_of_the_tolerance():
    from exactedit.solvers.l47.gated.down import mean_kl, with_memo
    from exactedit.solvers.tail.passes.kl_pass_numba import kl_rows_numba

    tail, rows, dW = _gated_world()
    hh = np.array(rows.hh)
    hh[1::7, 3] = 1e-6                  # leaks whose logit move is ~1e-5: KL ~1e-10, not scored
    rows = RowSet(rows.R, hh)
    bar = with_memo(tail, rows, 64)
    kl, scored = mean_kl(tail, bar, dW, 64)
    B = logit_bound(tail, rows, dW)
    assert np.all(B[1::7] > MOVE_TOL) and scored == int((hh[:, 3] > 1.0).sum())
    full = kl_rows_numba(tail.mix(bar.y), tail.mix(tail.residual(rows, None, dW)), tail.head, tile_rows=64).kl
    assert kl == pytest.approx(float(np.maximum(full, 0).mean()), abs=MOVE_TOL + 1e-7)
