"""Correctly rounded float32 fused multiply-add, as ggml-cpu's kernels use it (`_mm256_fmadd_ps`).

`fma32_ref` is the numpy reference (exact product in float64, TwoSum for the sum's rounding error);
`fma32` is the numba intrinsic (LLVM's `fma`) for use inside njit kernels. The engine dot-product
models (quant/dots/q6_k_dot.py, quant/dots/q8_0_dot.py) build on both; tests/quant/test_dot.py holds them equal.
"""
from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic

__all__ = ["fma32", "fma32_ref"]


def fma32_ref(a, b, c) -> np.ndarray:
    """Correctly rounded float32 a*b + c (numpy): the product is exact in float64, the sum's
    rounding error comes from TwoSum, and a float64 sum lying exactly on a float32 midpoint is
    resolved by that error's sign (the only case where rounding twice differs)."""
    a, b, c = (np.asarray(v, np.float32) for v in (a, b, c))
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    r = s.astype(np.float32)
    toward = np.nextafter(r, np.where(s > r.astype(np.float64), np.float32(np.inf), np.float32(-np.inf)))
    mid = (r.astype(np.float64) + toward.astype(np.float64)) / 2
    on_mid = (s == mid) & (err != 0) & (s != r.astype(np.float64))
    up = on_mid & ((err > 0) == (toward > r))  # the exact value lies on toward's side of mid
    return np.where(up, toward, r).astype(np.float32)


@intrinsic
def fma32(typingctx, a, b, c):
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return sig, codegen
