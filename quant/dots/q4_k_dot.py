"""ggml-cpu's Q4_K x Q8_K dot product (llama.cpp 0.3.36, x86-64 AVX2 + FMA build), bit for bit.

The kernel is `ggml_vec_dot_q4_K_q8_K`, AVX2 branch of ggml/src/ggml-cpu/arch/x86/quants.c (read at
ggml-org/llama.cpp 04e1dd75ab73c5c1814474138d8b18e9613f3d80). llama-cpp-python 0.3.36 ships one
libggml-cpu.so (no per-CPU variants) with no AVX-512 or VNNI instructions in it (no zmm, no
vpdpbusd), so this AVX2 branch is what runs even on an AVX-512 host; tests/quant/test_q4_k_dot.py
calls that library's kernel through ctypes and compares bits.

Weights W (Q4_K, rows r) times activations x (float32 rows t). x is quantized to Q8_K first
(quant/formats/q8_k.py: codes q, scale d_x, bsums bs[16] = sums of 16 codes). Per 256-wide block b
of a (row, activation) pair, all integer work exact in int32:
    sc[8], m[8]   the 6-bit sub-block scales and mins, unpacked from the 12 scale bytes as three
                  little-endian words w0, w1, w2 (kmask1 = 0x3f.., kmask2 = 0x0f.., kmask3 = 0x03..):
                      sc[0:4] = bytes of w0 & kmask1
                      sc[4:8] = bytes of (w2 & kmask2) | (((w0 >> 6) & kmask3) << 4)
                      m[0:4]  = bytes of w1 & kmask1
                      m[4:8]  = bytes of ((w2 >> 4) & kmask2) | (((w1 >> 6) & kmask3) << 4)
                  (the same numbers as get_scale_min_k4)
    u[e]          the 4-bit code of value e (sub-block s = e / 32: low nibbles of qs[32 g ..] for
                  s = 2 g, high nibbles for s = 2 g + 1)
    lane_L(b)   = sum_{s < 8} sc[s] sum_{i < 4} u[32 s + 4 L + i] q[32 s + 4 L + i]    (L < 8)
                  (maddubs pairs, madd with the broadcast scale, 8 int32 lanes, summed over s)
    mins_k(b)   = m[2k] (bs[4k] + bs[4k+1]) + m[2k+1] (bs[4k+2] + bs[4k+3])           (k < 4)
                  (hadd_epi16 of the bsums, madd with the mins: 4 int32 lanes)
    d(b)        = f32(d_x[b] * fp16(d_W[b]));   dm(b) = f32(-d_x[b] * fp16(dmin_W[b]))
then, over the blocks in order, two float32 FMA accumulators (8 lanes and 4 lanes, from 0):
    acc_L  = fma(d(b),  f32(lane_L(b)), acc_L)          (_mm256_fmadd_ps)
    accm_k = fma(dm(b), f32(mins_k(b)), accm_k)         (_mm_fmadd_ps)
and the result, every add a float32 rounding in this order:
    result = (((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7)))
             + ((accm_0 + accm_2) + (accm_1 + accm_3))
The lane and min integers stay below 2**24 (|lane| <= 32 * 63 * 15 * 127), so f32() is exact.
An all-zero activation block has d_x = 0 (ggml leaves its bsums unwritten; with finite weight
scales they are multiplied by -0 and add nothing).

Where the engine runs this kernel: once per (row, activation) for every micro-batch that the CPU
backend's plain mul_mat handles. Q4_K weights that ggml-cpu repacks (its CPU_REPACK buffer,
Q4_K 8x8 `ggml_gemv/gemm_q4_K_8x8_q8_K`) or llamafile's tiled path take other orders, not modelled
here.

`q4_k_matmul_ref` is the numpy reference (exact float64 integer dots, `fma32_ref`), `q4_k_matmul`
the numba fast path (LLVM's fma, no fastmath). Both agree bit for bit with each other and with
ggml (tests/quant/test_q4_k_dot.py).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from exactedit.errors import QuantError
from exactedit.quant.dots.fma32 import fma32 as _fma32, fma32_ref
from exactedit.quant.dots.q6_k_dot import LANE
from exactedit.quant.formats import q8_k
from exactedit.quant.formats.f16 import FP16_TO_FP32
from exactedit.quant.kquants import q4_k

__all__ = ["KMASK1", "KMASK2", "KMASK3", "q4_k_blocks", "q4_k_matmul", "q4_k_matmul_ref", "unpack_scales_mins",
           "scales_mins_ref"]

QK_K = q4_k.QK_K
KMASK1, KMASK2, KMASK3 = np.uint32(0x3F3F3F3F), np.uint32(0x0F0F0F0F), np.uint32(0x03030303)
LANE_FLAT = np.ascontiguousarray(LANE.reshape(-1))      # lane-major position k -> element e


def q4_k_blocks(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 256 * 144] -> Q4_K blocks [rows, nb] (structured, named fields)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    nb = cols // QK_K
    if cols % QK_K or raw.ndim != 2 or raw.shape[1] != nb * q4_k.BLOCK_BYTES:
        raise QuantError(f"Q4_K weights: expected uint8 [rows, {nb * q4_k.BLOCK_BYTES}] for {cols} "
                         f"columns, got {list(raw.shape)}")
    return raw.view(q4_k.BLOCK).reshape(raw.shape[0], nb)


def _activations(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] == 0 or x.shape[1] % QK_K:
        raise QuantError(f"Q4_K matmul: expected float32 activations [T, cols] with cols a multiple "
                         f"of {QK_K}, got {list(x.shape)}")
    if not np.isfinite(x).all():
        raise QuantError("Q4_K matmul: non-finite activations (the engine's result is not modelled)")
    return x


def scales_mins_ref(scales12: np.ndarray):
    """The 12-byte scales field [..., 12] -> (sc, m), int64 [..., 8] each, by ggml's utmp/kmask
    word arithmetic (little-endian 32-bit words)."""
    b = np.ascontiguousarray(scales12, np.uint8)
    w = b.view("<u4").reshape(b.shape[:-1] + (3,)).astype(np.uint32)
    w0, w1, w2 = w[..., 0], w[..., 1], w[..., 2]
    six, four = np.uint32(6), np.uint32(4)
    utmp = np.stack([w0 & KMASK1,
                     (w2 & KMASK2) | (((w0 >> six) & KMASK3) << four),
                     w1 & KMASK1,
                     ((w2 >> four) & KMASK2) | (((w1 >> six) & KMASK3) << four)], axis=-1)
    by = np.ascontiguousarray(utmp.astype("<u4")).view(np.uint8).reshape(b.shape[:-1] + (16,))
    return by[..., :8].astype(np.int64), by[..., 8:].astype(np.int64)


def _block_ints_ref(blk: np.ndarray, xq: np.ndarray):
    """Exact integer lanes [r, T, nb, 8] and min sums [r, T, nb, 4] (as float64)."""
    rows, nb = blk.shape
    T = xq.shape[0]
    sc, m = scales_mins_ref(blk["scales"])                                   # [r, nb, 8]
    u = q4_k.codes_ref(blk.reshape(-1)).reshape(rows, nb, QK_K)             # [r, nb, 256]
    w = (u * np.repeat(sc, 32, axis=-1)).astype(np.float64)                  # sc[e/32] u[e]
    q = xq["qs"].astype(np.float64)                                          # [T, nb, 256]
    lanes = np.empty((rows, T, nb, 8), np.float64)
    for b in range(nb):
        for L in range(8):
            lanes[:, :, b, L] = w[:, b, LANE[L]] @ q[:, b, LANE[L]].T      # exact: < 2**53
    bs = xq["bsums"].astype(np.int64).reshape(T, nb, 8, 2).sum(-1)        # hadd_epi16: [T, nb, 8]
    mins = np.einsum("rbkj,tbkj->rtbk", m.reshape(rows, nb, 4, 2).astype(np.float64),
                     bs.reshape(T, nb, 4, 2).astype(np.float64))
    return lanes, mins


def q4_k_matmul_ref(raw_rows: np.ndarray, x: np.ndarray, chunk: int = 256) -> np.ndarray:
    """Reference: float32 [T, rows] = W (Q4_K, raw rows) @ x[t], one ggml_vec_dot_q4_K_q8_K per
    (row, activation), in numpy."""
    x = _activations(x)
    cols = x.shape[1]
    blk_all = q4_k_blocks(raw_rows, cols)
    xq = q8_k.quantize_ref(x)                                                # [T, nb]
    dx = xq["d"].astype(np.float32)[None]                                    # [1, T, nb]
    out = np.empty((x.shape[0], blk_all.shape[0]), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for r0 in range(0, blk_all.shape[0], chunk):
            blk = blk_all[r0:r0 + chunk]
            lanes, mins = _block_ints_ref(blk, xq)
            dw = blk["d"].astype(np.float32)[:, None, :]                     # [r, 1, nb]
            dmw = blk["dmin"].astype(np.float32)[:, None, :]
            d = (dx * dw).astype(np.float32)                                 # [r, T, nb]
            dm = ((-dx) * dmw).astype(np.float32)
            acc = np.zeros(lanes.shape[:2] + (8,), np.float32)
            accm = np.zeros(lanes.shape[:2] + (4,), np.float32)
            for b in range(lanes.shape[2]):
                acc = fma32_ref(np.broadcast_to(d[..., b, None], acc.shape),
                                lanes[:, :, b].astype(np.float32), acc)
                accm = fma32_ref(np.broadcast_to(dm[..., b, None], accm.shape),
                                 mins[:, :, b].astype(np.float32), accm)
            h = acc[..., 4:] + acc[..., :4]
            hm = accm[..., 2:] + accm[..., :2]
            total = ((h[..., 0] + h[..., 2]) + (h[..., 1] + h[..., 3])) + (hm[..., 0] + hm[..., 1])
            out[:, r0:r0 + chunk] = total.T
    return out


@numba.njit(cache=True)
def unpack_scales_mins(scales12, sc, mn):
    """ggml's get_scale_min_k4 of one super-block's 12 scale bytes: the 8 sub-block scales into
    sc[0:8] and the 8 mins into mn[0:8] (int32), for the numba kernels."""
    for j in range(4):
        lo, mid, hi = np.int32(scales12[j]), np.int32(scales12[4 + j]), np.int32(scales12[8 + j])
        sc[j] = lo & 63
        mn[j] = mid & 63
        sc[j + 4] = (hi & 0xF) | ((lo >> 6) << 4)
        mn[j + 4] = (hi >> 4) | ((mid >> 6) << 4)


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _q4_k_matmul_kernel(wqs, wsc, wd, wdm, qL, bsums, dx, lane_flat, out):
    """wqs [rows, nb, 128] packed nibbles, wsc [rows, nb, 12] scale bytes, wd / wdm [rows, nb]
    float32 (fp16 d, dmin); qL [T, nb, 256] int16 Q8_K codes in lane-major order (LANE),
    bsums [T, nb, 16], dx [T, nb]. One (row, activation) pair is one ggml_vec_dot_q4_K_q8_K."""
    rows, nb = wd.shape
    T = qL.shape[0]
    for r in prange(rows):
        sc = np.empty((nb, 8), np.int32)
        mn = np.empty((nb, 8), np.int32)
        w = np.empty(QK_K, np.int16)
        wl = np.empty((nb, QK_K), np.int16)
        for b in range(nb):
            unpack_scales_mins(wsc[r, b], sc[b], mn[b])
            for g in range(4):
                for l in range(32):
                    c = np.int32(wqs[r, b, 32 * g + l])
                    w[64 * g + l] = (c & 0xF) * sc[b, 2 * g]      # <= 15 * 63: fits int16
                    w[64 * g + 32 + l] = (c >> 4) * sc[b, 2 * g + 1]
            for k in range(QK_K):
                wl[b, k] = w[lane_flat[k]]
        acc = np.empty(8, np.float32)
        accm = np.empty(4, np.float32)
        for t in range(T):
            acc[:] = 0
            accm[:] = 0
            for b in range(nb):
                d = dx[t, b] * wd[r, b]
                dm = (-dx[t, b]) * wdm[r, b]
                for L in range(8):
                    s = np.int32(0)
                    for k in range(32 * L, 32 * L + 32):
                        s += np.int32(wl[b, k]) * np.int32(qL[t, b, k])
                    acc[L] = _fma32(d, np.float32(s), acc[L])
                for k in range(4):
                    p = (mn[b, 2 * k] * (np.int32(bsums[t, b, 4 * k]) + np.int32(bsums[t, b, 4 * k + 1]))
                         + mn[b, 2 * k + 1] * (np.int32(bsums[t, b, 4 * k + 2])
                                               + np.int32(bsums[t, b, 4 * k + 3])))
                    accm[k] = _fma32(dm, np.float32(p), accm[k])
            out[t, r] = ((((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])))
                         + ((accm[0] + accm[2]) + (accm[1] + accm[3])))


def q4_k_matmul(raw_rows: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Fast path of `q4_k_matmul_ref` (numba, rows of W in parallel); identical floats."""
    x = _activations(x)
    blk = q4_k_blocks(raw_rows, x.shape[1])
    xq = q8_k.quantize(x)
    out = np.empty((x.shape[0], blk.shape[0]), np.float32)
    _q4_k_matmul_kernel(np.ascontiguousarray(blk["qs"]), np.ascontiguousarray(blk["scales"]),
                        FP16_TO_FP32[blk["d"].view(np.uint16)], FP16_TO_FP32[blk["dmin"].view(np.uint16)],
                        np.ascontiguousarray(xq["qs"].astype(np.int16)[:, :, LANE_FLAT]),
                        np.ascontiguousarray(xq["bsums"]), np.ascontiguousarray(xq["d"]),
                        LANE_FLAT, out)
    return out
