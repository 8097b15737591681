"""ggml-cpu's tiled Q6_K x Q8_K product (micro-batches of >= 8 rows) through float32 BLAS, exactly.

The tiled kernel adds, per 256-wide block b, one exact integer per (weight row r, activation t),
    total_b = sum_L lane_L(b) = sum_e sc[e/16] u[e] q8[e] - 32 sum_j sc[j] bsum[j]
            = sum_e w[e] q8[e],   w = sc[e/16] (u[e] - 32)   (|w| <= 4096, |q8| <= 127)
then acc = fma(f32(d_W[b] * f32(total_b)), d_x[b], acc) over the blocks in order
(quant/dots/q6_k_dot.py). The integer part is a matrix product of small integers, computed here with
float32 sgemm, one per half block (a batched matmul, k = 128; a block's two halves are then added
in float64, exactly). Why an entry is exact where it is used: each product w q8 is an integer
below 2**19, and any partial sum BLAS forms, in whatever order and blocking, is a sum of some of
those products, bounded by A = sum |w q8| <= ||w||_2 ||q8||_2 over the half (Cauchy-Schwarz).
Where that bound is below 2**24 every partial sum is an integer float32 holds exactly, so the
sgemm entry is the half's integer itself; an entry whose bound is not below it is recomputed as
an integer dot. Measured on Qwen2.5-Coder-1.5B's head with Gaussian activations: the largest
half-block bound is 0.80 of 2**24, so no entry needs it (whole blocks, k = 256, would leave 16%
of the bounds unproven, whose integer dots cost more than the smaller sgemms). The per-block
float32 steps are a numba loop. Same floats as the lane-by-lane kernel, bit for bit (tests/quant/test_dot.py,
tests/quant/test_q6_k_gemm.py).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from exactedit.quant.dots.fma32 import fma32 as _fma32

__all__ = ["EXACT_LIMIT", "PART", "PARTS", "ROW_CHUNK", "tiled_matmul"]

QK_K = 256
PARTS = 2                 # sgemm parts per block, each proven exact (or recomputed) on its own
PART = QK_K // PARTS
ROW_CHUNK = 4096          # weight rows per sgemm batch: [4096, nb * 256] weights, [2 nb, 4096, T] sums
#: a Cauchy-Schwarz bound (computed in float64, relative error < 1e-15) below this proves an
#: sgemm entry exact: every partial sum is then an integer below 2**24
EXACT_LIMIT = float(2 ** 24) * (1 - 1e-9)


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _signed_weights(ql, qh, sc, out, out32, norm):
    """out [rows, nb * 256] int16 = sc[e/16] * (u[e] - 32) of each Q6_K block (|.| <= 4096),
    out32 the same values as float32, laid out [nb * PARTS, rows, PART] for the sgemm;
    norm [rows, nb * PARTS] float64 = the Euclidean norm of each part (exact sums of squares)."""
    rows, nb = sc.shape[0], sc.shape[1]
    for r in prange(rows):
        for b in range(nb):
            o = QK_K * b
            for half in range(2):
                for l in range(32):
                    lo0 = np.int32(ql[r, b, 64 * half + l])
                    lo1 = np.int32(ql[r, b, 64 * half + 32 + l])
                    h = np.int32(qh[r, b, 32 * half + l])
                    e = 128 * half + l
                    out[r, o + e] = np.int32(sc[r, b, e // 16]) * (((lo0 & 15) | ((h & 3) << 4)) - 32)
                    out[r, o + e + 32] = np.int32(sc[r, b, (e + 32) // 16]) * (
                        ((lo1 & 15) | (((h >> 2) & 3) << 4)) - 32)
                    out[r, o + e + 64] = np.int32(sc[r, b, (e + 64) // 16]) * (
                        ((lo0 >> 4) | (((h >> 4) & 3) << 4)) - 32)
                    out[r, o + e + 96] = np.int32(sc[r, b, (e + 96) // 16]) * (
                        ((lo1 >> 4) | (((h >> 6) & 3) << 4)) - 32)
        for p in range(nb * PARTS):
            ss = np.int64(0)
            for k in range(PART):
                v = out[r, PART * p + k]
                out32[p, r, k] = v
                ss += np.int64(v) * np.int64(v)
            norm[r, p] = np.sqrt(np.float64(ss))


@numba.njit(error_model="numpy", cache=True, inline="always")
def _int_dot(w16, r, p, q16, t):
    """sum_k w16[r, PART p + k] q16[p, t, k] over part p of a row, exactly (int64)."""
    s = np.int64(0)
    for k in range(PART):
        s += np.int64(w16[r, PART * p + k]) * np.int64(q16[p, t, k])
    return s


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _fold_blocks(totals, w16, q16, wnorm, qnorm, qmax, dw, dxT, out):
    """out[r, t] = the tiled kernel's float32 accumulation over the blocks of the sgemm entries
    totals [nb * PARTS, rows, T] (an entry whose bound wnorm * qnorm is not below EXACT_LIMIT is
    recomputed first as the integer dot of w16 [rows, nb * 256] and q16 [nb * PARTS, T, PART];
    qmax [nb * PARTS] = the largest qnorm of each part, for the common all-proven case); a
    block's parts are added in float64 (exact integers). dxT [nb, T]: the Q8_K scales."""
    nparts, rows, T = totals.shape
    for r in prange(rows):
        acc = out[r]
        acc[:] = 0
        block = np.empty(T, np.float64)
        for b in range(nparts // PARTS):
            block[:] = 0
            for p in range(PARTS * b, PARTS * (b + 1)):
                part = totals[p, r]
                if wnorm[r, p] * qmax[p] < EXACT_LIMIT:
                    for t in range(T):
                        block[t] += np.float64(part[t])
                else:
                    for t in range(T):
                        if wnorm[r, p] * qnorm[p, t] < EXACT_LIMIT:
                            block[t] += np.float64(part[t])
                        else:
                            block[t] += np.float64(_int_dot(w16, r, p, q16, t))
            d, dx = dw[r, b], dxT[b]
            for t in range(T):
                acc[t] = _fma32(d * np.float32(block[t]), dx[t], acc[t])


def tiled_matmul(blk: np.ndarray, xq: np.ndarray) -> np.ndarray:
    """float32 [T, rows]: Q6_K blocks blk [rows, nb] (structured, quant.kquants.q6_k.BLOCK) times the
    Q8_K activation blocks xq [T, nb] (quant.formats.q8_k.BLOCK), as ggml-cpu's tiled kernel computes it."""
    rows, nb = blk.shape
    T = xq.shape[0]
    codes = xq["qs"].astype(np.int16).reshape(T, nb * PARTS, PART)
    q16 = np.ascontiguousarray(codes.transpose(1, 0, 2))                        # [parts, T, PART]
    q = np.ascontiguousarray(q16.astype(np.float32).transpose(0, 2, 1))         # [parts, PART, T]
    qnorm = np.sqrt((q16.astype(np.float64) ** 2).sum(axis=2))                  # [parts, T], exact sums
    qmax = qnorm.max(axis=1)
    dxT = np.ascontiguousarray(xq["d"].T, np.float32)
    out = np.empty((rows, T), np.float32)
    for r0 in range(0, rows, ROW_CHUNK):
        part = blk[r0:r0 + ROW_CHUNK]
        k = part.shape[0]
        w16 = np.empty((k, nb * QK_K), np.int16)
        w = np.empty((nb * PARTS, k, PART), np.float32)
        wnorm = np.empty((k, nb * PARTS), np.float64)
        _signed_weights(np.ascontiguousarray(part["ql"]), np.ascontiguousarray(part["qh"]),
                        np.ascontiguousarray(part["scales"]), w16, w, wnorm)
        totals = np.matmul(w, q)                                                # sgemm per part
        _fold_blocks(totals, w16, q16, wnorm, qnorm, qmax, part["d"].astype(np.float32), dxT,
                     out[r0:r0 + k])
    return np.ascontiguousarray(out.T)
