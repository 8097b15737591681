"""Q8_K: ggml's activation format for K-quant dot products (never stored in a GGUF).

A block holds 256 values: float32 `d`, 256 int8 codes `qs` and 16 int16 `bsums` (the sum of
each run of 16 codes): 292 bytes. ggml-cpu quantizes the float32 activation row with
`quantize_row_q8_K_ref` before every matmul against K-quant weights (Q2_K..Q6_K), all in
float32:
    max  = the first value of largest |x| (as `if (|x| > amax)`, in index order), keeping its sign
    amax == 0  ->  d = 0, qs = 0 (bsums are left unwritten by ggml; here they are 0)
    iscale = -127 / max;  qs = min(127, nearest(iscale * x))  (round half to even)
    bsums[j] = sum(qs[16 j : 16 j + 16]);  d = 1 / iscale
Dequantized value: d * qs. Bit-exact with ggml (checked against the library in
tests/quant/test_q8_k.py).
"""
from __future__ import annotations

import gguf
import numba
import numpy as np
from numba import prange

from exactedit.quant.formats.c_int import nearest_int, nearest_int_ref

NAME = "Q8_K"
QK, BLOCK_BYTES = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_K]
N_SUMS = QK // 16
BLOCK = np.dtype([("d", "<f4"), ("qs", "i1", (QK,)), ("bsums", "<i2", (N_SUMS,))])
assert BLOCK.itemsize == BLOCK_BYTES


def _check(x: np.ndarray) -> np.ndarray:
    from exactedit.errors import QuantError

    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK != 0:
        raise QuantError(f"Q8_K: expected float32 [rows, cols] with cols a multiple of {QK}, "
                         f"got shape {list(x.shape)}")
    return x


def quantize_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> Q8_K blocks [rows, cols / 256] (structured `BLOCK`); numpy over
    (n_blocks, 256)."""
    x = _check(x)
    rows, cols = x.shape
    xb = x.reshape(-1, QK)
    nb = xb.shape[0]
    amax = np.zeros(nb, np.float32)
    vmax = np.zeros(nb, np.float32)
    for j in range(QK):  # `if (ax > amax)`: the first of equal magnitudes wins, NaN never does
        ax = np.abs(xb[:, j])
        take = ax > amax
        amax = np.where(take, ax, amax)
        vmax = np.where(take, xb[:, j], vmax)
    blocks = np.zeros(nb, dtype=BLOCK)
    live = amax != 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = np.where(live, np.float32(-127) / np.where(live, vmax, 1), 0).astype(np.float32)
        # ggml: qs = (int8_t) MIN(127, nearest_int(iscale * x)); a tiny block's iscale overflows to
        # -inf, and nearest_int maps +-inf and NaN to -2^22, whose low byte is 0
        v = np.minimum(nearest_int_ref((iscale[:, None] * xb).astype(np.float32)), 127)
        qs = np.where(live[:, None], ((v + 128) & 0xFF) - 128, 0).astype(np.int8)
        blocks["qs"] = qs
        blocks["bsums"] = qs.reshape(nb, N_SUMS, 16).astype(np.int32).sum(axis=2).astype(np.int16)
        blocks["d"] = np.where(live, np.float32(1) / np.where(live, iscale, 1), 0).astype(np.float32)
    return blocks.reshape(rows, cols // QK)


def dequantize_ref(blocks: np.ndarray) -> np.ndarray:
    """Q8_K blocks [rows, nb] -> float32 [rows, nb * 256]."""
    y = blocks["qs"].astype(np.float32) * blocks["d"][..., None]
    return y.reshape(blocks.shape[0], -1)


@numba.njit(error_model="numpy", cache=True)
def _quantize_row(x, d, qs, bsums):
    for b in range(d.shape[0]):
        xs = x[b * QK:(b + 1) * QK]
        amax = np.float32(0)
        vmax = np.float32(0)
        for j in range(QK):
            ax = abs(xs[j])
            if ax > amax:
                amax = ax
                vmax = xs[j]
        if amax == 0:
            d[b] = 0
            qs[b, :] = 0
            bsums[b, :] = 0
            continue
        iscale = np.float32(-127) / vmax
        for j in range(QK):
            v = nearest_int(np.float32(iscale * xs[j]))      # (int8_t) MIN(127, nearest_int(.)), as ggml
            v = v if v < 127 else np.int64(127)
            qs[b, j] = np.int8(((v + 128) & 0xFF) - 128)
        for j in range(N_SUMS):
            s = 0
            for i in range(16):
                s += np.int32(qs[b, j * 16 + i])
            bsums[b, j] = s
        d[b] = np.float32(1) / iscale


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _quantize_rows(x, d, qs, bsums):
    for r in prange(x.shape[0]):
        _quantize_row(x[r], d[r], qs[r], bsums[r])


def quantize(x: np.ndarray) -> np.ndarray:
    """Fast path of `quantize_ref` (numba, rows in parallel); same blocks, bit for bit."""
    x = _check(x)
    rows, nb = x.shape[0], x.shape[1] // QK
    d = np.empty((rows, nb), np.float32)
    qs = np.empty((rows, nb, QK), np.int8)
    bsums = np.empty((rows, nb, N_SUMS), np.int16)
    _quantize_rows(x, d, qs, bsums)
    blocks = np.empty((rows, nb), dtype=BLOCK)
    blocks["d"], blocks["qs"], blocks["bsums"] = d, qs, bsums
    return blocks
