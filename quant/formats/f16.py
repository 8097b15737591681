"""F16: IEEE binary16 rows, and the fp32 <-> fp16 conversions every ggml block scale goes through.

ggml's GGML_FP32_TO_FP16 is IEEE round-to-nearest-even with subnormals, overflow to infinity and
quiet NaNs; numpy's `astype(np.float16)` is the same conversion and serves as the reference.
`fp32_to_fp16_bits` / `fp16_bits_to_fp32` are the numba scalar versions, written on the integer
bits so that they are exact for every input (the Q8_0 and Q6_K kernels call them per block).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from exactedit.quant.formats.f32 import bits_f32, f32_bits

NAME = "F16"

_F32_EXP_MASK = 0x7F800000
_F16_INF = 0x7C00
_F16_QNAN = 0x7E00
_F16_OVERFLOW = 0x477FF000      # 65520.0: from here on, round-to-nearest-even gives inf
_F16_MIN_NORMAL = 0x38800000    # 2**-14
_F16_HALF_MIN_SUB = 0x33000000  # 2**-25: up to here (a tie, to even) the result is zero
_REBIAS = (127 - 15) << 10      # exponent bias difference, in fp16 bit units
_TWO_POW_112 = np.float32(2.0 ** 112)


@numba.njit(error_model="numpy", cache=True)
def _round_shift(m, shift):
    """m >> shift, rounded to nearest, ties to even (shift >= 1)."""
    q = m >> shift
    rem = m & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and (q & 1) == 1):
        q += 1
    return q


@numba.njit(error_model="numpy", cache=True)
def fp32_to_fp16_bits(f):
    """The binary16 bits (0..65535) of the float32 `f`, rounded to nearest even."""
    u = np.int64(f32_bits(np.float32(f))) & 0xFFFFFFFF
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a > _F32_EXP_MASK:
        return sign | _F16_QNAN
    if a >= _F16_OVERFLOW:
        return sign | _F16_INF
    if a >= _F16_MIN_NORMAL:
        return sign | _round_shift(a, 13) - _REBIAS
    if a <= _F16_HALF_MIN_SUB:
        return sign
    # subnormal result: the significand (with its hidden bit) in units of 2**-24
    e = a >> 23
    m = (a & 0x7FFFFF) | 0x800000
    return sign | _round_shift(m, 126 - e)


@numba.njit(error_model="numpy", cache=True)
def fp16_bits_to_fp32(h):
    """The float32 value of binary16 bits `h` (exact), without branches: the exponent and
    significand bits moved to float32 positions read as a float32 2**112 too small (subnormals
    land on float32 subnormals), so one exact multiply rescales them; inf/NaN get the float32
    all-ones exponent (NaNs quiet); the sign bit is put back last."""
    h = np.int64(h) & 0xFFFF
    mag = (h & 0x7FFF) << 13
    scaled = f32_bits(bits_f32(np.int32(mag)) * _TWO_POW_112)
    quiet = 0x400000 if (h & 0x3FF) != 0 else 0  # NaNs come out quiet, as in ggml (x86 F16C)
    inf_nan = np.int32(0x7F800000 | mag | quiet)
    body = inf_nan if (h & 0x7C00) == 0x7C00 else scaled
    return bits_f32(np.int32(body | ((h & 0x8000) << 16)))


def _fp16_table() -> np.ndarray:
    """float32 value of each of the 65536 fp16 bit patterns, NaNs quiet (as ggml gives them).
    A constant the dequantize kernels take as an argument: one load instead of the bit work."""
    table = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    table.view(np.uint32)[np.isnan(table)] |= np.uint32(0x400000)
    table.setflags(write=False)
    return table


FP16_TO_FP32 = _fp16_table()


def quantize_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, 2 * cols] (little-endian binary16)."""
    with np.errstate(over="ignore"):  # overflow to inf is the conversion's defined result
        h = np.ascontiguousarray(x, dtype=np.float32).astype("<f2")
    return h.view(np.uint8).reshape(h.shape[0], 2 * h.shape[1])


def dequantize_ref(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, 2 * cols] -> float32 [rows, cols]."""
    raw = np.ascontiguousarray(raw)
    return raw.view("<f2").reshape(raw.shape[0], cols).astype(np.float32)


@numba.njit(error_model="numpy", cache=True)
def _quantize_row(x, out):
    for j in range(x.shape[0]):
        h = fp32_to_fp16_bits(x[j])
        out[2 * j] = h & 0xFF
        out[2 * j + 1] = h >> 8


@numba.njit(error_model="numpy", cache=True)
def _dequantize_row(raw, out, fp16):
    for j in range(out.shape[0]):
        out[j] = fp16[np.int64(raw[2 * j]) | (np.int64(raw[2 * j + 1]) << 8)]


@numba.njit(parallel=True, error_model="numpy", cache=True)
def quantize_into(x, out):
    """Fast path: float32 [rows, cols] -> uint8 [rows, 2 * cols], rows in parallel."""
    for r in prange(x.shape[0]):
        _quantize_row(x[r], out[r])


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _dequantize_rows(raw, out, fp16):
    for r in prange(out.shape[0]):
        _dequantize_row(raw[r], out[r], fp16)


def dequantize_into(raw: np.ndarray, out: np.ndarray) -> None:
    """Fast path: uint8 [rows, 2 * cols] -> float32 [rows, cols], rows in parallel."""
    _dequantize_rows(raw, out, FP16_TO_FP32)
