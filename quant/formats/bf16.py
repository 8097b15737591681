"""BF16: the top 16 bits of a float32, rounded to nearest even, NaNs kept quiet.

This is ggml's fp32 -> bf16 (`ggml_fp32_to_bf16_row_ref`): bits + 0x7fff + (bit 16), shifted
down; a NaN keeps its top bits with the quiet bit (0x40) forced on. Subnormals are not flushed.
Dequantizing is exact: the 16 bits become the top of a float32.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from exactedit.quant.formats.f32 import f32_bits

NAME = "BF16"


def quantize_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, 2 * cols] (little-endian bf16)."""
    u = np.ascontiguousarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    quiet_nan = (u >> 16) | 0x40
    is_nan = (u & 0x7FFFFFFF) > 0x7F800000
    h = np.where(is_nan, quiet_nan, rounded).astype("<u2")
    return h.view(np.uint8).reshape(h.shape[0], 2 * h.shape[1])


def dequantize_ref(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, 2 * cols] -> float32 [rows, cols]."""
    h = np.ascontiguousarray(raw).view("<u2").reshape(raw.shape[0], cols)
    return (h.astype(np.uint32) << 16).view(np.float32)


@numba.njit(error_model="numpy", cache=True)
def _quantize_row(x, out):
    for j in range(x.shape[0]):
        u = np.int64(f32_bits(x[j])) & 0xFFFFFFFF
        if (u & 0x7FFFFFFF) > 0x7F800000:
            h = (u >> 16) | 0x40
        else:
            h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out[2 * j] = h & 0xFF
        out[2 * j + 1] = (h >> 8) & 0xFF


@numba.njit(error_model="numpy", cache=True)
def _dequantize_row(raw, out):
    bits = out.view(np.uint32)
    for j in range(out.shape[0]):
        bits[j] = (np.uint32(raw[2 * j]) << 16) | (np.uint32(raw[2 * j + 1]) << 24)


@numba.njit(parallel=True, error_model="numpy", cache=True)
def quantize_into(x, out):
    """Fast path: float32 [rows, cols] -> uint8 [rows, 2 * cols], rows in parallel."""
    for r in prange(x.shape[0]):
        _quantize_row(x[r], out[r])


@numba.njit(parallel=True, error_model="numpy", cache=True)
def dequantize_into(raw, out):
    """Fast path: uint8 [rows, 2 * cols] -> float32 [rows, cols], rows in parallel."""
    for r in prange(out.shape[0]):
        _dequantize_row(raw[r], out[r])
