"""quant.rounding.grid: a row's bytes as fixed block scales times free codes; packing any codes in range
gives bytes that ggml's own dequantizer reads as step * code."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactedit import quant
from exactedit.quant.rounding import grid as gr
from exactedit.errors import QuantError
from tests import oracles
from tests.strategies import float_rows

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
BLOCKS = {"Q8_0": 32, "Q6_K": 256, "Q4_1": 32}
KINDS = ("normal", "zero", "constant", "ties", "outlier", "subnormal", "fp16_underflow")


@pytest.fixture(scope="module")
def ggml():
    return oracles.load()


@SETTINGS
@given(data=st.data(), qtype=st.sampled_from(gr.COLUMN_TYPES))
def test_bytes_round_trip(data, qtype):
    """pack(grid_of(raw), codes_of(raw)) gives back ggml's bytes exactly, and values() is what
    the dequantizer computes (NaN where an inf scale meets a zero code, as in C)."""
    x = data.draw(float_rows(BLOCKS[qtype], max_rows=2, max_blocks=3, kinds=KINDS))
    raw = quant.quantize(x, qtype)
    g = gr.grid_of(raw, qtype, x.shape[1])
    codes = gr.codes_of(raw, qtype, x.shape[1])
    assert np.array_equal(gr.pack(g, codes), raw)
    oracles.assert_bits_equal(gr.values(g, codes), quant.dequantize(raw, qtype, x.shape[1]), qtype)


@SETTINGS
@given(data=st.data(), qtype=st.sampled_from(gr.COLUMN_TYPES), seed=st.integers(0, 2**32 - 1))
def test_any_codes_load_in_ggml(ggml, data, qtype, seed):
    """Random codes anywhere in the range, packed into a quantized row's scales: ggml's
    dequantizer reads step * code, bit for bit, and the scale fields are untouched."""
    x = data.draw(float_rows(BLOCKS[qtype], max_rows=2, max_blocks=3, kinds=("normal", "outlier", "zero")))
    raw = quant.quantize(x, qtype)
    g = gr.grid_of(raw, qtype, x.shape[1])
    codes = np.random.default_rng(seed).integers(g.lo, g.hi + 1, x.shape).astype(np.int16)
    packed = gr.pack(g, codes)
    got = ggml.dequantize(packed, qtype, x.shape[1])
    oracles.assert_bits_equal(got, gr.values(g, codes), f"{qtype} packed codes")
    assert np.array_equal(gr.codes_of(packed, qtype, x.shape[1]), codes)
    oracles.assert_bits_equal(gr.grid_of(packed, qtype, x.shape[1]).steps, g.steps, "scales kept")
    if g.offsets is not None:
        oracles.assert_bits_equal(gr.grid_of(packed, qtype, x.shape[1]).offsets, g.offsets, "offsets kept")


def test_nearest_is_nearest_within_range():
    x = (np.random.default_rng(1).standard_normal((3, 512)) * 0.02).astype(np.float32)
    for qtype in gr.COLUMN_TYPES:
        g = gr.grid_of(quant.quantize(x, qtype), qtype, 512)
        t = x.astype(np.float64) * 1.3  # some values beyond the range: clamped
        c = gr.nearest(g, t)
        best = np.abs(gr.values(g, c) - t)
        for dc in (-1, 1):
            other = np.clip(c.astype(np.int64) + dc, g.lo, g.hi)
            assert np.all(best <= np.abs(gr.values(g, other) - t) + 1e-12)


def test_errors():
    raw = quant.quantize(np.ones((1, 256), np.float32), "Q6_K")
    with pytest.raises(QuantError, match="grid of block scales"):
        gr.grid_of(raw, "F16", 256)
    with pytest.raises(QuantError, match="expected uint8"):
        gr.grid_of(raw[:, :-1], "Q6_K", 256)
    g = gr.grid_of(raw, "Q6_K", 256)
    with pytest.raises(QuantError, match="must lie in"):
        gr.pack(g, np.full((1, 256), 32, np.int16))
    g1 = gr.grid_of(quant.quantize(np.ones((1, 32), np.float32), "Q4_1"), "Q4_1", 32)
    with pytest.raises(QuantError, match="must lie in"):
        gr.pack(g1, np.full((1, 32), -1, np.int16))
