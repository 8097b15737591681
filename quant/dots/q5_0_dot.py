"""Engine-faithful Q5_0 x Q8_0 matmul: Q5_0 weights (Gemma 3 270M's ffn_gate / ffn_up) times
activations as llama.cpp's CPU backend multiplies them.

What llama.cpp 0.3.36 (x86-64 build with AVX2 + FMA + F16C, no AVX-512, no AVX-VNNI) does, read off
ggml/src/ggml-cpu (arch/x86/quants.c `ggml_vec_dot_q5_0_q8_0`, llamafile/sgemm.cpp `tinyBLAS_Q0_AVX`
with its `load(const block_q5_0 *)`):
  * Q5_0's vec_dot_type is Q8_0: x is quantized by the same AVX2 `quantize_row_q8_0` as for Q8_0
    weights (quant.formats.q8_0.quantize_x86);
  * a block's 32 weight codes are unpacked to int8 values c - 16 in [-16, 15] (low nibbles OR'd with
    0xF0 where the fifth bit is clear), and from there both kernels are the Q8_0 ones: per lane L
    of 4 values the exact int32 maddubs(|w|, sign(x, w)) + madd(1, .), fma'd into a float32 lane
    accumulator with the float32 product of the two fp16 scales, block by block, then ggml's
    8-lane horizontal sum (quant.dots.q8_0_dot's module doc). No saturation is reachable: |w| <= 16.
So a Q5_0 row multiplies exactly as the Q8_0 row with the same fp16 scale and codes c - 16 does:
`to_q8_0` re-encodes the rows losslessly and the Q8_0 kernels (reference and numba) do the rest.
tests/solvers/tail/test_engine_q5_0.py holds this bit for bit equal to ggml-cpu's own
`ggml_vec_dot_q5_0_q8_0`.
"""
from __future__ import annotations

import numpy as np

from exactedit.errors import QuantError
from exactedit.quant.formats import q5_0, q8_0
from exactedit.quant.dots.q8_0_dot import q8_0_matmul, q8_0_matmul_ref

__all__ = ["q5_0_matmul", "q5_0_matmul_ref", "to_q8_0"]


def to_q8_0(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 32 * 22] Q5_0 rows -> uint8 [rows, cols / 32 * 34] Q8_0 rows holding the
    same fp16 scales and the codes c - 16 (the values ggml's kernels multiply)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    nb = cols // q5_0.QK
    if cols % q5_0.QK or raw.ndim != 2 or raw.shape[1] != nb * q5_0.BLOCK_BYTES:
        raise QuantError(f"Q5_0 weights: expected uint8 [rows, {nb * q5_0.BLOCK_BYTES}] for {cols} columns, "
                         f"got {list(raw.shape)}")
    b = raw.view(q5_0.BLOCK).reshape(-1)
    bits = np.uint32(1) << np.arange(q5_0.QK, dtype=np.uint32)
    high = ((b["qh"][:, None] & bits) != 0).astype(np.int16) << 4
    low = np.concatenate([b["qs"] & 0xF, b["qs"] >> 4], axis=1).astype(np.int16)
    out = np.zeros(b.size, q8_0.BLOCK)
    out["d"] = b["d"]
    out["qs"] = ((low | high) - 16).astype(np.int8)
    return out.view(np.uint8).reshape(raw.shape[0], nb * q8_0.BLOCK_BYTES)


def q5_0_matmul_ref(raw: np.ndarray, cols: int, x: np.ndarray, tiled: np.ndarray | None = None) -> np.ndarray:
    """Reference: float32 [T, rows] = W (Q5_0 rows) @ x[t] as ggml-cpu computes it (`tiled` ignored,
    as for Q8_0)."""
    return q8_0_matmul_ref(to_q8_0(raw, cols), cols, x)


def q5_0_matmul(raw: np.ndarray, cols: int, x: np.ndarray, tiled: np.ndarray | None = None) -> np.ndarray:
    """Fast path (numba) of `q5_0_matmul_ref`; identical floats."""
    return q8_0_matmul(to_q8_0(raw, cols), cols, x)
