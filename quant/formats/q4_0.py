"""Q4_0: blocks of 32 values, one fp16 scale `d` and 16 bytes `qs` of 4-bit codes (18 bytes).

Byte j of `qs` holds value j in its low nibble and value j + 16 in its high nibble. Value k of a
block is d * (code_k - 8).

ggml's reference quantizer (`quantize_row_q4_0_ref`), all in float32:
    max = the first value of largest |x| (as `if (amax < |x|)`, in index order), keeping its sign
    d   = max / -8;  id = d ? 1/d : 0;  d is stored as fp16 (round to nearest even)
    code = MIN(15, (int8_t)(x * id + 8.5f))        (C's truncating conversion, see c_int.py)
The codes use the float32 `d`, not the fp16 one.
"""
from __future__ import annotations

import gguf
import numba
import numpy as np
from numba import prange

from exactedit.quant.formats.c_int import trunc_int8, trunc_int8_ref
from exactedit.quant.formats.f16 import FP16_TO_FP32, fp32_to_fp16_bits

NAME = "Q4_0"
QK, BLOCK_BYTES = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_0]
HALF = QK // 2
BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (HALF,))])
assert BLOCK.itemsize == BLOCK_BYTES
OFF_QS = BLOCK.fields["qs"][1]

_BIAS = np.float32(8.5)
_NEG8 = np.float32(-8)


def signed_max_ref(xb: np.ndarray) -> np.ndarray:
    """Per row of xb [nb, QK]: the first value of largest magnitude (C's `if (amax < |v|)`)."""
    amax = np.zeros(len(xb), np.float32)
    vmax = np.zeros(len(xb), np.float32)
    for j in range(xb.shape[1]):
        ax = np.abs(xb[:, j])
        take = amax < ax
        amax = np.where(take, ax, amax)
        vmax = np.where(take, xb[:, j], vmax)
    return vmax


def quantize_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, cols / 32 * 18]; numpy over (n_blocks, 32)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    xb = x.reshape(-1, QK)
    blocks = np.zeros(len(xb), dtype=BLOCK)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = signed_max_ref(xb) / _NEG8
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        codes = np.minimum(15, trunc_int8_ref(xb * inv[:, None] + _BIAS)) & 0xFF
        blocks["d"] = d.astype(np.float16)
    blocks["qs"] = (codes[:, :HALF] | (codes[:, HALF:] << 4)) & 0xFF
    return blocks.view(np.uint8).reshape(rows, cols // QK * BLOCK_BYTES)


def dequantize_ref(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 32 * 18] -> float32 [rows, cols]."""
    raw = np.ascontiguousarray(raw)
    b = raw.view(BLOCK).reshape(-1)
    q = np.concatenate([b["qs"] & 0xF, b["qs"] >> 4], axis=1).astype(np.float32) - 8
    with np.errstate(invalid="ignore"):  # an inf scale times a 0 code is NaN, as in C
        return (q * b["d"].astype(np.float32)[:, None]).reshape(raw.shape[0], cols)


# ---- numba fast path -----------------------------------------------------------------------------

@numba.njit(error_model="numpy", cache=True)
def _quantize_row(x, out):
    for b in range(x.shape[0] // QK):
        xs = x[b * QK:(b + 1) * QK]
        amax = np.float32(0)
        vmax = np.float32(0)
        for j in range(QK):
            if amax < abs(xs[j]):
                amax = abs(xs[j])
                vmax = xs[j]
        d = vmax / _NEG8
        inv = np.float32(1) / d if d != 0 else np.float32(0)
        h = fp32_to_fp16_bits(d)
        o = b * BLOCK_BYTES
        out[o] = h & 0xFF
        out[o + 1] = h >> 8
        for j in range(HALF):
            lo = min(15, trunc_int8(xs[j] * inv + _BIAS)) & 0xFF
            hi = min(15, trunc_int8(xs[j + HALF] * inv + _BIAS)) & 0xFF
            out[o + OFF_QS + j] = (lo | (hi << 4)) & 0xFF


@numba.njit(error_model="numpy", cache=True)
def _dequantize_row(raw, out, fp16):
    nb = out.shape[0] // QK
    blocks = raw.reshape(nb, BLOCK_BYTES)
    y = out.reshape(nb, QK)
    half = y.shape[1] // 2  # = HALF; runtime bounds and one store stream per loop vectorize
    for b in range(nb):
        d = fp16[np.int64(blocks[b, 0]) | (np.int64(blocks[b, 1]) << 8)]
        for j in range(half):
            y[b, j] = np.float32((np.int32(blocks[b, OFF_QS + j]) & 0xF) - np.int32(8)) * d
        for j in range(half):
            y[b, j + half] = np.float32((np.int32(blocks[b, OFF_QS + j]) >> 4) - np.int32(8)) * d


@numba.njit(parallel=True, error_model="numpy", cache=True)
def quantize_into(x, out):
    """Fast path: float32 [rows, cols] -> uint8 [rows, row_bytes], rows in parallel."""
    for r in prange(x.shape[0]):
        _quantize_row(x[r], out[r])


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _dequantize_rows(raw, out, fp16):
    for r in prange(out.shape[0]):
        _dequantize_row(raw[r], out[r], fp16)


def dequantize_into(raw: np.ndarray, out: np.ndarray) -> None:
    """Fast path: uint8 [rows, row_bytes] -> float32 [rows, cols], rows in parallel."""
    _dequantize_rows(raw, out, FP16_TO_FP32)
