"""Q8_0: fast path == numpy reference == ggml's C, byte for byte; round-trip error within bounds."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import quant
from quant import q8_0
from tests import oracles
from tests.strategies import float_rows, make_block, raw_floats

QK, BB = q8_0.QK, q8_0.BLOCK_BYTES
SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def ggml():
    return oracles.load()


def _rows_of(kind: str, rows: int = 4, cols: int = 2560, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([np.concatenate([make_block(kind, QK, rng) for _ in range(cols // QK)])
                     for _ in range(rows)])


def _weights(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.02).astype(np.float32)


CASES = {  # name -> rows; every case must match ggml bit for bit
    "weights": _weights(16, 2560),
    "all_zero_rows": np.zeros((3, 2560), np.float32),
    "constant_rows": np.array([[0.75] * 256, [-3e-7] * 256, [65504.0] * 256], np.float32),
    "huge_outlier": np.where(np.arange(2560) == 1234, 1e30, _weights(2, 2560)).astype(np.float32),
    "tiny": _weights(2, 2560) * np.float32(1e-35),
    "huge": _weights(2, 2560) * np.float32(1e36),
    "fp16_overflow": _rows_of("fp16_overflow", 2, 512),
    "fp16_underflow": _rows_of("fp16_underflow", 2, 512),
    "subnormals": _rows_of("subnormal", 2, 512),
    "ties": _rows_of("ties", 3, 512),
}


def check_against_ggml(c, x: np.ndarray) -> None:
    cols = x.shape[1]
    want = c.quantize(x, "Q8_0")
    oracles.assert_bytes_equal(quant.quantize(x, "Q8_0"), want, BB, "fast quantize")
    oracles.assert_bytes_equal(q8_0.quantize_ref(x), want, BB, "reference quantize")
    values = c.dequantize(want, "Q8_0", cols)
    oracles.assert_bits_equal(quant.dequantize(want, "Q8_0", cols), values, "fast dequantize")
    oracles.assert_bits_equal(q8_0.dequantize_ref(want, cols), values, "reference dequantize")


@pytest.mark.parametrize("name", CASES)
def test_cases_match_ggml(ggml, name):
    check_against_ggml(ggml, CASES[name])


@SETTINGS
@given(x=float_rows(QK, max_rows=3, max_blocks=6))
def test_corner_rows_match_ggml(ggml, x):
    check_against_ggml(ggml, x)


@SETTINGS
@given(x=raw_floats(QK))
def test_any_finite_floats_match_ggml(ggml, x):
    check_against_ggml(ggml, x)


def test_random_bytes_dequantize_like_ggml(ggml):
    """Every byte pattern (inf/NaN/subnormal scales included) dequantizes as ggml does."""
    raw = np.random.default_rng(3).integers(0, 256, (8, 20 * BB), dtype=np.uint8)
    want = ggml.dequantize(raw, "Q8_0", 20 * QK)
    oracles.assert_bits_equal(quant.dequantize(raw, "Q8_0", 20 * QK), want, "fast")
    oracles.assert_bits_equal(q8_0.dequantize_ref(raw, 20 * QK), want, "reference")


# reference vs fast path, without the oracle: (operation, tolerance, why)
TABLE = [
    ("quantize", 0, "a quantizer must reproduce ggml's bytes exactly"),
    ("dequantize", 0, "each value is one float32 product of the same two exact factors"),
]


@pytest.mark.parametrize("op,tol,why", TABLE)
@SETTINGS
@given(x=float_rows(QK, max_rows=3, max_blocks=4))
def test_reference_vs_fast(op, tol, why, x):
    raw = q8_0.quantize_ref(x)
    if op == "quantize":
        got, ref = quant.quantize(x, "Q8_0"), raw
    else:
        got, ref = quant.dequantize(raw, "Q8_0", x.shape[1]), q8_0.dequantize_ref(raw, x.shape[1])
    assert tol == 0, "only exact comparisons in this table"
    assert np.array_equal(got.view(np.uint8), ref.view(np.uint8)), why


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
