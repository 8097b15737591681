"""Engine-faithful Q8_0: the activation quantizer and the Q8_0 x Q8_0 matmul, numpy reference ==
numba fast path == ggml-cpu's own `quantize_row_q8_0` / `ggml_vec_dot_q8_0_q8_0` (called from
the installed llama-cpp-python library), bit for bit; and the softcap's libm tanhf."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from exactedit import quant
from exactedit.quant.formats import q8_0
from exactedit.solvers.tail import engine_math as en
from exactedit.quant.dots import q8_0_dot as e8
from tests import oracles


@pytest.fixture(scope="module")
def ggml_cpu():
    cpu = oracles.ggml_library("ggml-cpu")  # package or library missing: tests.oracles decides
    cpu.ggml_cpu_init()                                   # fills ggml-cpu's fp16 tables
    cpu.quantize_row_q8_0.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    cpu.ggml_vec_dot_q8_0_q8_0.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                           ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return cpu


def _ggml_quantize(cpu, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    out = np.zeros((x.shape[0], x.shape[1] // 32 * 34), np.uint8)
    for r in range(x.shape[0]):
        cpu.quantize_row_q8_0(x[r].ctypes.data, out[r].ctypes.data, x.shape[1])
    return out


def _ggml_matmul(cpu, raw: np.ndarray, cols: int, x: np.ndarray) -> np.ndarray:
    xq = _ggml_quantize(cpu, x)
    out, s = np.empty((x.shape[0], raw.shape[0]), np.float32), np.zeros(1, np.float32)
    raw = np.ascontiguousarray(raw)
    for t in range(x.shape[0]):
        for r in range(raw.shape[0]):
            cpu.ggml_vec_dot_q8_0_q8_0(cols, s.ctypes.data, 0, raw[r].ctypes.data, 0, xq[t].ctypes.data, 0, 1)
            out[t, r] = s[0]
    return out


def _acts(kind: str, T: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((T, cols)) * rng.uniform(0.1, 30, (T, 1))).astype(np.float32)
    if kind == "edge":
        x[0, :32] = 0                                                   # an all-zero block
        x[1, :32] = 1e-38 * rng.standard_normal(32)                     # 127 / amax overflows: -128 codes
        x[1, 32:64] = np.arange(32) + 0.5                               # amax 127 -> id 1: ties, to even
        x[1, 63] = 127
        x[2, :32] = 6e4 * rng.standard_normal(32)                       # Gemma-sized residual values
    return x


def _weights(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = quant.quantize((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32), "Q8_0")
    if kind == "edge":
        blocks = raw.view(q8_0.BLOCK).reshape(rows, -1)
        blocks["qs"][0, 0] = -128                                       # never written by ggml's quantizer,
        blocks["qs"][1, 1, ::2] = -128                                  # but a GGUF may hold it: maddubs
        blocks["qs"][2, 0] = 0                                          # saturation and sign wrap
    return raw


# (name, weight kind, activation kind, rows, cols, T); tolerance 0 throughout: the same integer
# lanes, the same float32 scale products, fma and final adds in the same order as ggml-cpu.
CASES = [("random", "plain", "plain", 33, 640, 5), ("edge", "edge", "edge", 9, 128, 4),
         ("two-block", "plain", "edge", 5, 64, 3)]


@pytest.mark.parametrize("name,wk,xk,rows,cols,T", CASES, ids=[c[0] for c in CASES])
def test_activation_quantizer_reference_fast_and_ggml(ggml_cpu, name, wk, xk, rows, cols, T):
    x = _acts(xk, max(T, 3), cols, 1)
    ref = q8_0.quantize_x86_ref(x)
    assert np.array_equal(ref, q8_0.quantize_x86(x))
    assert np.array_equal(ref, _ggml_quantize(ggml_cpu, x))


@pytest.mark.parametrize("name,wk,xk,rows,cols,T", CASES, ids=[c[0] for c in CASES])
def test_q8_0_matmul_reference_fast_and_ggml(ggml_cpu, name, wk, xk, rows, cols, T):
    raw, x = _weights(wk, rows, cols, 2), _acts(xk, max(T, 3), cols, 3)
    ref = e8.q8_0_matmul_ref(raw, cols, x, chunk=4)
    fast = e8.q8_0_matmul(raw, cols, x)
    assert np.array_equal(ref.view(np.uint32), fast.view(np.uint32))
    assert np.array_equal(ref.view(np.uint32), _ggml_matmul(ggml_cpu, raw, cols, x).view(np.uint32))
    # the dispatch takes both kernels' layouts alike (sgemm and vec_dot add the same terms)
    m = en.MatchEngine("llamacpp", (1, x.shape[0] - 1))
    assert np.array_equal(en.engine_matmul(raw, "Q8_0", cols, x, m).view(np.uint32), fast.view(np.uint32))
    assert np.array_equal(en.engine_matmul(raw, "Q8_0", cols, x, m, reference=True).view(np.uint32),
                          fast.view(np.uint32))


def test_q8_0_matmul_is_the_product_of_the_rounded_operands():
    raw, x = _weights("plain", 40, 256, 4), _acts("plain", 6, 256, 5)
    xq = q8_0.dequantize_ref(q8_0.quantize_x86(x), 256).astype(np.float64)
    w = quant.dequantize(raw, "Q8_0", 256).astype(np.float64)
    np.testing.assert_allclose(e8.q8_0_matmul(raw, 256, x), xq @ w.T, rtol=1e-5, atol=1e-5)


def test_q8_0_matmul_rejects_bad_input():
    raw = _weights("plain", 2, 64, 6)
    with pytest.raises(quant.QuantError):
        e8.q8_0_matmul(raw, 64, np.full((1, 64), np.nan, np.float32))
    with pytest.raises(quant.QuantError):
        e8.q8_0_matmul(raw[:, :60], 64, np.zeros((1, 64), np.float32))
    with pytest.raises(quant.QuantError):
        e8.q8_0_matmul_ref(raw, 64, np.zeros((1, 32), np.float32))


def test_softcap_reference_equals_fast():
    rng = np.random.default_rng(7)
    y = np.concatenate([rng.standard_normal(3000) * 40, rng.uniform(-1e-3, 1e-3, 495),
                        [0, -0.0, 1e-30, 300, -300]]).astype(np.float32).reshape(7, -1)
    ref = en.softcap_ref(y, 30.0)
    assert np.array_equal(ref.view(np.uint32), en.softcap(y, 30.0).view(np.uint32))
    assert np.all(np.abs(ref) <= 30) and np.allclose(ref, 30 * np.tanh(y / 30.0), rtol=1e-6, atol=1e-6)


def test_post_ffn_norm_enters_the_mix():
    rng = np.random.default_rng(8)
    n, h, T = 64, 256, 3
    w_down = quant.quantize((rng.standard_normal((n, h)) * 0.05).astype(np.float32), "Q6_K")
    R = (rng.standard_normal((T, n)) * 100).astype(np.float32)
    hh = rng.standard_normal((T, h)).astype(np.float32)
    w_norm, w_post = rng.uniform(0.5, 2, n).astype(np.float32), rng.uniform(0.5, 2, n).astype(np.float32)
    m = en.MatchEngine("llamacpp", (T,))
    got = en.rmsnorm_engine_mix(R, hh, w_down, "Q6_K", h, w_norm, 1e-6, m, w_post=w_post)
    ffn = en.engine_matmul(w_down, "Q6_K", h, hh, m)
    want = en.rms_norm(en.rms_norm(ffn, w_post, 1e-6) + R, w_norm, 1e-6)
    assert np.array_equal(got, want)
    assert not np.array_equal(got, en.rmsnorm_engine_mix(R, hh, w_down, "Q6_K", h, w_norm, 1e-6, m))
