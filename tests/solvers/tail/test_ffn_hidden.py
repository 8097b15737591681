"""ffn_hidden: the engine-faithful FFN hidden against its numpy kernels (bit for bit), against ggml's
own repacked Q4_K kernels (bit for bit), and against the float64 reference (a derived bound).

Random data: R Gaussian with a few large outliers (as real residuals have), quantized gate/up rows
made by our quantizers from Gaussian weights. Offline: the oracle test needs only the installed
llama-cpp-python's libggml-cpu, no model.

Bound of the float64 reference against the engine (per element, all terms computed, none tuned):
the engine quantizes x = ffn_norm(R) per activation block (Q8_K: 256 values, Q8_0 / Q8_1: 32) with
step d = amax / 127 (fp16-rounded for the 32-wide formats), so each value moves by at most
delta = 0.57 d (half a step, plus 127 * 2^-11 d of fp16 scale rounding). A weight row with block
min terms mu (Q4_1: m; Q4_K: dmin * m_sub; none for Q6_K, Q8_0) multiplies the codes by |w - mu|
<= |w| + |mu| and the code sums by |mu|, so a gate/up dot moves by at most
    sum_e (|w_e| + 2 |mu_e|) delta_e  (+ |m| 2^-11 32 amax per Q4_1 block: the fp16 code sum s)
    + gamma sum_e (|w_e| + 2 |mu_e|) |x_e|,   gamma = (blocks + 64) 2^-23 + 2^-20
(float32 accumulation over the blocks and FMA lanes, f32() of the block integers, and the float32
ffn_norm). The hidden then moves by at most L |dg| (|u| + |du|) + |silu(g)| |du| + 2^-20 |h|,
L = max |silu'| < 1.1 (the last term: ggml's expf approximation, the divide and the product).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from exactedit import quant
from exactedit.errors import QuantError
from exactedit.quant.dots.q4_k_dot import q4_k_blocks, scales_mins_ref
from exactedit.quant.formats import q4_1, q8_k
from exactedit.quant.formats.f16 import FP16_TO_FP32
from exactedit.solvers.tail.forward import ffn_hidden as fh
from exactedit.solvers.tail.forward.ffn_ops import ffn_norm_ref, silu_ref
from tests import oracles

N = 512          # model width: two Q8_K blocks, sixteen Q8_1 / Q8_0 blocks
H = 24           # gate/up rows (a multiple of 8: a Q4_K tensor the engine repacks)
EPS = 1e-6

# type, micro-batches (rows 11), what they exercise
CASES = [
    ("Q4_K", (7, 1, 3), "repacked: gemm rows 0-3, gemv rows 4-10"),
    ("Q4_K", (11,), "repacked: gemm rows 0-7, gemv rows 8-10"),
    ("Q4_1", (7, 1, 3), "vec_dot at every micro-batch size"),
    ("Q8_0", (7, 1, 3), "vec_dot / tinyBLAS: the same sums"),
    ("Q6_K", (9, 2), "tiled rows 0-8, vec_dot rows 9-10"),
]


def _data(type_name: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    R = rng.standard_normal((11, N)).astype(np.float32)
    R[:, rng.integers(0, N, 3)] *= 40                        # outlier channels
    w = (1 + 0.3 * rng.standard_normal(N)).astype(np.float32)
    gate = quant.quantize((0.05 * rng.standard_normal((H, N))).astype(np.float32), type_name)
    up = quant.quantize((0.05 * rng.standard_normal((H, N))).astype(np.float32), type_name)
    return R, w, gate, up


@pytest.mark.parametrize("type_name,sizes,what", CASES)
def test_fast_path_equals_numpy_kernels(type_name, sizes, what):
    R, w, gate, up = _data(type_name)
    fast = fh.ffn_hidden_engine(R, w, EPS, gate, up, type_name, ubatch_sizes=sizes)
    ref = fh.ffn_hidden_engine(R, w, EPS, gate, up, type_name, ubatch_sizes=sizes, reference=True)
    assert fast.dtype == np.float32 and fast.shape == (11, H)
    assert np.array_equal(fast, ref), f"{what}: first difference at {np.argwhere(fast != ref)[:3]}"


@pytest.mark.parametrize("type_name,sizes,what,rows", [c + (H,) for c in CASES] + [
    ("Q4_1", (11,), "a row of 21 units: the last 5 take ggml's scalar silu", 21)])
def test_units_subset_is_the_same_floats(type_name, sizes, what, rows):
    """A unit's hidden is the same float alone or among all (the swiglu's vector / scalar split
    follows the unit's place in the engine's row of h values)."""
    R, w, gate, up = _data(type_name, seed=1)
    gate, up = gate[:rows], up[:rows]
    units = np.array([rows - 1, 0, 9, 9, 16, rows - 2, 17])
    full = fh.ffn_hidden_engine(R, w, EPS, gate, up, type_name, ubatch_sizes=sizes)
    sub = fh.ffn_hidden_engine(R, w, EPS, gate, up, type_name, units, ubatch_sizes=sizes)
    assert np.array_equal(sub, full[:, units])


def _mins(raw: np.ndarray, type_name: str) -> np.ndarray:
    """|mu| per weight value [rows, N]: the block min terms a code multiplies along."""
    if type_name == "Q4_1":
        m = FP16_TO_FP32[raw.view(q4_1.BLOCK)["m"].view(np.uint16)].reshape(raw.shape[0], -1)
        return np.repeat(np.abs(m.astype(np.float64)), q4_1.QK, axis=1)
    if type_name == "Q4_K":
        blk = q4_k_blocks(raw, N)
        _, m = scales_mins_ref(blk["scales"])                          # [r, nb, 8]
        dmin = blk["dmin"].astype(np.float64)[..., None]
        return np.repeat(np.abs(dmin * m), 32, axis=-1).reshape(raw.shape[0], N)
    return np.zeros((raw.shape[0], N))


def _dot_bound(x: np.ndarray, raw: np.ndarray, type_name: str) -> np.ndarray:
    """[T, rows]: the bound of |engine dot - exact dot| (module doc)."""
    block = q8_k.QK if type_name in ("Q4_K", "Q6_K") else 32
    W = np.abs(quant.dequantize(raw, type_name, N).astype(np.float64))
    mu = _mins(raw, type_name)
    a = W + 2 * mu                                                          # [r, N]
    amax = np.abs(x).reshape(x.shape[0], -1, block).max(-1)                # [T, nblocks]
    delta = np.repeat(0.57 * amax / 127, block, axis=1)                     # [T, N]
    gamma = (N // block + 64) * 2.0 ** -23 + 2.0 ** -20
    bound = delta @ a.T + gamma * (np.abs(x) @ a.T)
    if type_name == "Q4_1":
        m_blocks = mu[:, ::block]                                           # [r, nblocks]
        bound += (2.0 ** -11 * 32 * amax) @ m_blocks.T
    return bound


@pytest.mark.parametrize("type_name,sizes,what", CASES)
def test_engine_is_within_the_derived_bound_of_the_float64_reference(type_name, sizes, what):
    R, w, gate, up = _data(type_name, seed=2)
    eng = fh.ffn_hidden_engine(R, w, EPS, gate, up, type_name, ubatch_sizes=sizes).astype(np.float64)
    ref = fh.ffn_hidden_ref(R, w, EPS, gate, up, type_name)
    x = ffn_norm_ref(R, w.astype(np.float64), EPS)
    g = x @ quant.dequantize(gate, type_name, N).astype(np.float64).T
    u = x @ quant.dequantize(up, type_name, N).astype(np.float64).T
    dg, du = _dot_bound(x, gate, type_name), _dot_bound(x, up, type_name)
    bound = 1.1 * dg * (np.abs(u) + du) + np.abs(silu_ref(g)) * du + 2.0 ** -20 * np.abs(ref)
    err = np.abs(eng - ref)
    assert (err <= bound).all(), f"{what}: worst err/bound {(err / bound).max():.3g}"
    assert not np.array_equal(eng, ref.astype(np.float32))                 # the engine really differs


def test_repack_matmul_is_the_exact_sum_within_float32_rounding():
    """The tight check of the new kernels' arithmetic: against the float64 sum of what they
    multiply (the Q8_K codes and scales, exact integers), the gemm's 4 nb + 1 and the gemv's
    nb + 1 rounded steps (FMAs, f32() of the integers, the scale products, the final subtraction)
    stay within (4 nb + 4) 2^-24 of the sum of the terms' magnitudes."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, N)).astype(np.float32)
    x[:, rng.integers(0, N, 3)] *= 40
    raw = quant.quantize((0.05 * rng.standard_normal((H, N))).astype(np.float32), "Q4_K")
    gemm = fh.repack_gemm_rows((9,))
    got = fh.q4_k_repack_matmul(raw, x, gemm).astype(np.float64)
    blk = q4_k_blocks(raw, N)
    sc, m = scales_mins_ref(blk["scales"])
    u = np.concatenate([blk["qs"].reshape(H, -1, 4, 1, 32) & 15, blk["qs"].reshape(H, -1, 4, 1, 32) >> 4],
                       axis=3).reshape(H, -1, 256).astype(np.float64)
    xq = q8_k.quantize(x)
    ints = np.einsum("rbe,tbe->rtb", u * np.repeat(sc, 32, axis=-1), xq["qs"].astype(np.float64))
    mins = np.einsum("rbk,tbk->rtb", m.astype(np.float64),
                     xq["bsums"].astype(np.float64).reshape(x.shape[0], -1, 8, 2).sum(-1))
    d = blk["d"].astype(np.float64)[:, None] * xq["d"].astype(np.float64)[None]     # [r, T, nb]
    dm = blk["dmin"].astype(np.float64)[:, None] * xq["d"].astype(np.float64)[None]
    exact = (d * ints - dm * mins).sum(-1).T
    scale = (np.abs(d * ints) + np.abs(dm * mins)).sum(-1).T
    nb = N // 256
    assert (np.abs(got - exact) <= (4 * nb + 4) * 2.0 ** -24 * scale).all()


def test_repack_kernels_differ_from_vec_dot():
    """Why the repack path matters: on the same rows, vec_dot, gemm and gemv orders disagree."""
    R, w, gate, up = _data("Q4_K", seed=3)
    args = (R, w, EPS, gate, up, "Q4_K")
    gemm = fh.ffn_hidden_engine(*args, ubatch_sizes=(11,))[:8]
    gemv = fh.ffn_hidden_engine(*args, ubatch_sizes=(1,) * 11)[:8]
    vec = fh.ffn_hidden_engine(*args, q4_k_repacked=False)[:8]
    assert not np.array_equal(gemm, gemv) and not np.array_equal(gemm, vec) and not np.array_equal(gemv, vec)


@pytest.mark.parametrize("sizes,gemm", [
    ((1,), [0]), ((3,), [0, 0, 0]), ((4,), [1, 1, 1, 1]), ((7,), [1, 1, 1, 1, 0, 0, 0]),
    ((8, 2), [1] * 8 + [0, 0]), ((5, 4, 1), [1, 1, 1, 1, 0, 1, 1, 1, 1, 0])])
def test_repack_gemm_rows(sizes, gemm):
    assert fh.repack_gemm_rows(sizes).tolist() == [bool(v) for v in gemm]


@pytest.mark.parametrize("change,match", [
    (dict(type_name="Q5_K"), "Q5_K"),
    (dict(units=np.array([24])), "units"),
    (dict(units=np.array([], np.int64)), "units"),
    (dict(ubatch_sizes=(5, 5)), "ubatch_sizes"),
    (dict(gate=np.zeros((H, 7), np.uint8)), "gate_raw"),
    (dict(rows=20), "not repacked"),
    (dict(rows=20, q4_k_repacked=True), "rows % 8"),
])
def test_refusals(change, match):
    R, w, gate, up = _data("Q4_K")
    rows = change.pop("rows", H)
    kw = dict(type_name="Q4_K", units=None, gate=gate[:rows], up=up[:rows])
    kw.update(change)
    with pytest.raises(QuantError, match=match):
        fh.ffn_hidden_engine(R, w, EPS, kw.pop("gate"), kw.pop("up"), kw.pop("type_name"), **kw)


# ---- ggml's own q4_K_8x8 kernels (libggml-cpu of llama-cpp-python) ---------------------------
_KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
BLOCK_Q4_KX8 = 1152          # d[8], dmin[8] fp16, scales[96], qs[1024]  (repack.h block_q4_Kx8)
BLOCK_Q8_KX4 = 1168          # d[4] f32, qs[1024], bsums[64] int16     (repack.h block_q8_Kx4)


def _make_block_q4_kx8(blocks: np.ndarray) -> np.ndarray:
    """repack.cpp make_block_q4_Kx8: eight Q4_K blocks (raw bytes [8, 144]) -> one 1152-byte tile."""
    out = np.zeros(BLOCK_Q4_KX8, np.uint8)
    out[0:16] = blocks[:, 0:2].reshape(-1)
    out[16:32] = blocks[:, 2:4].reshape(-1)
    qs = blocks[:, 16:144]
    for i in range(128):                                   # 8-byte chunks of the 8 rows in turn
        out[128 + 8 * i:136 + 8 * i] = qs[i % 8, 8 * (i // 8):8 * (i // 8) + 8]
    sc = blocks[:, 4:16].astype(np.int32)
    for i in range(8):
        if i < 4:
            s, m = sc[:, i] & 63, sc[:, i + 4] & 63
        else:
            j = i - 4
            s = ((sc[:, j] & 192) >> 2) | (sc[:, j + 8] & 15)
            m = ((sc[:, j + 4] & 192) >> 2) | ((sc[:, j + 8] & 240) >> 4)
        g = 32 + (12 * i if i < 4 else 12 * (i - 4) + 48)
        out[g:g + 4] = (s[:4] & 63) + ((s[4:] & 48) << 2)
        out[g + 4:g + 8] = (m[:4] & 63) + ((m[4:] & 48) << 2)
        out[g + 8:g + 12] = (s[4:] & 15) + ((m[4:] & 15) << 4)
    return out


class GgmlRepack:
    def __init__(self, cpu: ctypes.CDLL):
        cpu.ggml_cpu_init()
        self.gemm = _KERNEL(("ggml_gemm_q4_K_8x8_q8_K", cpu))
        self.gemv = _KERNEL(("ggml_gemv_q4_K_8x8_q8_K", cpu))
        self.quant4 = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
            ("ggml_quantize_mat_q8_K_4x8", cpu))
        self.quant1 = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
            ("quantize_row_q8_K", cpu))

    def matmul(self, raw: np.ndarray, x: np.ndarray, gemm: np.ndarray) -> np.ndarray:
        rows, nb = raw.shape[0], N // 256
        tiles = np.stack([_make_block_q4_kx8(raw[8 * c:8 * c + 8].reshape(8, nb, 144)[:, b])
                          for c in range(rows // 8) for b in range(nb)])
        x = np.ascontiguousarray(x, np.float32)
        out = np.zeros((x.shape[0], rows), np.float32)
        t = 0
        while t < x.shape[0]:
            if gemm[t]:
                vy = np.zeros(nb * BLOCK_Q8_KX4, np.uint8)
                self.quant4(x[t:t + 4].ctypes.data, vy.ctypes.data, N)
                s = np.zeros((4, rows), np.float32)
                self.gemm(N, s.ctypes.data, rows, tiles.ctypes.data, vy.ctypes.data, 4, rows)
                out[t:t + 4] = s
                t += 4
            else:
                vy = np.zeros(nb * q8_k.BLOCK_BYTES, np.uint8)
                self.quant1(x[t].ctypes.data, vy.ctypes.data, N)
                s = np.zeros(rows, np.float32)
                self.gemv(N, s.ctypes.data, rows, tiles.ctypes.data, vy.ctypes.data, 1, rows)
                out[t] = s
                t += 1
        return out


@pytest.fixture(scope="module")
def ggml():
    return GgmlRepack(oracles.ggml_library("ggml-cpu"))


@pytest.mark.parametrize("seed,sizes", [(0, (8, 3)), (1, (4, 1, 1, 5)), (2, (12,)), (3, (1,) * 6)])
def test_repack_kernels_equal_ggml(ggml, seed, sizes):
    rng = np.random.default_rng(seed)
    T = sum(sizes)
    x = rng.standard_normal((T, N)).astype(np.float32)
    x[:, rng.integers(0, N, 4)] *= 60
    x[0, :256] *= 1e-3                                       # a quiet block beside loud ones
    raw = quant.quantize((0.05 * rng.standard_normal((H, N))).astype(np.float32), "Q4_K")
    gemm = fh.repack_gemm_rows(sizes)
    want = ggml.matmul(raw, x, gemm)
    got = fh.q4_k_repack_matmul(raw, x, gemm)
    assert np.array_equal(got, want), f"first difference at {np.argwhere(got != want)[:3].tolist()}"
    assert np.array_equal(fh.q4_k_repack_matmul_ref(raw, x, gemm), want)
