"""Engine-faithful Q4_1 x Q8_1: the Q8_1 activation quantizer and the matmul, numpy reference ==
numba fast path == ggml-cpu's own `quantize_row_q8_1` / `ggml_vec_dot_q4_1_q8_1` (called from
the installed llama-cpp-python library), bit for bit (tolerance 0: the same integer lanes, the
same float32 products, fma and adds in the same order as ggml-cpu)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from exactedit import quant
from exactedit.quant.formats import q4_1, q8_1
from exactedit.quant.dots import q4_1_dot as d41
from exactedit.solvers.tail import engine_math as en
from tests import oracles

_VEC_DOT = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


@pytest.fixture(scope="module")
def ggml_cpu():
    cpu = oracles.ggml_library("ggml-cpu")  # package or library missing: tests.oracles decides
    cpu.ggml_cpu_init()                                   # fills ggml-cpu's fp16 tables
    cpu.quantize_row_q8_1.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    cpu.ggml_vec_dot_q4_1_q8_1.argtypes = _VEC_DOT
    return cpu


def _ggml_quantize(cpu, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    out = np.zeros((x.shape[0], x.shape[1] // 32 * q8_1.BLOCK_BYTES), np.uint8)
    for r in range(x.shape[0]):
        cpu.quantize_row_q8_1(x[r].ctypes.data, out[r].ctypes.data, x.shape[1])
    return out


def _ggml_matmul(cpu, raw: np.ndarray, cols: int, x: np.ndarray) -> np.ndarray:
    xq = _ggml_quantize(cpu, x)
    out, s = np.empty((x.shape[0], raw.shape[0]), np.float32), np.zeros(1, np.float32)
    raw = np.ascontiguousarray(raw)
    for t in range(x.shape[0]):
        for r in range(raw.shape[0]):
            cpu.ggml_vec_dot_q4_1_q8_1(cols, s.ctypes.data, 0, raw[r].ctypes.data, 0,
                                       xq[t].ctypes.data, 0, 1)
            out[t, r] = s[0]
    return out


def _acts(kind: str, T: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((T, cols)) * rng.uniform(0.1, 30, (T, 1))).astype(np.float32)
    if kind == "edge":
        x[0, :32] = 0                                                   # an all-zero block: d = s = 0
        x[1, :32] = 1e-38 * rng.standard_normal(32)                     # 127 / amax overflows
        x[1, 32:64] = np.arange(32) + 0.5                               # amax 127 -> id 1: ties, to even
        x[1, 63] = 127
        x[2, :32] = 6e4 * rng.standard_normal(32)                       # s = d * sum overflows fp16
        x[2, 32:64] = np.abs(x[2, 32:64])                               # one-signed: the largest sums
    return x


def _weights(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    if kind == "edge":
        w[0, :32] = 0                                                   # d = 0, m = 0
        w[1, :32] = np.linspace(3.0, 3.5, 32)                           # a large positive min
        w[2] += 1e3                                                     # m dominates every block
    return quant.quantize(w, "Q4_1")


# (name, weight kind, activation kind, rows, cols, T)
CASES = [("random", "plain", "plain", 33, 640, 5), ("edge", "edge", "edge", 9, 128, 4),
         ("one-block", "edge", "plain", 5, 32, 3), ("two-block", "plain", "edge", 5, 64, 3), ("smollm-shape", "plain", "plain", 7, 1536, 3)]


def test_q8_1_layout_is_ggml_s(ggml_cpu):
    c = oracles.load()
    traits = c.lib.ggml_get_type_traits(9).contents                     # GGML_TYPE_Q8_1
    assert (traits.type_name, traits.blck_size, traits.type_size) == (b"q8_1", 32, q8_1.BLOCK_BYTES)


@pytest.mark.parametrize("name,wk,xk,rows,cols,T", CASES, ids=[c[0] for c in CASES])
def test_activation_quantizer_reference_fast_and_ggml(ggml_cpu, name, wk, xk, rows, cols, T):
    x = _acts(xk, max(T, 3), cols, 1)
    want = _ggml_quantize(ggml_cpu, x)
    oracles.assert_bytes_equal(q8_1.quantize_x86_ref(x), want, q8_1.BLOCK_BYTES, "reference")
    oracles.assert_bytes_equal(q8_1.quantize_x86(x), want, q8_1.BLOCK_BYTES, "fast")


@pytest.mark.parametrize("name,wk,xk,rows,cols,T", CASES, ids=[c[0] for c in CASES])
def test_matmul_reference_fast_and_ggml(ggml_cpu, name, wk, xk, rows, cols, T):
    raw = _weights(wk, rows, cols, 2)
    x = _acts(xk, T, cols, 3)
    with np.errstate(over="ignore", invalid="ignore"):
        want = _ggml_matmul(ggml_cpu, raw, cols, x)
        ref = d41.q4_1_matmul_ref(raw, cols, x)
    oracles.assert_bits_equal(ref, want, "reference vs ggml")
    oracles.assert_bits_equal(d41.q4_1_matmul(raw, cols, x), want, "fast vs ggml")


def test_engine_matmul_takes_q4_1_and_ignores_the_micro_batch():
    """ggml-cpu has no tiled Q4_1 kernel: any micro-batch layout gives the same numbers."""
    raw = _weights("plain", 6, 256, 4)
    x = _acts("plain", 9, 256, 5)
    a = en.engine_matmul(raw, "Q4_1", 256, x, en.MatchEngine("llamacpp", (9,)))
    b = en.engine_matmul(raw, "Q4_1", 256, x, en.MatchEngine("llamacpp", (1,) * 9), reference=True)
    oracles.assert_bits_equal(a, b, "tiled-size vs single-row micro-batches")
    assert a.shape == (9, 6)


def test_bad_shapes_are_refused():
    raw = _weights("plain", 2, 64, 0)
    with pytest.raises(quant.QuantError, match="Q4_1 weights"):
        d41.q4_1_matmul(raw[:, :-1], 64, np.zeros((1, 64), np.float32))
    with pytest.raises(quant.QuantError, match="activations"):
        d41.q4_1_matmul(raw, 64, np.zeros((1, 32), np.float32))
    with pytest.raises(quant.QuantError, match="non-finite"):
        d41.q4_1_matmul(raw, 64, np.full((1, 64), np.inf, np.float32))
    assert q4_1.QK == q8_1.QK
