"""One unit of an rmsnorm tail's last SwiGLU FFN as llama.cpp computes it: a_j = silu(g_j . x) * (u_j . x)
from the FFN input x (= ffn_norm(R), solvers/tail/forward/ffn_ops.py) and the unit's stored gate and up
rows. The products are ggml-cpu's dot of the stored format against the activation quantized to its
partner format (Q4_K x Q8_K, Q4_1 x Q8_1, Q8_0 x Q8_0, Q6_K x Q8_K: quant/dots/), on the vec_dot
path; the gate is then the fused swiglu (`ffn_ops.swiglu_engine`). ggml evaluates silu in 8-wide
lanes (an exp approximation) for the first 8 * (h // 8) units of a row and with libm's expf for the
rest, so the unit's index decides which: a lane unit is computed in a full lane of copies.

`unit_activation_ref` is the float64 reference (dequantized rows, exact products, exact silu).
"""
from __future__ import annotations

import numpy as np

from exactedit.errors import QuantError

__all__ = ["ENGINE_TYPES", "unit_activation_engine", "unit_activation_ref", "unit_products_engine"]

ENGINE_TYPES = ("Q4_K", "Q4_1", "Q8_0", "Q6_K")
LANES = 8


def unit_products_engine(x: np.ndarray, rows_raw: np.ndarray, qtype: str, cols: int) -> np.ndarray:
    """float32 [T, r]: each stored row of `rows_raw` (uint8 [r, row_bytes], type `qtype`) times each
    activation row of x [T, cols], as ggml-cpu's vec_dot computes it."""
    rows_raw = np.ascontiguousarray(rows_raw, np.uint8)
    x = np.ascontiguousarray(x, np.float32)
    if qtype == "Q4_K":
        from exactedit.quant.dots.q4_k_dot import q4_k_matmul

        return q4_k_matmul(rows_raw, x)
    if qtype == "Q4_1":
        from exactedit.quant.dots.q4_1_dot import q4_1_matmul

        return q4_1_matmul(rows_raw, cols, x)
    if qtype == "Q8_0":
        from exactedit.quant.dots.q8_0_dot import q8_0_matmul

        return q8_0_matmul(rows_raw, cols, x)
    if qtype == "Q6_K":
        from exactedit.quant.dots.q6_k_dot import q6_k_matmul

        return q6_k_matmul(rows_raw, cols, x, np.zeros(x.shape[0], bool))
    raise QuantError(f"{qtype}: no engine-faithful product for the FFN's gate and up rows "
                     f"(modelled: {', '.join(ENGINE_TYPES)})")


def unit_activation_engine(x: np.ndarray, gate_raw: np.ndarray, up_raw: np.ndarray, qtype: str, cols: int, *,
                           unit: int = 0, width: int = LANES) -> np.ndarray:
    """float32 [T]: unit `unit` of an FFN `width` units wide, with stored rows `gate_raw`, `up_raw`
    (uint8 [row_bytes] each), at each row of x, as llama.cpp computes it."""
    from exactedit.solvers.tail.forward.ffn_ops import swiglu_engine

    prod = unit_products_engine(x, np.stack([np.asarray(gate_raw, np.uint8).reshape(-1),
                                             np.asarray(up_raw, np.uint8).reshape(-1)]), qtype, cols)
    lane = unit < LANES * (width // LANES)
    k = LANES if lane else 1
    g = np.repeat(prod[:, :1], k, axis=1)
    u = np.repeat(prod[:, 1:2], k, axis=1)
    return swiglu_engine(g, u)[:, 0].copy()


def unit_activation_ref(x: np.ndarray, gate_row: np.ndarray, up_row: np.ndarray) -> np.ndarray:
    """float64 [T]: silu(g . x) * (u . x) with the rows' (dequantized) values, exact."""
    x = np.asarray(x, np.float64)
    z = x @ np.asarray(gate_row, np.float64)
    return z / (1.0 + np.exp(-z)) * (x @ np.asarray(up_row, np.float64))
