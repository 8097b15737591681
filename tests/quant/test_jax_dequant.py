"""JAX dequantization == quant.dequantize (the numba fast path) bit for bit, for every format.

Tolerance 0 everywhere: dequantization is exact arithmetic in a fixed order. The device is the
CPU unless EXACTEDIT_TEST_DEVICE names another ("gpu" on a CUDA machine runs the same table there).
"""
from __future__ import annotations

import os

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from exactedit import quant
from exactedit.quant import jax_dequant
from exactedit.errors import QuantError
from exactedit.quant.formats.f16 import FP16_TO_FP32
from exactedit.solvers.tail.forward.device import select
from tests.oracles import assert_bits_equal
from tests.strategies import KINDS, float_rows, make_block

DEVICE = select(os.environ.get("EXACTEDIT_TEST_DEVICE", "cpu"))
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FORMATS = ("Q6_K", "Q8_0", "BF16", "F16", "F32")
BLOCK = {"Q6_K": 256, "Q8_0": 32, "BF16": 1, "F16": 1, "F32": 1}


def on_device(raw, qtype, cols) -> np.ndarray:
    return np.asarray(jax_dequant.dequantize_jit(jax.device_put(np.asarray(raw), DEVICE), qtype, cols))


def test_fp16_conversion_all_patterns():
    """Every one of the 65536 fp16 patterns converts like the fast paths' table (quiet NaNs)."""
    h = np.arange(1 << 16, dtype=np.uint32)
    got = np.asarray(jax.jit(jax_dequant.fp16_bits_to_f32)(jax.device_put(h, DEVICE)))
    assert_bits_equal(got, FP16_TO_FP32, "fp16 -> f32")


def _quantized(qtype: str, kind: str, rows: int = 3, blocks: int = 4, seed: int = 0) -> tuple[np.ndarray, int]:
    """Rows of one corner kind (tests/strategies.py) quantized to qtype: the bytes ggml would store."""
    rng = np.random.default_rng(seed)
    block = max(BLOCK[qtype], 256)
    x = np.stack([np.concatenate([make_block(kind, block, rng) for _ in range(blocks)]) for _ in range(rows)])
    return quant.quantize(x, qtype), x.shape[1]


def _random_bytes(qtype: str, rows: int = 5, cols: int = 512, seed: int = 1) -> tuple[np.ndarray, int]:
    """Arbitrary bytes: every code, scale, inf and NaN pattern a block can hold."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (rows, quant.row_bytes(qtype, cols)), dtype=np.uint8), cols


CASES = [(q, "random_bytes") for q in FORMATS] + [(q, k) for q in ("Q6_K", "Q8_0", "BF16") for k in KINDS]


@pytest.mark.parametrize("qtype,case", CASES)
def test_table_matches_fast_path(qtype, case):
    raw, cols = _random_bytes(qtype) if case == "random_bytes" else _quantized(qtype, case)
    assert_bits_equal(on_device(raw, qtype, cols), quant.dequantize(raw, qtype, cols), f"{qtype} {case}")


@SETTINGS
@given(qtype=st.sampled_from(FORMATS), data=st.data())
@example(qtype="Q6_K", data=None)
def test_any_bytes_match_fast_path(qtype, data):
    if data is None:  # one block of all-ones bytes: fp16 d = NaN, every code at its maximum
        cols = 256
        raw = np.full((1, quant.row_bytes(qtype, cols)), 0xFF, np.uint8)
    else:
        block = 256 if qtype == "Q6_K" else 32
        cols = block * data.draw(st.integers(1, 3))
        rows = data.draw(st.integers(1, 3))
        n = rows * quant.row_bytes(qtype, cols)
        raw = np.frombuffer(data.draw(st.binary(min_size=n, max_size=n)), np.uint8).reshape(rows, -1)
    assert_bits_equal(on_device(raw, qtype, cols), quant.dequantize(raw, qtype, cols), qtype)


@SETTINGS
@given(x=float_rows(256, max_rows=2, max_blocks=2), qtype=st.sampled_from(("Q6_K", "Q8_0", "BF16")))
def test_quantized_corners_match_fast_path(x, qtype):
    raw = quant.quantize(x, qtype)
    assert_bits_equal(on_device(raw, qtype, x.shape[1]), quant.dequantize(raw, qtype, x.shape[1]), qtype)


def test_products_keep_the_host_nan_bits():
    """mul_host == numpy's float32 product bit for bit, NaN payloads and inf * 0 included."""
    nan_a = np.array([0x7FC01234, 0xFFC00001], np.uint32).view(np.float32)
    vals = np.concatenate([nan_a, np.float32([np.inf, -np.inf, 0.0, -0.0, 3.5, -2.0, 6e-5])])
    a, b = (x.ravel() for x in np.meshgrid(vals, vals, indexing="ij"))
    with np.errstate(invalid="ignore"):
        want = a * b
    got = np.asarray(jax.jit(jax_dequant.mul_host)(jax.device_put(a, DEVICE), jax.device_put(b, DEVICE)))
    assert_bits_equal(got, want, "a * b")


def test_traceable_inside_jit_on_a_tile():
    """dequantize works on a slice taken inside a jitted function (how the vocab pass calls it)."""
    raw, cols = _random_bytes("Q6_K", rows=9, cols=256)

    @jax.jit
    def tile(r, start):
        return jax_dequant.dequantize(jax.lax.dynamic_slice_in_dim(r, start, 4, axis=0), "Q6_K", cols)

    got = np.asarray(tile(jax.device_put(raw, DEVICE), np.int32(3)))
    assert_bits_equal(got, quant.dequantize(raw[3:7], "Q6_K", cols), "tile")


@pytest.mark.parametrize("raw,qtype,cols,match", [
    (np.zeros((2, 210), np.uint8), "Q4_K", 256, "no JAX dequantizer"),
    (np.zeros((2, 209), np.uint8), "Q6_K", 256, r"expected shape \[rows, 210\]"),
    (np.zeros((2, 34), np.uint8), "Q8_0", 33, "multiple of 32"),
    (np.zeros(34, np.uint8), "Q8_0", 32, r"expected shape \[rows, 34\]"),
    (np.zeros((2, 34), np.int8), "Q8_0", 32, "expected uint8"),
])
def test_bad_input_raises_quant_error(raw, qtype, cols, match):
    with pytest.raises(QuantError, match=match):
        jax_dequant.dequantize(jax.numpy.asarray(raw), qtype, cols)
