"""Q8_0: blocks of 32 values, one fp16 scale `d` and 32 int8 codes `qs` (34 bytes a block).

ggml's reference quantizer (`quantize_row_q8_0_ref`), all in float32:
    amax = max |x|            (as MAX(amax, |x|), in index order)
    d    = amax / 127;  id = d ? 1/d : 0
    d is stored as fp16 (round to nearest even); qs = roundf(x * id), half away from zero.
The codes use the float32 `d`, not the fp16 one. Dequantized value: float(qs) * fp16(d).
When the float32 `1/d` overflows (a block of float32 subnormals), x * id is inf or NaN and the
C conversion to int8 yields 0 on x86; the kernels reproduce that.
"""
from __future__ import annotations

import gguf
import numba
import numpy as np
from numba import prange

from exactedit.quant.formats.f16 import FP16_TO_FP32, fp32_to_fp16_bits

NAME = "Q8_0"
QK, BLOCK_BYTES = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0]
BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (QK,))])
assert BLOCK.itemsize == BLOCK_BYTES

_INT32_LIMIT = np.float32(2147483648.0)


def _roundf_to_int8_bits_ref(v: np.ndarray) -> np.ndarray:
    """C's `(int8_t) roundf(v)` on x86, as int64: half away from zero, then the low byte of the
    int32 conversion (0x80000000 for NaN, inf and anything outside int32)."""
    with np.errstate(invalid="ignore"):
        a = np.abs(v)
        t = np.trunc(a)
        r = np.where(a - t >= np.float32(0.5), t + 1, t)
        ok = a < _INT32_LIMIT
        r = np.where(ok, np.copysign(r, v), 0).astype(np.int64)
    return ((r & 0xFF) ^ 0x80) - 0x80


def quantize_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, cols / 32 * 34]; numpy over (n_blocks, 32)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    xb = x.reshape(-1, QK)
    blocks = np.zeros(xb.shape[0], dtype=BLOCK)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        amax = np.zeros(xb.shape[0], np.float32)
        for j in range(QK):  # MAX(amax, |x|) in index order
            ax = np.abs(xb[:, j])
            amax = np.where(amax > ax, amax, ax)
        d = amax / np.float32(127)
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        blocks["d"] = d.astype(np.float16)
        blocks["qs"] = _roundf_to_int8_bits_ref(xb * inv[:, None])
    return blocks.view(np.uint8).reshape(rows, cols // QK * BLOCK_BYTES)


def dequantize_ref(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 32 * 34] -> float32 [rows, cols]."""
    raw = np.ascontiguousarray(raw)
    blocks = raw.view(BLOCK).reshape(-1)
    d = blocks["d"].astype(np.float32)
    with np.errstate(invalid="ignore"):  # an inf scale times a 0 code is NaN, as in C
        y = blocks["qs"].astype(np.float32) * d[:, None]
    return y.reshape(raw.shape[0], cols)


@numba.njit(error_model="numpy", cache=True)
def _roundf_int8_bits(v):
    a = abs(v)
    if not a < _INT32_LIMIT:
        return 0
    t = np.int64(a)
    if a - np.float32(t) >= np.float32(0.5):
        t += 1
    if v < 0:
        t = -t
    return t & 0xFF


@numba.njit(error_model="numpy", cache=True)
def _quantize_row(x, out):
    for b in range(x.shape[0] // QK):
        xs = x[b * QK:(b + 1) * QK]
        amax = np.float32(0)
        for j in range(QK):
            ax = abs(xs[j])
            amax = amax if amax > ax else ax
        d = amax / np.float32(127)
        inv = np.float32(1) / d if d != 0 else np.float32(0)
        h = fp32_to_fp16_bits(d)
        o = b * BLOCK_BYTES
        out[o] = h & 0xFF
        out[o + 1] = h >> 8
        for j in range(QK):
            out[o + 2 + j] = _roundf_int8_bits(xs[j] * inv)


@numba.njit(error_model="numpy", cache=True)
def _dequantize_row(raw, out, fp16):
    nb = out.shape[0] // QK
    blocks = raw.reshape(nb, BLOCK_BYTES)
    y = out.reshape(nb, QK)
    for b in range(nb):
        d = fp16[np.int64(blocks[b, 0]) | (np.int64(blocks[b, 1]) << 8)]
        for j in range(y.shape[1]):  # = QK; a runtime bound lets LLVM vectorize it
            y[b, j] = np.float32(np.int8(blocks[b, 2 + j])) * d


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


# ---- the activation quantizer of ggml-cpu's x86 build (`quantize_row_q8_0`, AVX2 path) -------
# ggml-cpu quantizes a float32 activation row to Q8_0 before multiplying it with Q8_0 weights,
# with arithmetic that differs from the reference quantizer above:
#     amax = max |x| (exact);  d = amax / 127, stored as fp16 (round to nearest even)
#     id = amax ? 127 / amax : 0      (not 1 / d)
#     qs = nearest-even(x * id) as int32 (cvtps: INT_MIN for inf, NaN, out of range), then
#          saturated to int8: an id that overflows (amax < ~3.7e-37) gives -128 codes.
def quantize_x86_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, cols / 32 * 34], as ggml-cpu's AVX2
    `quantize_row_q8_0` (numpy over (n_blocks, 32))."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    xb = x.reshape(-1, QK)
    blocks = np.zeros(xb.shape[0], dtype=BLOCK)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        amax = np.abs(xb).max(axis=1)
        blocks["d"] = (amax / np.float32(127)).astype(np.float16)
        inv = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, 1), 0).astype(np.float32)
        v = np.rint(xb * inv[:, None])
        ok = np.abs(v) < _INT32_LIMIT                        # False for inf and NaN
        blocks["qs"] = np.where(ok, np.clip(np.where(ok, v, 0), -128, 127), -128).astype(np.int8)
    return blocks.view(np.uint8).reshape(rows, cols // QK * BLOCK_BYTES)


@numba.njit(error_model="numpy", cache=True)
def _quantize_x86_row(x, out):
    for b in range(x.shape[0] // QK):
        xs = x[b * QK:(b + 1) * QK]
        amax = np.float32(0)
        for j in range(QK):
            amax = max(amax, abs(xs[j]))
        h = fp32_to_fp16_bits(amax / np.float32(127))
        inv = np.float32(127) / amax if amax != 0 else np.float32(0)
        o = b * BLOCK_BYTES
        out[o] = h & 0xFF
        out[o + 1] = h >> 8
        for j in range(QK):
            v = np.rint(xs[j] * inv)
            q = -128
            if abs(v) < _INT32_LIMIT:
                q = min(max(np.int64(v), -128), 127)
            out[o + 2 + j] = q & 0xFF


@numba.njit(parallel=True, error_model="numpy", cache=True)
def quantize_x86_into(x, out):
    """Fast path of `quantize_x86_ref`: float32 [rows, cols] -> uint8 [rows, row_bytes]."""
    for r in prange(x.shape[0]):
        _quantize_x86_row(x[r], out[r])


def quantize_x86(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], x.shape[1] // QK * BLOCK_BYTES), np.uint8)
    quantize_x86_into(x, out)
    return out
