"""ggml's own C code as the oracle for the format tests.

The ctypes binding itself is `bench.quant.GgmlC` (one binding, shared with `exactedit bench
quant`): libggml-base from the installed llama-cpp-python package, with `ggml_quantize_chunk`
(quantize, reference quantizers, no importance matrix), the type traits' `to_float` (dequantize)
and ggml's fp16 / bf16 row conversions. This module gives the tests a fixture-friendly loader
that skips with the reason when the library is absent, the conversions as numpy functions, and
byte comparisons that name the first bad block.
"""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.bench.quant import GgmlC, GgmlUnavailable


def load() -> GgmlC:
    """The oracle, or a pytest skip that says why it is missing."""
    try:
        return GgmlC()
    except GgmlUnavailable as exc:
        pytest.skip(f"ggml oracle unavailable (it ships with the `live` extra): {exc}")


def fp32_to_fp16_bits(c: GgmlC, x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_fp16_row: uint16 bits."""
    return c.convert_row("ggml_fp32_to_fp16_row", np.asarray(x, np.float32), np.uint16)


def fp16_bits_to_fp32(c: GgmlC, h: np.ndarray) -> np.ndarray:
    """ggml_fp16_to_fp32_row: float32 values."""
    return c.convert_row("ggml_fp16_to_fp32_row", np.asarray(h, np.uint16), np.float32)


def fp32_to_bf16_bits(c: GgmlC, x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_bf16_row_ref: uint16 bits."""
    return c.convert_row("ggml_fp32_to_bf16_row_ref", np.asarray(x, np.float32), np.uint16)


def first_bad_block(got: np.ndarray, want: np.ndarray, block_bytes: int) -> str | None:
    """None if the byte arrays [rows, row_bytes] are equal, else where and how they differ."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype} vs {want.shape} {want.dtype}"
    bad = (got != want).reshape(got.shape[0], -1, block_bytes).any(axis=2)
    if not bad.any():
        return None
    r, b = (int(i) for i in np.argwhere(bad)[0])
    sl = slice(b * block_bytes, (b + 1) * block_bytes)
    return (f"{int(bad.sum())} bad blocks; first: row {r} block {b}:\n"
            f"  got  {got[r, sl].tobytes().hex()}\n  want {want[r, sl].tobytes().hex()}")


def assert_bytes_equal(got: np.ndarray, want: np.ndarray, block_bytes: int, what: str = "") -> None:
    msg = first_bad_block(got, want, block_bytes)
    assert msg is None, f"{what}: {msg}"


def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """float32 arrays equal bit for bit (NaNs included); names the first difference."""
    g = np.ascontiguousarray(got, np.float32).view(np.uint32)
    w = np.ascontiguousarray(want, np.float32).view(np.uint32)
    assert g.shape == w.shape, f"{what}: shape {g.shape} vs {w.shape}"
    bad = np.argwhere(g != w)
    assert len(bad) == 0, (f"{what}: {len(bad)} values differ; first at {tuple(bad[0])}: "
                           f"{got[tuple(bad[0])]!r} vs {want[tuple(bad[0])]!r}")
