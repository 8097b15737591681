"""The gated unit's float64 reference (solvers/l47/gated/unit.py): its gradient in the gate row and
the up row against central finite differences along random directions, the per-row gradient
(cot = e_t) against the closed form, and the constant behind the design's leak bound."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar
from scipy.special import expit

from exactedit.solvers.l47.gated import GatedError, unit_grad, unit_ref
from exactedit.solvers.l47.gated.unit import NEG_BOUND, SILU_NEG_BOUND, act_fn, act_grad, gelu, silu, silu_grad
from exactedit.solvers.tail.forward.ffn_ops import gelu_ref
from tests.strategies import spread_floats

bounded = st.floats(-2.0, 2.0, allow_nan=False, allow_infinity=False)


@st.composite
def unit_case(draw):
    t, n = draw(st.integers(1, 12)), draw(st.integers(1, 8))
    x = spread_floats(draw, (t, n), decades=(-1, 1)).astype(np.float64)
    g = np.array(draw(st.lists(bounded, min_size=n, max_size=n)))
    u = np.array(draw(st.lists(bounded, min_size=n, max_size=n)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return x, g, u, rng.standard_normal(t), rng.standard_normal(n), rng.standard_normal(n)


@settings(max_examples=200, deadline=None)
@given(unit_case(), st.sampled_from(["silu", "gelu"]))
def test_unit_grad_matches_finite_differences(case, act):
    x, g, u, cot, dg, du = case
    f = lambda gg, uu: float(cot @ unit_ref(x, gg, uu, act))  # noqa: E731
    grad_g, grad_u = unit_grad(x, g, u, cot, act)
    for which, d, an in (("g", dg, grad_g), ("u", du, grad_u)):
        eps = 1e-6
        if which == "g":
            fd = (f(g + eps * d, u) - f(g - eps * d, u)) / (2 * eps)
        else:
            fd = (f(g, u + eps * d) - f(g, u - eps * d)) / (2 * eps)
        z, v = x @ g, x @ u
        # the size of the terms summed (rounding of f over 2 eps, truncation of the central difference)
        scale = np.sum(np.abs(cot) * (np.abs(x @ d) * (np.abs(v) + np.abs(z)) + np.abs(act_fn(act)(z) * v)))
        assert abs(fd - an @ d) <= 1e-7 * (1.0 + scale), (which, fd, an @ d)


@settings(max_examples=50, deadline=None)
@given(unit_case(), st.sampled_from(["silu", "gelu"]))
def test_per_row_gradients_are_the_closed_form(case, act):
    x, g, u, _, _, _ = case
    z, v = x @ g, x @ u
    for t in range(x.shape[0]):
        e = np.zeros(x.shape[0])
        e[t] = 1.0
        gg, gu = unit_grad(x, g, u, e, act)
        np.testing.assert_allclose(gg, act_grad(act)(z[t]) * v[t] * x[t], rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(gu, act_fn(act)(z[t]) * x[t], rtol=1e-12, atol=1e-300)


@settings(max_examples=100, deadline=None)
@given(st.floats(-12.0, 12.0))
def test_gelu_derivative_by_finite_differences_and_the_engines_formula(z):
    h = 1e-6
    fd = (gelu(z + h) - gelu(z - h)) / (2 * h)
    assert abs(fd - act_grad("gelu")(z)) <= 1e-7 * (1 + abs(z) ** 3)
    assert gelu(z) == pytest.approx(float(gelu_ref(z)), rel=1e-7, abs=1e-12)


def test_silu_and_its_derivative_at_extremes():
    z = np.array([-1e4, -50.0, 0.0, 50.0, 1e4])
    assert np.all(np.isfinite(silu(z))) and np.all(np.isfinite(silu_grad(z)))
    assert silu(-1e4) == 0.0 and silu(1e4) == 1e4 and silu_grad(1e4) == 1.0 and silu_grad(0.0) == 0.5


def test_the_leak_constant_is_the_max_of_z2_sigma_on_the_negative_side():
    res = minimize_scalar(lambda z: -(z * z * expit(z)), bounds=(-20.0, 0.0), method="bounded",
                          options={"xatol": 1e-12})
    assert abs(-res.fun - SILU_NEG_BOUND) < 1e-12
    z = np.linspace(-60.0, 0.0, 200001)
    assert np.max(z * z * expit(z)) <= SILU_NEG_BOUND


def test_the_gelu_leak_constant_is_the_max_of_z_gelu_on_the_negative_side():
    res = minimize_scalar(lambda z: -(z * gelu(z)), bounds=(-10.0, 0.0), method="bounded", options={"xatol": 1e-12})
    assert abs(-res.fun - NEG_BOUND["gelu"]) < 1e-9
    z = np.linspace(-60.0, 0.0, 200001)
    assert np.max(z * gelu(z)) <= NEG_BOUND["gelu"] * (1 + 1e-12)


def test_bad_shapes_name_the_field():
    x = np.ones((3, 4))
    with pytest.raises(GatedError, match="g: shape"):
        unit_ref(x, np.ones(3), np.ones(4))
    with pytest.raises(GatedError, match="cot: shape"):
        unit_grad(x, np.ones(4), np.ones(4), np.ones(2))
    with pytest.raises(GatedError, match="x: values"):
        unit_ref(np.full((2, 4), np.nan), np.ones(4), np.ones(4))
