"""The rewritten unit (solvers/l47/gated/design.py) on the planted set: it fires only on positives
(train and held-out rows), its activation is the reference unit's, the leak bound holds on any row
below the threshold (hypothesis), the median positive activation is the target, and the
comparison up row (the positives' mean) is built and reported; the errors name the field."""
from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactedit.solvers.l47.gated import (DesignConfig, GatedError, activation_ratio, design_unit, fit_gate,
                                         leak_bound, unit_ref)
from tests.solvers.l47.gated.synth import planted


@pytest.fixture(scope="module")
def fitted():
    x, y, _, _ = planted(0)
    return x, y, fit_gate(x, y)


def test_the_unit_fires_only_on_positives(fitted):
    x, y, gate = fitted
    unit = design_unit(gate, x, y)
    a = unit.activation(x)
    np.testing.assert_array_equal(a, unit_ref(x, unit.g_row, unit.u_row))
    assert np.all(a >= 0)                                   # up = gate: one sign everywhere
    r = unit.train
    assert abs(r.pos_median - 1.0) < 1e-12 and r.pos_min > 0
    assert r.ratio < 1e-2 and r.ratio <= unit.leak_bound and r.neg_above_pos_p10 == 0.0
    assert unit.leak_bound == pytest.approx(0.00754675, rel=1e-5)
    # held-out rows of the same world: the unit still fires only on positives
    xh, yh, _, _ = planted(7)
    held = activation_ratio(unit.activation(xh), yh)
    assert held.ratio < 1e-2 and held.pos_min > 0.2
    assert unit.summary()["train"]["n_pos"] == int(y.sum())


@cache
def _small(world: int):
    x, y, _, _ = planted(world, rows=240)
    return x, y, fit_gate(x, y)


@settings(max_examples=60, deadline=None)
@given(st.floats(1.0, 30.0), st.integers(0, 2**32 - 1), st.floats(-50.0, 0.0), st.sampled_from(["silu", "gelu"]))
def test_leak_bound_holds_on_any_row_below_the_threshold(kappa, seed, depth, act):
    x, y, gate = _small(seed % 3)
    unit = design_unit(gate, x, y, DesignConfig(kappa=kappa, act=act))
    rng = np.random.default_rng(seed)
    d = gate.g / gate.norm
    rows = rng.normal(size=(50, x.shape[1])) * rng.uniform(0.1, 10.0)
    rows -= np.outer(rows @ d, d)                          # onto the threshold ...
    rows += np.outer(rng.uniform(depth, 0.0, 50), d)       # ... and below it, anywhere
    a_neg = np.abs(unit.activation(rows)).max()
    assert a_neg <= unit.leak_bound * unit.train.pos_min * (1 + 1e-9)
    assert unit.leak_bound == pytest.approx(leak_bound(kappa, act))


def test_the_mean_positive_up_row_is_reported_beside(fitted):
    x, y, gate = fitted
    unit = design_unit(gate, x, y, DesignConfig(up="mean_positive", target=2.0))
    assert unit.leak_bound is None and abs(unit.train.pos_median - 2.0) < 1e-12
    assert unit.train.ratio < 1e-2
    np.testing.assert_allclose(unit.u_row / np.linalg.norm(unit.u_row),
                               x[y].mean(0) / np.linalg.norm(x[y].mean(0)))
    np.testing.assert_allclose(unit.g_row, design_unit(gate, x, y).g_row)   # the same gate row


def test_activation_ratio_by_hand():
    a = np.array([0.0, -0.2, 0.1, 1.0, 2.0, 3.0])
    r = activation_ratio(a, np.array([0, 0, 0, 1, 1, 1], dtype=bool))
    assert (r.pos_min, r.neg_max_abs, r.neg_min, r.ratio) == (1.0, 0.2, -0.2, 0.2)
    assert r.pos_median == 2.0 and r.n_pos == 3 and r.n_neg == 3 and r.neg_above_pos_p10 == 0.0


def test_errors_name_the_field(fitted):
    x, y, gate = fitted
    with pytest.raises(GatedError, match="gate: affine"):
        design_unit(fit_gate(x, y, affine=True), x, y)
    flipped = fit_gate(x, ~y)
    with pytest.raises(GatedError, match="gate: margin_pos_min"):
        design_unit(flipped, x, y)
    with pytest.raises(GatedError, match="x: shape"):
        design_unit(gate, x[:, :3], y)
    with pytest.raises(GatedError, match="DesignConfig: up"):
        DesignConfig(up="mean")
