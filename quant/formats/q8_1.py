"""Q8_1: ggml's activation format for Q4_1 (and Q5_1) dot products (never stored in a GGUF).

A block holds 32 values: fp16 `d`, fp16 `s` and 32 int8 codes `qs`: 36 bytes (gguf-py's table
still lists an older 40-byte layout with float32 d and s; ggml's type traits say 36, checked in
tests/quant/test_q4_1_dot.py). ggml-cpu's x86 build quantizes a float32 activation row with its
AVX2 `quantize_row_q8_1`, the same arithmetic as its Q8_0 activation quantizer
(quant.formats.q8_0.quantize_x86) plus the block sum:
    amax = max |x|;  d = amax / 127 stored as fp16;  id = amax ? 127 / amax : 0
    c = nearest-even(x * id) as int32 (cvtps: INT_MIN for inf, NaN, out of range)
    qs = c saturated to int8;  s = fp16(d * float(sum of the 32 int32 c, wrapping))
The fp16 conversions round to nearest even (F16C).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from exactedit.errors import QuantError
from exactedit.quant.formats.f16 import fp32_to_fp16_bits

NAME = "Q8_1"
QK = 32
BLOCK = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (QK,))])
BLOCK_BYTES = BLOCK.itemsize
assert BLOCK_BYTES == 36

_INT32_LIMIT = np.float32(2147483648.0)
_INT32_MIN = -(1 << 31)


def _check(x) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] % QK:
        raise QuantError(f"Q8_1: expected float32 [rows, cols] with cols a multiple of {QK}, got "
                         f"shape {list(x.shape)}")
    return x


def quantize_x86_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, cols / 32 * 36], as ggml-cpu's AVX2
    `quantize_row_q8_1` (numpy over (n_blocks, 32))."""
    x = _check(x)
    rows, cols = x.shape
    xb = x.reshape(-1, QK)
    blocks = np.zeros(len(xb), dtype=BLOCK)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        amax = np.abs(xb).max(axis=1)
        d = amax / np.float32(127)
        inv = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, 1), 0).astype(np.float32)
        v = np.rint(xb * inv[:, None])
        ok = np.abs(v) < _INT32_LIMIT                       # False for inf and NaN
        c = np.where(ok, np.where(ok, v, 0), _INT32_MIN).astype(np.int64)
        total = ((c.sum(axis=1) + (1 << 31)) % (1 << 32)) - (1 << 31)   # int32 adds wrap
        blocks["d"] = d.astype(np.float16)
        blocks["s"] = (d * total.astype(np.float32)).astype(np.float16)
    blocks["qs"] = np.clip(c, -128, 127)
    return blocks.view(np.uint8).reshape(rows, cols // QK * BLOCK_BYTES)


@numba.njit(error_model="numpy", cache=True)
def _quantize_row(x, out):
    for b in range(x.shape[0] // QK):
        xs = x[b * QK:(b + 1) * QK]
        amax = np.float32(0)
        for j in range(QK):
            amax = max(amax, abs(xs[j]))
        d = amax / np.float32(127)
        inv = np.float32(127) / amax if amax != 0 else np.float32(0)
        o = b * BLOCK_BYTES
        total = np.int64(0)
        for j in range(QK):
            v = np.rint(xs[j] * inv)
            c = np.int64(_INT32_MIN)
            if abs(v) < _INT32_LIMIT:
                c = np.int64(v)
            total += c
            out[o + 4 + j] = min(max(c, -128), 127) & 0xFF
        total = ((total + (1 << 31)) % (1 << 32)) - (1 << 31)
        h = fp32_to_fp16_bits(d)
        out[o] = h & 0xFF
        out[o + 1] = h >> 8
        h = fp32_to_fp16_bits(d * np.float32(total))
        out[o + 2] = h & 0xFF
        out[o + 3] = h >> 8


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _quantize_rows(x, out):
    for r in prange(x.shape[0]):
        _quantize_row(x[r], out[r])


def quantize_x86(x: np.ndarray) -> np.ndarray:
    """Fast path of `quantize_x86_ref` (numba, rows in parallel); the same bytes."""
    x = _check(x)
    out = np.empty((x.shape[0], x.shape[1] // QK * BLOCK_BYTES), np.uint8)
    _quantize_rows(x, out)
    return out
