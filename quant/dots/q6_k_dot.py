"""ggml-cpu's Q6_K x Q8_K dot product (llama.cpp 0.3.36, x86-64 AVX2 + FMA build), bit for bit.

Weights W (Q6_K, rows r) times activations x (float32 rows t), per 256-wide block b:

    q8 = Q8_K(x[t]);  u = the 6-bit codes of W[r] (0..63);  sc = its int8 sub-block scales
    lane_L(b) = sum_{e in lane L} sc[e/16] u[e] q8[e] - 32 (sc[2L] bsum[2L] + sc[2L+1] bsum[2L+1])
        with lane L = elements {32 j + 4 L + i : j < 8, i < 4}  (exact int32)
    tiled path (a micro-batch of >= 8 rows):
        acc = 0;  for b: acc = fma(f32(d_W[b] * f32(sum_L lane_L(b))), d_x[b], acc)
    vec_dot path (a micro-batch of < 8 rows):
        acc_L = 0;  for b: acc_L = fma(f32(d_x[b] * d_W[b]), f32(lane_L(b)), acc_L)
        result = ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))

`q6_k_matmul_ref` is the numpy reference (integer dots as exact float64 matmuls, an exact float32
fma); `q6_k_matmul` the fast path: tiled rows through float64 BLAS block sums and a numba fold
(quant/dots/q6_k_gemm.py), vec_dot rows through the numba lane kernel below (LLVM's fma). Both agree bit for bit
(tests/quant/test_dot.py); the live tests compare them with the engine.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from exactedit.quant.kquants import q6_k
from exactedit.quant.formats import q8_k
from exactedit.errors import QuantError
from exactedit.quant.dots.fma32 import fma32 as _fma32, fma32_ref

__all__ = ["LANE", "TILED_MIN_ROWS", "q6_k_blocks", "q6_k_matmul", "q6_k_matmul_ref"]

TILED_MIN_ROWS = 8    # ggml-cpu's tiled K-quant matmul takes micro-batches of >= 8 rows
LANE = np.array([32 * j + 4 * L + i for L in range(8) for j in range(8) for i in range(4)]).reshape(8, 32)


def q6_k_blocks(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, row_bytes] -> Q6_K blocks [rows, nb] (structured, named fields), validated."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    nb = cols // q6_k.QK_K
    if cols % q6_k.QK_K or raw.ndim != 2 or raw.shape[1] != nb * q6_k.BLOCK_BYTES:
        raise QuantError(f"Q6_K: expected uint8 [rows, {nb * q6_k.BLOCK_BYTES}] for {cols} columns, "
                         f"got {list(raw.shape)}")
    return raw.view(q6_k.BLOCK).reshape(raw.shape[0], nb)


def _q6_k_parts(raw: np.ndarray, cols: int):
    """uint8 [rows, row_bytes] -> unsigned codes u [rows, nb, 256] (0..63), scales [rows, nb, 16]
    int8, d [rows, nb] float32."""
    blk = q6_k_blocks(raw, cols)
    ql, qh = blk["ql"].astype(np.uint8), blk["qh"].astype(np.uint8)
    u = np.empty(blk.shape + (q6_k.QK_K,), np.uint8)
    for half in range(2):
        l4, h2 = ql[..., 64 * half:64 * half + 64], qh[..., 32 * half:32 * half + 32]
        o = 128 * half
        u[..., o + 0:o + 32] = (l4[..., :32] & 15) | ((h2 & 3) << 4)
        u[..., o + 32:o + 64] = (l4[..., 32:] & 15) | (((h2 >> 2) & 3) << 4)
        u[..., o + 64:o + 96] = (l4[..., :32] >> 4) | (((h2 >> 4) & 3) << 4)
        u[..., o + 96:o + 128] = (l4[..., 32:] >> 4) | (((h2 >> 6) & 3) << 4)
    return u, blk["scales"].astype(np.int8), blk["d"].astype(np.float32)


def _lanes_ref(u, sc, xq) -> np.ndarray:
    """Exact int lanes [rows, T, nb, 8] (as float64) of the AVX2 Q6_K x Q8_K block dot."""
    rows, nb = u.shape[:2]
    T = xq.shape[0]
    w = u.astype(np.float64) * np.repeat(sc.astype(np.float64), 16, axis=-1)      # sc[e/16] u[e]
    q = xq["qs"].astype(np.float64)                                                # [T, nb, 256]
    out = np.empty((rows, T, nb, 8), np.float64)
    for b in range(nb):
        for L in range(8):
            out[:, :, b, L] = w[:, b, LANE[L]] @ q[:, b, LANE[L]].T             # exact: < 2**53
    bs = xq["bsums"].astype(np.float64).reshape(T, nb, 8, 2)
    s2 = sc.astype(np.float64).reshape(rows, nb, 8, 2)
    out -= 32 * np.einsum("rblk,tblk->rtbl", s2, bs)
    return out


def q6_k_matmul_ref(raw: np.ndarray, cols: int, x: np.ndarray, tiled: np.ndarray,
                    chunk: int = 2048) -> np.ndarray:
    """Reference: float32 [T, rows] = W (Q6_K, raw rows) @ x[t] as ggml-cpu computes it; row t
    takes the tiled kernel where `tiled[t]`, else vec_dot."""
    x = np.ascontiguousarray(x, np.float32)
    xq = q8_k.quantize_ref(x)
    tiled = np.asarray(tiled, bool)
    out = np.empty((x.shape[0], raw.shape[0]), np.float32)
    for r0 in range(0, raw.shape[0], chunk):
        u, sc, d = _q6_k_parts(raw[r0:r0 + chunk], cols)
        lanes = _lanes_ref(u, sc, xq)                       # [r, T, nb, 8]
        dw, dx = d[:, None, :], xq["d"][None, :, :]        # [r, 1, nb], [1, T, nb]
        acc = np.zeros(lanes.shape[:2], np.float32)
        acc8 = np.zeros(lanes.shape[:2] + (8,), np.float32)
        for b in range(lanes.shape[2]):
            res = (dw[..., b] * lanes[:, :, b, :].sum(-1).astype(np.float32)).astype(np.float32)
            acc = fma32_ref(res, np.broadcast_to(dx[..., b], acc.shape), acc)
            db = (dx[..., b] * dw[..., b]).astype(np.float32)[..., None]
            acc8 = fma32_ref(np.broadcast_to(db, acc8.shape), lanes[:, :, b, :].astype(np.float32), acc8)
        h = acc8[..., 4:] + acc8[..., :4]
        vec = (h[..., 0] + h[..., 2]) + (h[..., 1] + h[..., 3])
        out[:, r0:r0 + chunk] = np.where(tiled[None, :], acc, vec).T
    return out


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _q6_k_matmul_kernel(ql, qh, sc, dw, qL, bsums, dx, tiled, lane_index, out):
    """qL: the Q8_K codes as int16 [T, nb, 256] in lane-major order (lane L's 32 elements at
    32 L .. 32 L + 31, see LANE), so each lane is a contiguous integer dot that vectorizes."""
    rows, nb = dw.shape
    T = qL.shape[0]
    for r in prange(rows):
        w = np.empty(256, np.int16)
        wl = np.empty(256, np.int16)
        acc = np.zeros(T, np.float32)
        acc8 = np.zeros((T, 8), np.float32)
        lanes = np.empty(8, np.int32)
        for b in range(nb):
            for half in range(2):
                for l in range(32):
                    lo0 = np.int32(ql[r, b, 64 * half + l])
                    lo1 = np.int32(ql[r, b, 64 * half + 32 + l])
                    h = np.int32(qh[r, b, 32 * half + l])
                    o = 128 * half + l
                    w[o] = (lo0 & 15) | ((h & 3) << 4)
                    w[o + 32] = (lo1 & 15) | (((h >> 2) & 3) << 4)
                    w[o + 64] = (lo0 >> 4) | (((h >> 4) & 3) << 4)
                    w[o + 96] = (lo1 >> 4) | (((h >> 6) & 3) << 4)
            for e in range(256):
                w[e] = w[e] * np.int16(sc[r, b, e // 16])        # |u * sc| <= 63 * 128: fits int16
            for k in range(256):
                wl[k] = w[lane_index[k]]
            dwb = dw[r, b]
            for t in range(T):
                total = np.int32(0)
                for L in range(8):
                    s = np.int32(0)
                    for k in range(32 * L, 32 * L + 32):
                        s += np.int32(wl[k]) * np.int32(qL[t, b, k])
                    s -= 32 * (np.int32(sc[r, b, 2 * L]) * np.int32(bsums[t, b, 2 * L])
                               + np.int32(sc[r, b, 2 * L + 1]) * np.int32(bsums[t, b, 2 * L + 1]))
                    lanes[L] = s
                    total += s
                if tiled[t]:
                    acc[t] = _fma32(dwb * np.float32(total), dx[t, b], acc[t])
                else:
                    db = dx[t, b] * dwb
                    for L in range(8):
                        acc8[t, L] = _fma32(db, np.float32(lanes[L]), acc8[t, L])
        for t in range(T):
            if tiled[t]:
                out[t, r] = acc[t]
            else:
                a = acc8[t]
                out[t, r] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))


def _vec_dot_matmul(blk: np.ndarray, xq: np.ndarray) -> np.ndarray:
    """The lane-by-lane numba kernel, every activation row on the vec_dot path."""
    out = np.empty((xq.shape[0], blk.shape[0]), np.float32)
    _q6_k_matmul_kernel(np.ascontiguousarray(blk["ql"]), np.ascontiguousarray(blk["qh"]),
                        np.ascontiguousarray(blk["scales"]), blk["d"].astype(np.float32),
                        np.ascontiguousarray(xq["qs"].astype(np.int16)[:, :, LANE.reshape(-1)]),
                        np.ascontiguousarray(xq["bsums"]), np.ascontiguousarray(xq["d"]),
                        np.zeros(xq.shape[0], np.bool_), np.ascontiguousarray(LANE.reshape(-1)), out)
    return out


def q6_k_matmul(raw: np.ndarray, cols: int, x: np.ndarray, tiled: np.ndarray) -> np.ndarray:
    """Fast path of `q6_k_matmul_ref`; identical floats. Rows on the tiled path go through exact
    float64 BLAS block sums (quant/dots/q6_k_gemm.py), vec_dot rows through the numba lane kernel."""
    from exactedit.quant.dots.q6_k_gemm import tiled_matmul

    blk = q6_k_blocks(raw, cols)
    xq = q8_k.quantize(np.ascontiguousarray(x, np.float32))
    tiled = np.asarray(tiled, dtype=np.bool_)
    out = np.empty((x.shape[0], blk.shape[0]), np.float32)
    if tiled.any():
        out[tiled] = tiled_matmul(blk, xq[tiled])
    if not tiled.all():
        out[~tiled] = _vec_dot_matmul(blk, xq[~tiled])
    return out
