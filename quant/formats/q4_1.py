"""Q4_1: blocks of 32 values, fp16 scale `d`, fp16 offset `m` and 16 bytes `qs` of 4-bit codes
(20 bytes). Byte j of `qs` holds value j (low nibble) and value j + 16 (high nibble). Value k of a
block is code_k * d + m (two float32 roundings, no fused multiply-add).

ggml's reference quantizer (`quantize_row_q4_1_ref`), all in float32:
    min, max = the smallest and largest value (`if (v < min)`, `if (v > max)` from +-FLT_MAX)
    d = (max - min) / 15;  id = d ? 1/d : 0;  d and min are stored as fp16
    code = MIN(15, (int8_t)((x - min) * id + 0.5f))      (C's truncating conversion, c_int.py)
The codes use the float32 `d` and `min`, not the fp16 ones.
"""
from __future__ import annotations

import gguf
import numba
import numpy as np
from numba import prange

from exactedit.quant.formats.c_int import trunc_int8, trunc_int8_ref
from exactedit.quant.formats.f16 import FP16_TO_FP32, fp32_to_fp16_bits

NAME = "Q4_1"
QK, BLOCK_BYTES = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_1]
HALF = QK // 2
BLOCK = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (HALF,))])
assert BLOCK.itemsize == BLOCK_BYTES
OFF_QS = BLOCK.fields["qs"][1]

_HALF_UP = np.float32(0.5)
_FIFTEEN = np.float32(15)
_FLT_MAX = np.float32(np.finfo(np.float32).max)


def quantize_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, cols / 32 * 20]; numpy over (n_blocks, 32)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    xb = x.reshape(-1, QK)
    blocks = np.zeros(len(xb), dtype=BLOCK)
    lo = np.full(len(xb), _FLT_MAX)
    hi = np.full(len(xb), -_FLT_MAX)
    for j in range(QK):
        lo = np.where(xb[:, j] < lo, xb[:, j], lo)
        hi = np.where(xb[:, j] > hi, xb[:, j], hi)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = (hi - lo) / _FIFTEEN
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        v = (xb - lo[:, None]) * inv[:, None] + _HALF_UP
        codes = np.minimum(15, trunc_int8_ref(v)) & 0xFF
        blocks["d"] = d.astype(np.float16)
        blocks["m"] = lo.astype(np.float16)
    blocks["qs"] = (codes[:, :HALF] | (codes[:, HALF:] << 4)) & 0xFF
    return blocks.view(np.uint8).reshape(rows, cols // QK * BLOCK_BYTES)


def dequantize_ref(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 32 * 20] -> float32 [rows, cols]."""
    raw = np.ascontiguousarray(raw)
    b = raw.view(BLOCK).reshape(-1)
    q = np.concatenate([b["qs"] & 0xF, b["qs"] >> 4], axis=1).astype(np.float32)
    with np.errstate(invalid="ignore"):  # inf * 0 and inf - inf are NaN, as in C
        y = q * b["d"].astype(np.float32)[:, None] + b["m"].astype(np.float32)[:, None]
    return y.reshape(raw.shape[0], cols)


# ---- numba fast path -----------------------------------------------------------------------------

@numba.njit(error_model="numpy", cache=True)
def _quantize_row(x, out):
    for b in range(x.shape[0] // QK):
        xs = x[b * QK:(b + 1) * QK]
        lo = _FLT_MAX
        hi = -_FLT_MAX
        for j in range(QK):
            if xs[j] < lo:
                lo = xs[j]
            if xs[j] > hi:
                hi = xs[j]
        d = (hi - lo) / _FIFTEEN
        inv = np.float32(1) / d if d != 0 else np.float32(0)
        o = b * BLOCK_BYTES
        h = fp32_to_fp16_bits(d)
        out[o] = h & 0xFF
        out[o + 1] = h >> 8
        h = fp32_to_fp16_bits(lo)
        out[o + 2] = h & 0xFF
        out[o + 3] = h >> 8
        for j in range(HALF):
            c0 = min(15, trunc_int8((xs[j] - lo) * inv + _HALF_UP)) & 0xFF
            c1 = min(15, trunc_int8((xs[j + HALF] - lo) * inv + _HALF_UP)) & 0xFF
            out[o + OFF_QS + j] = (c0 | (c1 << 4)) & 0xFF


@numba.njit(error_model="numpy", cache=True)
def _dequantize_row(raw, out, fp16):
    nb = out.shape[0] // QK
    blocks = raw.reshape(nb, BLOCK_BYTES)
    y = out.reshape(nb, QK)
    half = y.shape[1] // 2  # = HALF; runtime bounds and one store stream per loop vectorize
    for b in range(nb):
        d = fp16[np.int64(blocks[b, 0]) | (np.int64(blocks[b, 1]) << 8)]
        m = fp16[np.int64(blocks[b, 2]) | (np.int64(blocks[b, 3]) << 8)]
        for j in range(half):
            y[b, j] = np.float32(np.int32(blocks[b, OFF_QS + j]) & 0xF) * d + m
        for j in range(half):
            y[b, j + half] = np.float32(np.int32(blocks[b, OFF_QS + j]) >> 4) * d + m


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
