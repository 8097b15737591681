"""The gate (solvers/l47/gated/gate.py): the loss's gradient against finite differences, the fit on
a planted through-origin-separable set (positive margins, deterministic, scale-free), the
out-of-fold margins through the origin beside affine ones (both separate with a common component;
without it only the affine one does; a set with no signal gives a negative margin), the folds
(whole documents, positives spread), the AUC against a pairwise count, and the errors."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactedit.solvers.l47.gated import GateConfig, GatedError, fit_gate, gate_loss, oof_margins
from exactedit.solvers.l47.gated.gate import auc, group_folds
from tests.solvers.l47.gated.synth import planted


@settings(max_examples=80, deadline=None)
@given(st.integers(3, 30), st.integers(1, 6), st.booleans(), st.floats(0.1, 3.0), st.floats(1e-4, 1.0),
       st.integers(0, 2**32 - 1))
def test_gate_loss_gradient_matches_finite_differences(t, n, bias, margin, ridge, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(t, n + bias)) * rng.uniform(0.1, 3.0)
    if bias:
        x[:, -1] = 1.5
    y = np.arange(t) % 3 == 0
    w, d = rng.normal(size=n + bias), rng.normal(size=n + bias)
    _, grad = gate_loss(w, x, y, margin=margin, ridge=ridge, bias=bias)
    eps = 1e-6
    fd = (gate_loss(w + eps * d, x, y, margin=margin, ridge=ridge, bias=bias)[0]
          - gate_loss(w - eps * d, x, y, margin=margin, ridge=ridge, bias=bias)[0]) / (2 * eps)
    # squared hinge: C^1, its second derivative jumps at a kink, so the central difference is
    # O(eps) there (not O(eps^2)); the scale is that of the terms differenced
    scale = 1.0 + np.sum(np.abs(x @ d)) * (margin + np.max(np.abs(x @ w))) + ridge * np.abs(w) @ np.abs(d)
    assert abs(fd - grad @ d) <= 1e-6 * scale


def test_ridge_leaves_the_bias_free():
    x = np.array([[1.0, 2.0], [3.0, 2.0]])
    _, g = gate_loss(np.array([0.5, 7.0]), x, np.array([True, False]), margin=1.0, ridge=10.0, bias=True)
    _, g0 = gate_loss(np.array([0.5, 7.0]), x, np.array([True, False]), margin=1.0, ridge=0.0, bias=True)
    assert g[1] == g0[1] and g[0] == g0[0] + 2 * 10.0 * 0.5


def test_a_planted_direction_gives_positive_margins_through_the_origin():
    x, y, _, d = planted(0)
    gate = fit_gate(x, y)
    assert gate.converged and not gate.affine and gate.bias == 0.0
    assert gate.margin_pos_min > 0 > gate.margin_neg_max and gate.auc == 1.0 and gate.fit.separated
    assert gate.fit.neg_above_zero == 0.0
    # the gate lies mostly along the planted direction and the common one (which acts as its bias)
    cos = abs(gate.g @ d) / gate.norm
    assert cos > 0.5
    again = fit_gate(x, y)
    assert np.array_equal(gate.g, again.g)                    # deterministic
    scaled = fit_gate(3.0 * x, y)                              # scale-free: g / 3, the same scores
    np.testing.assert_allclose(scaled.g * 3.0, gate.g, rtol=1e-4, atol=1e-6 * gate.norm)
    np.testing.assert_allclose(gate.scores(x), x @ gate.g)


def test_oof_through_the_origin_beside_affine():
    x, y, groups, _ = planted(1)
    origin, affine = oof_margins(x, y, groups), oof_margins(x, y, groups, affine=True)
    for m in (origin, affine):
        assert m.oof.separated and m.oof.gap > 0 and m.oof.auc == 1.0
        assert m.scores.shape == (x.shape[0],) and m.summary()["folds"] == 5
    assert not origin.affine and affine.affine
    # no common component: the threshold (between -0.5 .. 2 on d) is away from the origin and only
    # the affine gate puts it there
    x2, y2, g2, _ = planted(2, common=0.0, neg=(-2.0, 1.0))
    origin, affine = oof_margins(x2, y2, g2), oof_margins(x2, y2, g2, affine=True)
    assert affine.oof.separated and affine.oof.gap > 0
    assert not origin.oof.separated and origin.oof.neg_above_zero > 0.1


def test_oof_on_a_set_without_signal_reports_a_negative_margin():
    x, y, groups, _ = planted(3, pos=(-3.0, 1.0), neg=(-3.0, 1.0))
    for affine in (False, True):
        m = oof_margins(x, y, groups, folds=4, affine=affine)
        assert m.oof.gap < 0 and m.oof.pos_min < m.oof.neg_max and not m.oof.separated
        assert m.oof.auc < 0.8


def test_folds_hold_whole_groups_and_spread_the_positives():
    x, y, groups, _ = planted(4, doc=100, every=150)
    fold = group_folds(groups, y, 5)
    for g in np.unique(groups):
        assert np.unique(fold[groups == g]).size == 1
    pos_folds = np.unique(fold[y])
    assert pos_folds.size == min(5, np.unique(groups[y]).size)
    assert np.array_equal(fold, group_folds(groups, y, 5))


def test_auc_against_pairs():
    rng = np.random.default_rng(5)
    s = np.round(rng.normal(size=60), 1)                       # ties
    y = rng.random(60) < 0.3
    pairs = [(a > b) + 0.5 * (a == b) for a in s[y] for b in s[~y]]
    assert abs(auc(s, y) - np.mean(pairs)) < 1e-12


def test_errors_name_the_field():
    x, y, groups, _ = planted(0, rows=200)
    with pytest.raises(GatedError, match="y: classes"):
        fit_gate(x, np.zeros(200, bool))
    with pytest.raises(GatedError, match="y: shape"):
        fit_gate(x, y[:10])
    with pytest.raises(GatedError, match="oof: folds"):
        oof_margins(x, y, groups, folds=1)
    with pytest.raises(GatedError, match="groups: positives"):
        oof_margins(x, y, np.where(y, 0, 1 + np.arange(200) % 3), folds=3)
    with pytest.raises(GatedError, match="GateConfig: margin"):
        GateConfig(margin=0.0)
    with pytest.raises(GatedError, match="x: values"):
        fit_gate(np.zeros((4, 3)), np.array([1, 0, 0, 0]))


@settings(max_examples=25, deadline=None)
@given(st.integers(20, 120), st.integers(2, 12), st.booleans(), st.floats(0.3, 3.0), st.floats(1e-4, 1e-1),
       st.integers(0, 2**32 - 1))
def test_newton_reaches_the_minimizer_lbfgs_approaches(t, n, affine, margin, lam, seed):
    """The finite Newton fit against scipy's L-BFGS-B on the same strictly convex L (gate_loss, run
    to its own tolerance): the same minimizer, a loss no larger, and a zero gradient there."""
    from scipy.optimize import minimize

    from exactedit.solvers.l47.gated.gate import _newton

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(t, n)) * rng.uniform(0.2, 4.0)
    y = rng.random(t) < 0.3
    y[:2] = [True, False]
    x[y] += rng.normal(size=n)                                      # some signal, rarely separable
    if affine:
        x = np.hstack([x, np.full((t, 1), 2.0)])
    ridge = np.full(x.shape[1], lam)
    if affine:
        ridge[-1] = 0.0
    w, loss, _, converged, msg = _newton(x, y, margin, ridge, 500, 1e-12)
    assert converged, msg
    ref = minimize(lambda v: gate_loss(v, x, y, margin=margin, ridge=lam, bias=affine), np.zeros(x.shape[1]),
                   jac=True, method="L-BFGS-B", options={"maxiter": 20000, "gtol": 1e-13, "ftol": 0.0})
    f, g = gate_loss(w, x, y, margin=margin, ridge=lam, bias=affine)
    assert math.isclose(f, loss, rel_tol=1e-12, abs_tol=1e-15)
    assert np.max(np.abs(g)) <= 1e-9 * (1.0 + np.max(np.abs(x)))
    assert f <= ref.fun + 1e-12 * (1.0 + abs(ref.fun))
    # strictly convex (ridge on g; with the bias, both classes present): one minimizer
    np.testing.assert_allclose(w, ref.x, rtol=0, atol=1e-5 * (1.0 + np.max(np.abs(w))))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.one_of(st.just(0.0), st.floats(1e-3, 2.0)), st.integers(0, 2**32 - 1))
def test_line_minimum_against_a_dense_scan(t, dd, seed):
    """`_line_min`'s t against phi evaluated on a fine grid and refined by a bounded scalar search.
    dd (the ridge along the step) is 0 or of the ridge's size: a dd of 1e-282 puts the exact
    minimum at 1e281, where phi itself overflows."""
    from scipy.optimize import minimize_scalar

    from exactedit.solvers.l47.gated.gate import _line_min

    rng = np.random.default_rng(seed)
    r, c = rng.normal(size=t), rng.normal(size=t)
    c[rng.random(t) < 0.1] = 0.0
    r[rng.random(t) < 0.1] = 0.0
    weight = rng.uniform(0.1, 1.0, size=t)
    wd = float(rng.normal()) - 1.0
    phi = lambda s: float(np.sum(weight * np.maximum(0.0, r + s * c) ** 2) + 2 * s * wd + s * s * dd)  # noqa: E731
    slope0 = 2 * (np.sum(weight * np.maximum(0.0, r) * c) + wd)
    tstar = _line_min(r, c, weight, wd, dd)
    if slope0 >= 0:                       # no descent at t = 0: nothing to gain for t > 0
        assert tstar == 0.0 or phi(tstar) <= phi(0.0) + 1e-12
        return
    grid = np.linspace(0.0, 50.0, 20001)
    k = int(np.argmin([phi(s) for s in grid]))
    best = minimize_scalar(phi, bounds=(grid[max(k - 1, 0)], grid[min(k + 1, grid.size - 1)]), method="bounded",
                           options={"xatol": 1e-12})
    if grid[k] >= 49.9:                   # phi unbounded below or its minimum past the scan: only check descent
        assert phi(tstar) <= phi(0.0)
        return
    assert phi(tstar) <= best.fun + 1e-9 * (1.0 + abs(best.fun))
