"""Engine-faithful Q8_0 x Q8_0 matmul: Q8_0 weights (Gemma 3's tied head `token_embd`, or its
untied copy `output.weight`) times activations as llama.cpp's CPU backend multiplies them.

What llama.cpp 0.3.36 (x86-64 build with AVX2 + FMA + F16C, no AVX-512, no AVX-VNNI) does for
W (Q8_0, rows r) times x (float32 rows t), read off ggml/src/ggml-cpu:
  * x is quantized to Q8_0 by the AVX2 `quantize_row_q8_0` (quant.formats.q8_0.quantize_x86: 127 / amax,
    round half to even; not the reference quantizer's 1 / d, round half away);
  * there is no repacked Q8_0 layout on x86 and the tiled kernels take K-quants only, so a
    micro-batch of >= 2 rows goes to llamafile's `tinyBLAS_Q0_AVX` and a single row to
    `ggml_vec_dot_q8_0_q8_0`. Both compute, per 32-wide block b and lane L = elements 4L..4L+3:
        lane_L(b) = madd_epi16(1, maddubs_epi16(|w|, sign(x, w)))    (exact int32; each pair
                    of products saturates to int16, reachable only with a -128 code)
        acc_L = fma(f32(fp16(d_W[b]) * fp16(d_x[b])), f32(lane_L(b)), acc_L)   for b in order
        result = ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))
    so, unlike Q6_K, the micro-batch layout does not change the numbers.

`q8_0_matmul_ref` is the numpy reference (maddubs' sign trick and saturation written out, exact
float32 fma), `q8_0_matmul` the numba path (activations innermost and vectorized where they hold
no -128 code, the general lane kernel otherwise); tests/solvers/tail/test_engine_q8_0.py holds
them bit for bit equal to each other and to ggml's own `ggml_vec_dot_q8_0_q8_0`.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from exactedit.quant.formats import q8_0
from exactedit.errors import QuantError
from exactedit.quant.formats.f16 import FP16_TO_FP32
from exactedit.quant.dots.fma32 import fma32 as _fma32, fma32_ref

QK = q8_0.QK
LANES = QK // 4


def _blocks(raw: np.ndarray, cols: int, what: str) -> np.ndarray:
    """uint8 [rows, cols / 32 * 34] -> Q8_0 blocks [rows, cols / 32]."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    nb = cols // QK
    if cols % QK or raw.ndim != 2 or raw.shape[1] != nb * q8_0.BLOCK_BYTES:
        raise QuantError(f"Q8_0 {what}: expected uint8 [rows, {nb * q8_0.BLOCK_BYTES}] for {cols} "
                         f"columns, got {list(raw.shape)}")
    return raw.view(q8_0.BLOCK).reshape(raw.shape[0], nb)


def _activations(x: np.ndarray, cols: int) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] != cols or cols % QK:
        raise QuantError(f"Q8_0 matmul: expected float32 activations [T, {cols}] (a multiple of {QK}), "
                         f"got {list(x.shape)}")
    if not np.isfinite(x).all():
        raise QuantError("Q8_0 matmul: non-finite activations (the engine's result is not modelled)")
    return x


def _lanes_ref(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """int64 lanes [rows, T, nb, 8] of maddubs(|w|, sign(x, w)) then madd(1, .): w [rows, nb, 32]
    and x [T, nb, 32] int8 codes."""
    w = w.astype(np.int64)[:, None]                     # [r, 1, nb, 32]
    x = x.astype(np.int64)[None]                        # [1, T, nb, 32]
    u = np.abs(w)                                       # |-128| = 128 as an unsigned byte
    s = np.where(w > 0, x, np.where(w < 0, -x, 0))
    s = np.where(s == 128, -128, s)                     # int8 negation wraps: -(-128) = -128
    prod = u * s
    p = prod.reshape(prod.shape[:3] + (2 * LANES, 2)).sum(-1)
    p = np.clip(p, -32768, 32767)                       # maddubs saturates each pair to int16
    return p.reshape(p.shape[:3] + (LANES, 2)).sum(-1)


def q8_0_matmul_ref(raw: np.ndarray, cols: int, x: np.ndarray, tiled: np.ndarray | None = None,
                    chunk: int = 256) -> np.ndarray:
    """Reference: float32 [T, rows] = W (Q8_0, raw rows) @ x[t] as ggml-cpu computes it. `tiled`
    is accepted for the common signature and ignored (both kernels add the same terms alike)."""
    x = _activations(x, cols)
    xq = _blocks(q8_0.quantize_x86_ref(x), cols, "activations")
    dx = xq["d"].astype(np.float32)                     # [T, nb]
    out = np.empty((x.shape[0], raw.shape[0]), np.float32)
    for r0 in range(0, raw.shape[0], chunk):
        wb = _blocks(raw[r0:r0 + chunk], cols, "weights")
        lanes = _lanes_ref(wb["qs"], xq["qs"]).astype(np.float32)       # exact: |lane| < 2**17
        d = (wb["d"].astype(np.float32)[:, None, :] * dx[None]).astype(np.float32)   # [r, T, nb]
        acc = np.zeros(lanes.shape[:2] + (LANES,), np.float32)
        for b in range(lanes.shape[2]):
            acc = fma32_ref(np.broadcast_to(d[:, :, b, None], acc.shape), lanes[:, :, b], acc)
        h = acc[..., 4:] + acc[..., :4]
        out[:, r0:r0 + chunk] = ((h[..., 0] + h[..., 2]) + (h[..., 1] + h[..., 3])).T
    return out


@numba.njit(error_model="numpy", cache=True)
def _lane_general(w, x, o):
    """One lane (4 codes from offset o) with maddubs' sign trick and int16 saturation."""
    total = np.int32(0)
    for pair in range(2):
        s2 = np.int32(0)
        for i in range(2):
            a, b = np.int32(w[o + 2 * pair + i]), np.int32(x[o + 2 * pair + i])
            s = b if a > 0 else (-b if a < 0 else 0)
            if s == 128:
                s = -128
            s2 += abs(a) * s
        total += min(max(s2, -32768), 32767)
    return total


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _q8_0_matmul_kernel(wq, wd, xq, xd, x_plain, out):
    """wq [rows, nb*32] / xq [T, nb*32] int8 codes, wd [rows, nb] / xd [T, nb] float32 scales;
    x_plain[t]: row t has no -128 code, so each pair of products is < 2 * 128 * 127 in magnitude
    (no saturation) and |w| * sign(x, w) = w * x: the lane is the plain integer dot."""
    rows, nb = wd.shape
    T = xq.shape[0]
    for r in prange(rows):
        w32 = np.empty(nb * QK, np.int32)
        for e in range(nb * QK):
            w32[e] = wq[r, e]
        acc = np.empty(LANES, np.float32)
        for t in range(T):
            acc[:] = 0
            for b in range(nb):
                d = wd[r, b] * xd[t, b]
                for L in range(LANES):
                    o = b * QK + 4 * L
                    if x_plain[t]:
                        s = np.int32(0)
                        for i in range(4):
                            s += w32[o + i] * np.int32(xq[t, o + i])
                    else:
                        s = _lane_general(wq[r], xq[t], o)
                    acc[L] = _fma32(d, np.float32(s), acc[L])
            out[t, r] = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _q8_0_plain_kernel(wq, wd, xq, xdT, out):
    """The same floats as `_q8_0_matmul_kernel` for activation rows without a -128 code, with the
    activations innermost so that every step vectorizes: wq [rows, nb*32] int8, wd [rows, nb]
    float32, xq [nb, 32, T] float32 codes, xdT [nb, T] float32 scales, out [rows, T].
    A lane is then the plain dot of 4 codes, |.| <= 4 * 128 * 127: its float32 products and sums
    are exact integers in any order, equal to maddubs + madd."""
    rows, nb = wd.shape
    T = xq.shape[2]
    for r in prange(rows):
        acc = np.zeros((LANES, T), np.float32)
        d = np.empty(T, np.float32)
        for b in range(nb):
            dw = wd[r, b]
            xd = xdT[b]
            for t in range(T):
                d[t] = dw * xd[t]
            for L in range(LANES):
                o = b * QK + 4 * L
                w0, w1 = np.float32(wq[r, o]), np.float32(wq[r, o + 1])
                w2, w3 = np.float32(wq[r, o + 2]), np.float32(wq[r, o + 3])
                x0, x1, x2, x3 = xq[b, 4 * L], xq[b, 4 * L + 1], xq[b, 4 * L + 2], xq[b, 4 * L + 3]
                a = acc[L]
                for t in range(T):
                    lane = (w0 * x0[t] + w1 * x1[t]) + (w2 * x2[t] + w3 * x3[t])
                    a[t] = _fma32(d[t], lane, a[t])
        for t in range(T):
            out[r, t] = (((acc[0, t] + acc[4, t]) + (acc[2, t] + acc[6, t]))
                         + ((acc[1, t] + acc[5, t]) + (acc[3, t] + acc[7, t])))


def q8_0_matmul(raw: np.ndarray, cols: int, x: np.ndarray, tiled: np.ndarray | None = None) -> np.ndarray:
    """Fast path of `q8_0_matmul_ref` (numba, rows of W in parallel); identical floats.
    Activation rows without a -128 code (all that ggml's activation quantizer makes from finite
    rows whose blocks are not all below ~3.7e-37) take the vectorized plain kernel, the rest
    the general one (maddubs' sign wrap written out)."""
    x = _activations(x, cols)
    wb = _blocks(raw, cols, "weights")
    xb = _blocks(q8_0.quantize_x86(x), cols, "activations")
    xqs = np.ascontiguousarray(xb["qs"]).reshape(x.shape[0], -1)
    wqs = np.ascontiguousarray(wb["qs"]).reshape(wb.shape[0], -1)
    wd = FP16_TO_FP32[wb["d"].view(np.uint16)]
    xd = FP16_TO_FP32[xb["d"].view(np.uint16)]
    plain = (xqs != -128).all(axis=1)
    out = np.empty((x.shape[0], wb.shape[0]), np.float32)
    if plain.any():
        nb = cols // QK
        xq = np.ascontiguousarray(xqs[plain].reshape(-1, nb, QK).astype(np.float32).transpose(1, 2, 0))
        res = np.empty((wb.shape[0], int(plain.sum())), np.float32)
        _q8_0_plain_kernel(wqs, wd, xq, np.ascontiguousarray(xd[plain].T), res)
        out[plain] = res.T
    if not plain.all():
        rest = np.empty((int((~plain).sum()), wb.shape[0]), np.float32)
        _q8_0_matmul_kernel(wqs, wd, np.ascontiguousarray(xqs[~plain]),
                            np.ascontiguousarray(xd[~plain]), np.zeros(rest.shape[0], np.bool_), rest)
        out[~plain] = rest
    return out
