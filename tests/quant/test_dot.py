"""ggml kernel models in quant/: fma32 and the Q6_K x Q8_K dot, numpy reference == numba fast path,
bit for bit (the live tests in tests/native compare both with llama.cpp itself)."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit import quant
from exactedit.quant.dots.fma32 import fma32, fma32_ref
from exactedit.quant.dots.q6_k_dot import q6_k_matmul, q6_k_matmul_ref


def _fma_cases():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(4000).astype(np.float32)
    b = rng.standard_normal(4000).astype(np.float32)
    c = rng.standard_normal(4000).astype(np.float32)
    # products that nearly cancel c, and sums landing on float32 midpoints
    c2 = (-(a.astype(np.float64) * b)).astype(np.float32)
    one, half_ulp = np.float32(1), np.float32(2.0 ** -24)
    a3 = np.full(8, one + np.float32(2.0 ** -23), np.float32)
    b3 = np.full(8, one + np.float32(2.0 ** -23), np.float32)   # a*b = 1 + 2^-22 + 2^-46
    c3 = np.array([half_ulp, -half_ulp, 0, 1e-30, -1e-30, 3, -3, half_ulp * 3], np.float32)
    # (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 is a float32 midpoint: a tiny c decides the rounding
    a4 = np.full(5, one + np.float32(2.0 ** -12), np.float32)
    c4 = np.array([0, 1e-30, -1e-30, 2.0 ** -60, -(2.0 ** -60)], np.float32)
    return [("random", a, b, c), ("cancel", a, b, c2), ("near", a3, b3, c3), ("midpoints", a4, a4, c4)]


@pytest.mark.parametrize("name,a,b,c", _fma_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_fma32_reference_matches_hardware_fma(name, a, b, c):
    import numba

    @numba.njit
    def fast(a, b, c):
        out = np.empty_like(a)
        for i in range(a.size):
            out[i] = fma32(a[i], b[i], c[i])
        return out

    ref = fma32_ref(a, b, c)
    assert np.array_equal(ref.view(np.uint32), fast(a, b, c).view(np.uint32))
    exact = a.astype(np.longdouble) * b + c.astype(np.longdouble)
    assert np.all(np.abs(ref - exact) <= np.spacing(np.abs(ref)) / 2 * (1 + 1e-6))


def _weights(rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
    w[0, :256] = 0          # an all-zero block
    return quant.quantize(w, "Q6_K")


def _acts(T: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((T, cols)) * rng.uniform(0.1, 30, (T, 1))).astype(np.float32)
    x[0, 256:512] = 0       # an all-zero activation block
    return x


# (name, rows, cols, T, tiled rows); tolerance 0: the same integer dots, the same float order
CASES = [("tiled", 37, 512, 9, "all"), ("vec_dot", 21, 768, 5, "none"), ("mixed", 16, 256, 11, "first8")]


@pytest.mark.parametrize("name,rows,cols,T,mode", CASES, ids=[c[0] for c in CASES])
def test_q6_k_matmul_reference_equals_fast(name, rows, cols, T, mode):
    raw, x = _weights(rows, cols, 1), _acts(T, cols, 2)
    tiled = {"all": np.ones(T, bool), "none": np.zeros(T, bool),
             "first8": np.arange(T) < 8}[mode]
    ref = q6_k_matmul_ref(raw, cols, x, tiled, chunk=7)
    fast = q6_k_matmul(raw, cols, x, tiled)
    assert np.array_equal(ref.view(np.uint32), fast.view(np.uint32))
    # and both are the product of the dequantized weights with the Q8_K-rounded activations
    from exactedit.quant.formats import q8_k

    xq = q8_k.dequantize_ref(q8_k.quantize(x)).astype(np.float64)
    w = quant.dequantize(raw, "Q6_K", cols).astype(np.float64)
    np.testing.assert_allclose(fast, xq @ w.T, rtol=1e-5, atol=1e-4)
