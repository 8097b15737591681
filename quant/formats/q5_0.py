"""Q5_0: blocks of 32 values, fp16 scale `d`, 4 bytes `qh` of fifth bits and 16 bytes `qs` of low
nibbles (22 bytes). Byte j of `qs` holds the low 4 bits of value j (low nibble) and of value j + 16
(high nibble); bit k of the little-endian uint32 `qh` is bit 4 of value k. Value k of a block is
d * (code_k - 16).

ggml's reference quantizer (`quantize_row_q5_0_ref`), all in float32:
    max = the first value of largest |x| (as `if (amax < |x|)`), keeping its sign
    d   = max / -16;  id = d ? 1/d : 0;  d is stored as fp16 (round to nearest even)
    code = MIN(31, (int8_t)(x * id + 16.5f))       (C's truncating conversion, see c_int.py)
The codes use the float32 `d`, not the fp16 one.
"""
from __future__ import annotations

import gguf
import numba
import numpy as np
from numba import prange

from exactedit.quant.formats.c_int import trunc_int8, trunc_int8_ref
from exactedit.quant.formats.f16 import FP16_TO_FP32, fp32_to_fp16_bits
from exactedit.quant.formats.q4_0 import signed_max_ref

NAME = "Q5_0"
QK, BLOCK_BYTES = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q5_0]
HALF = QK // 2
BLOCK = np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", (HALF,))])
assert BLOCK.itemsize == BLOCK_BYTES
OFF_QH, OFF_QS = BLOCK.fields["qh"][1], BLOCK.fields["qs"][1]

_BIAS = np.float32(16.5)
_NEG16 = np.float32(-16)
_BITS = np.uint32(1) << np.arange(QK, dtype=np.uint32)


def quantize_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, cols / 32 * 22]; numpy over (n_blocks, 32)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    xb = x.reshape(-1, QK)
    blocks = np.zeros(len(xb), dtype=BLOCK)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = signed_max_ref(xb) / _NEG16
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        codes = np.minimum(31, trunc_int8_ref(xb * inv[:, None] + _BIAS)) & 0xFF
        blocks["d"] = d.astype(np.float16)
    blocks["qs"] = (codes[:, :HALF] & 0xF) | ((codes[:, HALF:] & 0xF) << 4)
    blocks["qh"] = np.where((codes & 0x10) != 0, _BITS, np.uint32(0)).sum(axis=1, dtype=np.uint32)
    return blocks.view(np.uint8).reshape(rows, cols // QK * BLOCK_BYTES)


def dequantize_ref(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 32 * 22] -> float32 [rows, cols]."""
    raw = np.ascontiguousarray(raw)
    b = raw.view(BLOCK).reshape(-1)
    high = ((b["qh"][:, None] & _BITS) != 0).astype(np.int32) << 4
    low = np.concatenate([b["qs"] & 0xF, b["qs"] >> 4], axis=1).astype(np.int32)
    q = ((low | high) - 16).astype(np.float32)
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
        d = vmax / _NEG16
        inv = np.float32(1) / d if d != 0 else np.float32(0)
        h = fp32_to_fp16_bits(d)
        o = b * BLOCK_BYTES
        out[o] = h & 0xFF
        out[o + 1] = h >> 8
        qh = np.int64(0)
        for j in range(HALF):
            c0 = min(31, trunc_int8(xs[j] * inv + _BIAS)) & 0xFF
            c1 = min(31, trunc_int8(xs[j + HALF] * inv + _BIAS)) & 0xFF
            out[o + OFF_QS + j] = (c0 & 0xF) | ((c1 & 0xF) << 4)
            qh |= ((c0 >> 4) & 1) << j
            qh |= ((c1 >> 4) & 1) << (j + HALF)
        for k in range(4):
            out[o + OFF_QH + k] = (qh >> (8 * k)) & 0xFF


@numba.njit(error_model="numpy", cache=True)
def _dequantize_row(raw, out, fp16):
    nb = out.shape[0] // QK
    blocks = raw.reshape(nb, BLOCK_BYTES)
    y = out.reshape(nb, QK)
    for b in range(nb):
        d = fp16[np.int64(blocks[b, 0]) | (np.int64(blocks[b, 1]) << 8)]
        qh = np.int64(0)
        for k in range(4):
            qh |= np.int64(blocks[b, OFF_QH + k]) << (8 * k)
        for j in range(HALF):
            q = np.int64(blocks[b, OFF_QS + j])
            c0 = (q & 0xF) | (((qh >> j) & 1) << 4)
            c1 = (q >> 4) | (((qh >> (j + HALF)) & 1) << 4)
            y[b, j] = np.float32(c0 - 16) * d
            y[b, j + HALF] = np.float32(c1 - 16) * d


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
