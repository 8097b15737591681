"""Engine-faithful Q5_0: the Q5_0 x Q8_0 matmul, numpy reference == numba fast path == ggml-cpu's own
`ggml_vec_dot_q5_0_q8_0` (called from the installed llama-cpp-python library), bit for bit; the
re-encoding to Q8_0 lossless against dequantization."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from exactedit import quant
from exactedit.quant.dots import q5_0_dot as e5
from exactedit.quant.formats import q8_0
from tests import oracles


@pytest.fixture(scope="module")
def ggml_cpu():
    cpu = oracles.ggml_library("ggml-cpu")
    cpu.ggml_cpu_init()
    cpu.quantize_row_q8_0.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    cpu.ggml_vec_dot_q5_0_q8_0.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                           ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return cpu


def _ggml_matmul(cpu, raw: np.ndarray, cols: int, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    xq = np.zeros((x.shape[0], cols // 32 * 34), np.uint8)
    for t in range(x.shape[0]):
        cpu.quantize_row_q8_0(x[t].ctypes.data, xq[t].ctypes.data, cols)
    out, s = np.empty((x.shape[0], raw.shape[0]), np.float32), np.zeros(1, np.float32)
    raw = np.ascontiguousarray(raw)
    for t in range(x.shape[0]):
        for r in range(raw.shape[0]):
            cpu.ggml_vec_dot_q5_0_q8_0(cols, s.ctypes.data, 0, raw[r].ctypes.data, 0, xq[t].ctypes.data, 0, 1)
            out[t, r] = s[0]
    return out


def _case(rows: int, cols: int, T: int, seed: int, scale: float = 0.05):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    w[0, :32] = 0                                           # an all-zero block
    raw = quant.quantize(w, "Q5_0")
    x = (rng.standard_normal((T, cols)) * rng.uniform(0.1, 30, (T, 1))).astype(np.float32)
    x[0, :32] = 0
    return raw, x


@pytest.mark.parametrize("rows,cols,T", [(33, 640, 5), (9, 64, 3), (4, 2048, 2)])
def test_q5_0_matmul_reference_fast_and_ggml(ggml_cpu, rows, cols, T):
    raw, x = _case(rows, cols, T, rows + cols)
    ref, fast = e5.q5_0_matmul_ref(raw, cols, x), e5.q5_0_matmul(raw, cols, x)
    oracles.assert_bits_equal(ref, fast, "Q5_0 reference vs numba")
    oracles.assert_bits_equal(ref, _ggml_matmul(ggml_cpu, raw, cols, x), "Q5_0 vs ggml_vec_dot_q5_0_q8_0")


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.sampled_from([32, 96, 640]),
       st.floats(1e-3, 50.0))
def test_hypothesis_q5_0_bits_equal_ggml(ggml_cpu, seed, T, cols, scale):
    raw, x = _case(3, cols, T, seed, scale)
    oracles.assert_bits_equal(e5.q5_0_matmul(raw, cols, x), _ggml_matmul(ggml_cpu, raw, cols, x), "Q5_0 hypothesis")


def test_to_q8_0_is_lossless():
    raw, _ = _case(7, 256, 1, 3)
    as8 = e5.to_q8_0(raw, 256)
    assert np.array_equal(quant.dequantize(raw, "Q5_0", 256).view(np.uint32),
                          q8_0.dequantize_ref(as8, 256).view(np.uint32))
    codes = as8.view(q8_0.BLOCK)["qs"]
    assert codes.min() >= -16 and codes.max() <= 15


def test_q5_0_matmul_is_the_product_of_the_rounded_operands():
    raw, x = _case(20, 256, 4, 9)
    xq = q8_0.dequantize_ref(q8_0.quantize_x86(x), 256).astype(np.float64)
    w = quant.dequantize(raw, "Q5_0", 256).astype(np.float64)
    np.testing.assert_allclose(e5.q5_0_matmul(raw, 256, x), xq @ w.T, rtol=1e-5, atol=1e-4)


def test_q5_0_rejects_bad_rows():
    raw, x = _case(2, 64, 1, 1)
    with pytest.raises(quant.QuantError):
        e5.q5_0_matmul(raw[:, :40], 64, x)
