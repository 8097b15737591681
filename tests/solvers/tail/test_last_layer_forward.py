"""Layer-47 tail: float32 fast path (JAX) vs the float64 numpy reference, one table.

Tolerance: the standard forward error bound of a float32 dot product of length h,
|fl(x.y) - x.y| <= gamma_h |x|.|y| with gamma_h = h*u/(1-h*u), u = 2^-24, applied to every
product in the formula, plus a few u for the elementwise gate and add. The reference gets the
same float32-rounded inputs, so the only difference is float32 arithmetic.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.strategies import U32, gamma, spread_floats

from exactedit.solvers.tail.forward.last_layer_ref import Hc4L47, RmsnormL47, hc4_l47_ref, rmsnorm_l47_ref, stream_gates
from exactedit.solvers.tail.forward.last_layer_fast import hc4_l47, rmsnorm_l47

def arrays(draw, shape, scale=None):
    """float32 values spread over several decades, with exact zeros mixed in."""
    return spread_floats(draw, shape, scale, decades=(-4, 3))


def hc4_case(draw, with_dw: bool):
    T, S, n, h = (draw(st.integers(1, 4)), draw(st.sampled_from([1, 4])),
                  draw(st.integers(1, 48)), draw(st.integers(1, 40)))
    R, inj, hh, sgv, yr = (arrays(draw, (T, S, n)), arrays(draw, (T, S), 3.0),
                           arrays(draw, (T, h)), arrays(draw, (T,), 3.0), arrays(draw, (T, n)))
    w, dW = arrays(draw, (n, h)), (arrays(draw, (n, h)) if with_dw else None)
    params = Hc4L47(w)
    ref = hc4_l47_ref(R, inj, hh, sgv, yr, params, dW)
    fast = hc4_l47(R, inj, hh, sgv, yr, params, dW)
    wabs = np.abs(w.astype(np.float64)) + (0 if dW is None else np.abs(dW.astype(np.float64)))
    prod = np.abs(hh.astype(np.float64)) @ wabs.T
    g = stream_gates(inj)
    bo_mag = np.abs(yr) + prod
    err = (gamma(h + 1) * prod + 4 * U32 * bo_mag)[:, None, :] * g[:, :, None]
    return ref, fast, err + 4 * U32 * (np.abs(R) + bo_mag[:, None, :] * g[:, :, None])


def rmsnorm_case(draw, post: bool, with_dw: bool):
    T, n, h = draw(st.integers(1, 4)), draw(st.integers(1, 48)), draw(st.integers(1, 40))
    R, hh, w = arrays(draw, (T, n)), arrays(draw, (T, h)), arrays(draw, (n, h))
    w_post = arrays(draw, (n,), 1.0) if post else None
    dW = arrays(draw, (n, h)) if with_dw else None
    params = RmsnormL47(w, w_post, 1e-6)
    ref = rmsnorm_l47_ref(R, hh, params, dW)
    fast = rmsnorm_l47(R, hh, params, dW)
    wabs = np.abs(w.astype(np.float64)) + (0 if dW is None else np.abs(dW.astype(np.float64)))
    prod = np.abs(hh.astype(np.float64)) @ wabs.T
    ffn_err = gamma(h + 1) * prod
    if post:
        # rmsnorm(y) * w_post is scale-invariant in y: the relative error of y moves through with
        # a factor <= 2 (once directly, once through the rms), plus rounding of the mean square.
        y = hh.astype(np.float64) @ (w.astype(np.float64) + (0 if dW is None else dW)).T
        rms = np.sqrt(np.mean(y * y, axis=-1, keepdims=True) + 1e-6)
        rel = ffn_err.max(axis=-1, keepdims=True) / rms
        ffn = np.abs(y) / rms * np.abs(w_post)
        ffn_err = (2 * rel + gamma(n + 8)) * (np.abs(w_post) * np.max(np.abs(y) / rms, axis=-1,
                                                                      keepdims=True) + ffn)
        prod = ffn
    return ref, fast, ffn_err + 4 * U32 * (np.abs(R) + prod)


# One table: (name, case builder, why the tolerance is what it is).
CASES = [
    ("hc4", lambda d: hc4_case(d, False), "gamma_h on W_sd @ hh, gates and add to a few u"),
    ("hc4+dW", lambda d: hc4_case(d, True), "as hc4, |W_sd| + |dW| bounds the summed weights"),
    ("rmsnorm", lambda d: rmsnorm_case(d, False, False), "gamma_h on W_down @ hh, add to u"),
    ("rmsnorm+dW", lambda d: rmsnorm_case(d, False, True), "as rmsnorm with |W| + |dW|"),
    ("rmsnorm+post", lambda d: rmsnorm_case(d, True, False),
     "post-norm: relative error of W_down @ hh at most doubled by the rms, plus gamma_n"),
]


@pytest.mark.parametrize("name,build,reason", CASES, ids=[c[0] for c in CASES])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_fast_matches_reference(name, build, reason, data):
    ref, fast, tol = build(data.draw)
    assert fast.dtype == np.float32 and fast.shape == ref.shape
    bad = np.abs(fast.astype(np.float64) - ref) > tol
    assert not bad.any(), (
        f"{name}: {bad.sum()} entries beyond tolerance ({reason}); "
        f"worst excess {np.max(np.abs(fast - ref) - tol):.3g}")


def test_gates_and_shared_gate_enter_as_specified():
    """A hand-sized case: one row, one stream, W_sd = I."""
    R = np.zeros((1, 1, 2)); yr = np.array([[1.0, -2.0]]); hh = np.array([[3.0, 4.0]])
    out = hc4_l47_ref(R, np.array([[0.0]]), hh, np.array([0.0]), yr, Hc4L47(np.eye(2)))
    # sigmoid(0) = 1/2 for the shared gate, 2*sigmoid(0) = 1 for the stream gate.
    np.testing.assert_allclose(out, [[[1.0 + 1.5, -2.0 + 2.0]]])


def test_delta_is_linear_in_dW():
    """R'(dW) - R'(0) = g_tc * s_t * (dW @ hh_t): the linear map the WFLD solver relies on."""
    rng = np.random.default_rng(0)
    T, S, n, h = 3, 4, 8, 5
    R, inj, hh = rng.standard_normal((T, S, n)), rng.standard_normal((T, S)), rng.standard_normal((T, h))
    sgv, yr, w, dW = rng.standard_normal(T), rng.standard_normal((T, n)), rng.standard_normal((n, h)), rng.standard_normal((n, h))
    diff = hc4_l47_ref(R, inj, hh, sgv, yr, Hc4L47(w), dW) - hc4_l47_ref(R, inj, hh, sgv, yr, Hc4L47(w))
    s = 1 / (1 + np.exp(-sgv))
    expect = stream_gates(inj)[:, :, None] * (s[:, None] * (hh @ dW.T))[:, None, :]
    np.testing.assert_allclose(diff, expect, rtol=1e-12, atol=1e-12)
