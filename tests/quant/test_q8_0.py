"""Q8_0: round-trip error bounds and idempotence; the byte-for-byte checks against ggml and the
numpy reference are in tests/quant/test_oracle_formats.py."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from exactedit import quant
from exactedit.quant.formats import q8_0
from tests.strategies import float_rows

QK, BB = q8_0.QK, q8_0.BLOCK_BYTES
SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(x=float_rows(QK, max_rows=3, max_blocks=4))
def test_round_trip_error_bound(x):
    """|x^ - x| <= d (1/2 + 127 * 2**-22) + 127 |fp16(d) - d| + |x^| 2**-24 per block, where
    d = amax/127 (float32). Codes are round(x / d) up to the float32 rounding of x * (1/d)
    (relative 2**-22 of at most 127); the fp16 scale is off by at most max(2**-11 d, 2**-25)
    (normal / subnormal fp16); the product is one float32 rounding. Blocks whose fp16 scale
    overflows (d >= 65520) are left out: they dequantize to inf / NaN by design."""
    y = quant.dequantize(quant.quantize(x, "Q8_0"), "Q8_0", x.shape[1]).astype(np.float64)
    xb, yb = x.astype(np.float64).reshape(-1, QK), y.reshape(-1, QK)
    d = (np.abs(x).reshape(-1, QK).max(axis=1) / np.float32(127)).astype(np.float64)
    keep = d < 65520
    fp16_err = np.maximum(d * 2.0**-11, 2.0**-25)
    bound = d * (0.5 + 127 * 2.0**-22) + 127 * fp16_err
    err = np.abs(yb - xb)
    assert np.all(err[keep] <= bound[keep, None] + np.abs(yb[keep]) * 2.0**-24)


@SETTINGS
@given(x=float_rows(QK, max_rows=3, max_blocks=4))
def test_idempotent_unless_scale_underflows(x):
    """quantize(dequantize(raw)) == raw for every block whose fp16 scale is finite and nonzero:
    the largest code is +-127, so the new amax is 127 * fp16(d) and d comes back exactly."""
    raw = quant.quantize(x, "Q8_0")
    y = quant.dequantize(raw, "Q8_0", x.shape[1])
    y[~np.isfinite(y)] = 0  # blocks with an inf scale are left out below
    again = quant.quantize(y, "Q8_0")
    d16 = raw.view(q8_0.BLOCK)["d"].astype(np.float32).reshape(-1)
    keep = (d16 != 0) & np.isfinite(d16)
    same = (raw.reshape(-1, BB) == again.reshape(-1, BB)).all(axis=1)
    assert same[keep].all()
