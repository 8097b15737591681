"""F32: ggml's plain float32 rows, and the float32 bit views the other kernels build on.

A stored F32 row is the little-endian float32 values, 4 bytes each. There is no rounding, so the
numpy reference is also the fast path. `f32_bits` / `bits_f32` reinterpret a float32 as int32 and
back inside numba kernels (a bitcast, like C's memcpy between float and int): the fp16/bf16
conversions and ggml's `nearest_int` are defined on those bits.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

NAME = "F32"


@intrinsic
def f32_bits(typingctx, x):
    """int32 with the bits of the float32 `x` (numba only; pass exactly a float32)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@intrinsic
def bits_f32(typingctx, i):
    """float32 whose bits are the int32 `i` (numba only; pass exactly an int32)."""
    if i != types.int32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


def quantize_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, 4 * cols] (little-endian float32)."""
    x = np.ascontiguousarray(x, dtype="<f4")
    return x.view(np.uint8).reshape(x.shape[0], 4 * x.shape[1])


def dequantize_ref(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, 4 * cols] -> float32 [rows, cols]."""
    raw = np.ascontiguousarray(raw)
    return raw.view("<f4").reshape(raw.shape[0], cols).astype(np.float32)


def quantize_into(x: np.ndarray, out: np.ndarray) -> None:
    """Fast path: the same byte copy as the reference, into a preallocated output."""
    out[...] = quantize_ref(x)


def dequantize_into(raw: np.ndarray, out: np.ndarray) -> None:
    """Fast path: reinterpret the row bytes as float32, into a preallocated output."""
    out[...] = np.ascontiguousarray(raw).view("<f4").reshape(out.shape)
