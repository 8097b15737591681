"""Engine-faithful Q4_1 x Q8_1 matmul: Q4_1 weights (SmolLM2's `ffn_down`) times activations as
llama.cpp's CPU backend multiplies them.

What llama.cpp 0.3.36 (x86-64 build with AVX2 + FMA + F16C, no AVX-512, no AVX-VNNI) does for
W (Q4_1, rows r) times x (float32 rows t), read off ggml/src/ggml-cpu:
  * x is quantized to Q8_1 by the AVX2 `quantize_row_q8_1` (quant.formats.q8_1.quantize_x86);
  * there is no repacked Q4_1 layout and llamafile's sgemm takes no Q4_1, so every micro-batch,
    whatever its size, runs `ggml_vec_dot_q4_1_q8_1` once per (row, activation). Per 32-wide
    block b, with u the 4-bit codes (0..15) and q the Q8_1 codes, lane L = elements 4L..4L+3:
        lane_L(b) = madd_epi16(1, maddubs_epi16(u, q))          (exact: |pair| <= 2 * 15 * 128)
        acc_L  = fma(f32(fp16(d_W[b]) * fp16(d_x[b])), f32(lane_L(b)), acc_L)
        summs  = summs + f32(fp16(m_W[b]) * fp16(s_x[b]))      (a separate product and add)
    result = (((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))) + summs.
The min term rides on s = d * sum(q): value code * d + m times x sums to d_W d_x (u . q) +
m_W s_x, which is what the engine adds.

`q4_1_matmul_ref` is the numpy reference (integer lanes exact, float32 fma exact), `q4_1_matmul`
the numba path; tests/quant/test_q4_1_dot.py holds them bit for bit equal to each other and to
ggml's own exported `quantize_row_q8_1` / `ggml_vec_dot_q4_1_q8_1`.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from exactedit.quant.formats import q4_1, q8_1
from exactedit.errors import QuantError
from exactedit.quant.formats.f16 import FP16_TO_FP32
from exactedit.quant.dots.fma32 import fma32 as _fma32, fma32_ref

__all__ = ["q4_1_matmul", "q4_1_matmul_ref"]

QK = q4_1.QK
LANES = QK // 4


def _weights(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 32 * 20] -> Q4_1 blocks [rows, cols / 32], validated."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    nb = cols // QK
    if cols % QK or raw.ndim != 2 or raw.shape[1] != nb * q4_1.BLOCK_BYTES:
        raise QuantError(f"Q4_1 weights: expected uint8 [rows, {nb * q4_1.BLOCK_BYTES}] for {cols} "
                         f"columns, got {list(raw.shape)}")
    return raw.view(q4_1.BLOCK).reshape(raw.shape[0], nb)


def _activations(x: np.ndarray, cols: int) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] != cols or cols % QK:
        raise QuantError(f"Q4_1 matmul: expected float32 activations [T, {cols}] (a multiple of "
                         f"{QK}), got {list(x.shape)}")
    if not np.isfinite(x).all():
        raise QuantError("Q4_1 matmul: non-finite activations (the engine's result is not modelled)")
    return x


def q4_1_matmul_ref(raw: np.ndarray, cols: int, x: np.ndarray, tiled: np.ndarray | None = None,
                    chunk: int = 256) -> np.ndarray:
    """Reference: float32 [T, rows] = W (Q4_1, raw rows) @ x[t] as ggml-cpu computes it. `tiled`
    is accepted for the common signature and ignored (every micro-batch runs vec_dot)."""
    x = _activations(x, cols)
    xb = q8_1.quantize_x86_ref(x).view(q8_1.BLOCK).reshape(x.shape[0], -1)
    q = xb["qs"].astype(np.int64)                                        # [T, nb, 32]
    dx, sx = xb["d"].astype(np.float32), xb["s"].astype(np.float32)     # [T, nb]
    out = np.empty((x.shape[0], raw.shape[0]), np.float32)
    for r0 in range(0, raw.shape[0], chunk):
        wb = _weights(raw[r0:r0 + chunk], cols)
        u = np.concatenate([wb["qs"] & 0xF, wb["qs"] >> 4], axis=-1).astype(np.int64)  # [r, nb, 32]
        prod = u[:, None] * q[None]                                      # [r, T, nb, 32]
        lanes = prod.reshape(prod.shape[:3] + (LANES, 4)).sum(-1).astype(np.float32)
        dw, mw = wb["d"].astype(np.float32), wb["m"].astype(np.float32)  # [r, nb]
        d = (dw[:, None, :] * dx[None]).astype(np.float32)               # [r, T, nb]
        ms = (mw[:, None, :] * sx[None]).astype(np.float32)
        acc = np.zeros(lanes.shape[:2] + (LANES,), np.float32)
        summs = np.zeros(lanes.shape[:2], np.float32)
        for b in range(lanes.shape[2]):
            acc = fma32_ref(np.broadcast_to(d[:, :, b, None], acc.shape), lanes[:, :, b], acc)
            summs = (summs + ms[:, :, b]).astype(np.float32)
        h = acc[..., 4:] + acc[..., :4]
        total = ((h[..., 0] + h[..., 2]) + (h[..., 1] + h[..., 3])) + summs
        out[:, r0:r0 + chunk] = total.T
    return out


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _q4_1_matmul_kernel(wqs, wd, wm, xq, xd, xs, out):
    """wqs [rows, nb, 16] packed nibbles, wd / wm [rows, nb] float32; xq [T, nb, 32] int8 codes,
    xd / xs [T, nb] float32. One (row, activation) pair is one ggml_vec_dot_q4_1_q8_1."""
    rows, nb = wd.shape
    T = xq.shape[0]
    for r in prange(rows):
        u = np.empty((nb, QK), np.int32)
        for b in range(nb):
            for j in range(QK // 2):
                c = np.int32(wqs[r, b, j])
                u[b, j] = c & 0xF
                u[b, j + QK // 2] = c >> 4
        acc = np.empty(LANES, np.float32)
        for t in range(T):
            acc[:] = 0
            summs = np.float32(0)
            for b in range(nb):
                d = wd[r, b] * xd[t, b]
                summs += wm[r, b] * xs[t, b]
                for L in range(LANES):
                    s = np.int32(0)
                    for i in range(4):
                        s += u[b, 4 * L + i] * np.int32(xq[t, b, 4 * L + i])
                    acc[L] = _fma32(d, np.float32(s), acc[L])
            out[t, r] = (((acc[0] + acc[4]) + (acc[2] + acc[6]))
                         + ((acc[1] + acc[5]) + (acc[3] + acc[7]))) + summs


def q4_1_matmul(raw: np.ndarray, cols: int, x: np.ndarray, tiled: np.ndarray | None = None) -> np.ndarray:
    """Fast path of `q4_1_matmul_ref` (numba, rows of W in parallel); identical floats."""
    x = _activations(x, cols)
    wb = _weights(raw, cols)
    xb = q8_1.quantize_x86(x).view(q8_1.BLOCK).reshape(x.shape[0], -1)
    out = np.empty((x.shape[0], wb.shape[0]), np.float32)
    _q4_1_matmul_kernel(np.ascontiguousarray(wb["qs"]), FP16_TO_FP32[wb["d"].view(np.uint16)],
                        FP16_TO_FP32[wb["m"].view(np.uint16)], np.ascontiguousarray(xb["qs"]),
                        FP16_TO_FP32[xb["d"].view(np.uint16)], FP16_TO_FP32[xb["s"].view(np.uint16)],
                        out)
    return out
