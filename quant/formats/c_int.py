"""C's float -> small-integer conversions as ggml's x86 builds execute them.

ggml's legacy quantizers (Q4_0, Q4_1, Q5_0) write `(int8_t)(v + 8.5f)`: a float32 truncated
toward zero to int32 (cvttss2si: 0x80000000 for NaN, inf and anything outside int32), of which
the low byte is kept and read as a signed byte. The result then goes through `MIN(15, .)` and
into a uint8_t. `trunc_int8_ref` (numpy) and `trunc_int8` (numba) give that signed byte as an
int64; the callers apply the MIN and the final `& 0xFF` themselves, as the C does.

The K-quant searches round with ggml's `nearest_int` (below: `nearest_int_ref`, `nearest_int`).
"""
from __future__ import annotations

import numba
import numpy as np

from exactedit.quant.formats.f32 import f32_bits

_INT32_LIMIT = np.float32(2147483648.0)


def trunc_int8_ref(v: np.ndarray) -> np.ndarray:
    """`(int8_t) v` for float32 v, on x86, as int64 in -128..127."""
    with np.errstate(invalid="ignore"):
        ok = np.abs(v) < _INT32_LIMIT                       # False for NaN and inf
        t = np.where(ok, np.trunc(np.where(ok, v, 0)), 0).astype(np.int64)
    return ((t & 0xFF) ^ 0x80) - 0x80                       # int32 0x80000000 has low byte 0


@numba.njit(error_model="numpy", cache=True)
def trunc_int8(v):
    """Scalar `(int8_t) v` for a float32 v, on x86 (numba)."""
    if not abs(v) < _INT32_LIMIT:
        return np.int64(0)
    return ((np.int64(v) & 0xFF) ^ 0x80) - 0x80


# ---- ggml's `nearest_int` (ggml-quants.c): add 1.5 * 2**23 in float32, read the low mantissa bits.
# Round to nearest, ties to even, for |v| < 2**22; beyond that (and for inf / NaN) the same bit
# arithmetic gives ggml's out-of-range values, which the callers then clamp as the C does.
_MAGIC = np.float32(12582912.0)


def nearest_int_ref(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int of float32 v, as int64."""
    with np.errstate(invalid="ignore", over="ignore"):
        bits = (np.asarray(v, np.float32) + _MAGIC).view(np.int32).astype(np.int64)
    return (bits & 0x7FFFFF) - 0x400000


@numba.njit(error_model="numpy", cache=True)
def nearest_int(v):
    """Scalar ggml nearest_int of a float32 v (numba), as int64."""
    return (np.int64(f32_bits(v + _MAGIC)) & 0x7FFFFF) - 0x400000
