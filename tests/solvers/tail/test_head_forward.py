"""Head: float32 fast paths (JAX mix, Sgemm logits) vs the float64 numpy reference, one table.

Tolerances are first-order float32 error bounds (u = 2^-24, gamma_k = k u / (1 - k u) for a
length-k dot product), propagated through the head with the derivative bounds of each step:
rms scale (relative error <= gamma_{n+8}), silu' in [-0.1, 1.1], sigmoid' <= 1/4. The
reference gets the same float32-rounded inputs, so only float32 arithmetic differs; a factor
2 covers second-order terms.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.strategies import U32, gamma, spread_floats

from exactedit.solvers.tail.forward.head_ref import (HC_LO_DIVISOR, HC_MIX_SCALE, Hc4Head, RmsnormHead, hc4_mix_ref,
                                  logits_ref, rmsnorm_mix_ref)
from exactedit.solvers.tail.forward.head_fast import Sgemm, hc4_mix, rmsnorm_mix
from exactedit.solvers.tail.passes.vocab_pass import ArrayRows

arrays = spread_floats


def hc4_bound(Rp, head: Hc4Head) -> np.ndarray:
    """First-order bound on |mix_fast - mix_ref| for the hc4 mix."""
    Rp = Rp.astype(np.float64)
    T, S, n = Rp.shape
    d_lo = head.w_odown.shape[0]
    down, up = np.abs(head.w_odown.astype(np.float64)), np.abs(head.w_oup.astype(np.float64))
    xn = np.abs(Rp * head.w_onorm / np.sqrt(np.mean(Rp * Rp, -1, keepdims=True) + head.eps))
    e_xn = gamma(n + 8) * xn
    e_z = (gamma(S * n) * (xn.reshape(T, -1) @ down.T) + e_xn.reshape(T, -1) @ down.T) / HC_LO_DIVISOR
    z = np.abs(xn.reshape(T, -1) @ down.T) / HC_LO_DIVISOR
    e_lo = 1.1 * e_z + 2 * U32 * z
    lo = z * 1.1
    e_gate = (gamma(d_lo) * (lo @ up.T) + e_lo @ up.T) / 4 + 2 * U32
    e_gate = e_gate.reshape(T, S, n)
    return 2 * HC_MIX_SCALE * np.sum(e_xn + xn * e_gate + gamma(S + 2) * xn, axis=1)


def hc4_case(draw):
    T, S, n, d_lo = (draw(st.integers(1, 4)), draw(st.sampled_from([1, 4])),
                     draw(st.integers(1, 40)), draw(st.integers(1, 12)))
    Rp = arrays(draw, (T, S, n))
    head = Hc4Head(arrays(draw, (S, n), 1.0), arrays(draw, (d_lo, S * n), 0.3),
                   arrays(draw, (S * n, d_lo), 0.3))
    return hc4_mix_ref(Rp, head), hc4_mix(Rp, head), hc4_bound(Rp, head)


def rmsnorm_case(draw):
    T, n = draw(st.integers(1, 4)), draw(st.integers(1, 48))
    Rp, w = arrays(draw, (T, n)), arrays(draw, (n,), 1.0)
    head = RmsnormHead(w, draw(st.sampled_from([1e-6, 1e-5])))
    ref = rmsnorm_mix_ref(Rp, head)
    return ref, rmsnorm_mix(Rp, head), 2 * gamma(n + 8) * np.abs(ref)


def logits_case(draw):
    T, n, V = draw(st.integers(1, 5)), draw(st.integers(1, 64)), draw(st.integers(1, 300))
    mix, W = arrays(draw, (T, n)), arrays(draw, (V, n))
    softcap = draw(st.sampled_from([None, 30.0]))
    ref = logits_ref(mix, W, softcap)
    src = ArrayRows(W)
    from exactedit.solvers.tail.forward.head_ref import apply_softcap
    fast = apply_softcap(Sgemm().tile(Sgemm().prepare(mix), src, 0, V), softcap)
    bound = gamma(n) * (np.abs(mix.astype(np.float64)) @ np.abs(W.astype(np.float64)).T)
    return ref, fast, bound + 4 * U32 * np.abs(ref)  # tanh: |d/dx c tanh(x/c)| <= 1, plus rounding


# One table: (name, case builder, why the tolerance is what it is).
CASES = [
    ("hc4_mix", hc4_case, "first-order float32 bound through rms, W_odown, silu, W_oup, sigmoid"),
    ("rmsnorm_mix", rmsnorm_case, "relative gamma_{n+8}: mean of n squares, rsqrt, two products"),
    ("logits_sgemm", logits_case, "gamma_n |mix|.|W| for a length-n float32 dot product"),
]


@pytest.mark.parametrize("name,build,reason", CASES, ids=[c[0] for c in CASES])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_fast_matches_reference(name, build, reason, data):
    ref, fast, tol = build(data.draw)
    assert fast.dtype == np.float32 and fast.shape == ref.shape
    excess = np.abs(fast.astype(np.float64) - ref) - tol
    assert not (excess > 0).any(), (
        f"{name}: {(excess > 0).sum()} entries beyond tolerance ({reason}); worst {excess.max():.3g}")


def test_hc4_mix_hand_case():
    """One stream, n = 2, zero down/up weights: lo = 0, gates = 1/2, mix = xn / 8."""
    Rp = np.array([[[3.0, 4.0]]])
    head = Hc4Head(np.ones((1, 2)), np.zeros((1, 2)), np.zeros((2, 1)), eps=0.0)
    rms = np.sqrt((9 + 16) / 2)
    np.testing.assert_allclose(hc4_mix_ref(Rp, head), [[3 / rms / 8, 4 / rms / 8]], rtol=1e-15)


def test_hc4_mix_uses_only_listed_down_rows():
    """Rows of W_odown beyond d_lo are not part of the output read: the caller passes 0..d_lo-1."""
    rng = np.random.default_rng(1)
    Rp = rng.standard_normal((2, 4, 6))
    up = rng.standard_normal((24, 3))
    down = rng.standard_normal((5, 24))
    head = Hc4Head(rng.standard_normal((4, 6)), down[:3], up)
    assert hc4_mix_ref(Rp, head).shape == (2, 6)
    with pytest.raises(ValueError):
        hc4_mix_ref(Rp, Hc4Head(head.w_onorm, down, up))
