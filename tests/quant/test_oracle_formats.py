"""Every quantized format against ggml's C (quantize_row_*_ref, dequantize_row_*): fast path ==
numpy reference == ggml, byte for byte, on one table of corner cases, hypothesis rows and random
bytes (Q8_0, Q6_K, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K). Each format's own error bounds live in
tests/quant/test_q8_0.py, test_q6_k.py and test_legacy_k_bounds.py."""
from __future__ import annotations

from types import ModuleType
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactedit import quant
from exactedit.quant.formats import q4_0, q4_1, q5_0, q8_0
from exactedit.quant.kquants import q4_k, q5_k, q6_k
from tests import oracles
from tests.strategies import float_rows, make_block, raw_floats

SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


class Fmt(NamedTuple):
    module: ModuleType
    qk: int                  # values per block
    bb: int                  # bytes per block
    corner_blocks: int       # max_blocks of the hypothesis corner rows vs ggml
    random_blocks: int       # blocks per row of the random-bytes dequantize test
    table_blocks: int        # max_blocks of the reference-vs-fast table
    dequantize_why: str


FORMATS = {
    "Q8_0": Fmt(q8_0, q8_0.QK, q8_0.BLOCK_BYTES, 6, 20, 4,
                "each value is one float32 product of the same two exact factors"),
    "Q6_K": Fmt(q6_k, q6_k.QK_K, q6_k.BLOCK_BYTES, 3, 10, 3,
                "each value is (fp16(d) * scale) * code in float32, the same two roundings"),
    "Q4_0": Fmt(q4_0, q4_0.QK, q4_0.BLOCK_BYTES, 6, 20, 4,
                "each value is one float32 product float(code - 8) * fp16(d)"),
    "Q4_1": Fmt(q4_1, q4_1.QK, q4_1.BLOCK_BYTES, 6, 20, 4,
                "each value is float(code) * fp16(d) + fp16(m): two roundings, no FMA"),
    "Q5_0": Fmt(q5_0, q5_0.QK, q5_0.BLOCK_BYTES, 6, 20, 4,
                "each value is one float32 product float(code - 16) * fp16(d)"),
    "Q4_K": Fmt(q4_k, q4_k.QK_K, q4_k.BLOCK_BYTES, 3, 10, 3,
                "each value is (fp16(d) * sc) * code - fp16(dmin) * m: the same four roundings"),
    "Q5_K": Fmt(q5_k, q5_k.QK_K, q5_k.BLOCK_BYTES, 3, 10, 3,
                "each value is (fp16(d) * sc) * code - fp16(dmin) * m: the same four roundings"),
}


@pytest.fixture(scope="module")
def ggml():
    return oracles.load()


def _rows_of(kind: str, qk: int, rows: int = 4, cols: int = 2560, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([np.concatenate([make_block(kind, qk, rng) for _ in range(cols // qk)])
                     for _ in range(rows)])


def _weights(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.02).astype(np.float32)


def _cases(qk: int) -> dict[str, np.ndarray]:
    """name -> rows; every case must match ggml bit for bit."""
    return {
        "weights": _weights(16, 2560),
        "all_zero_rows": np.zeros((3, 2560), np.float32),
        "constant_rows": np.array([[0.75] * 256, [-3e-7] * 256, [65504.0] * 256], np.float32),
        "huge_outlier": np.where(np.arange(2560) == 1234, 1e30, _weights(2, 2560)).astype(np.float32),
        "tiny": _weights(2, 2560) * np.float32(1e-35),
        "huge": _weights(2, 2560) * np.float32(1e36),
        "fp16_overflow": _rows_of("fp16_overflow", qk, 2, 512),
        "fp16_underflow": _rows_of("fp16_underflow", qk, 2, 512),
        "subnormals": _rows_of("subnormal", qk, 2, 512),
        "ties": _rows_of("ties", qk, 3, 512),
    }


CASES = {qtype: _cases(f.qk) for qtype, f in FORMATS.items()}


def check_against_ggml(c, qtype: str, x: np.ndarray) -> None:
    f, cols = FORMATS[qtype], x.shape[1]
    want = c.quantize(x, qtype)
    oracles.assert_bytes_equal(quant.quantize(x, qtype), want, f.bb, "fast quantize")
    oracles.assert_bytes_equal(f.module.quantize_ref(x), want, f.bb, "reference quantize")
    values = c.dequantize(want, qtype, cols)
    oracles.assert_bits_equal(quant.dequantize(want, qtype, cols), values, "fast dequantize")
    oracles.assert_bits_equal(f.module.dequantize_ref(want, cols), values, "reference dequantize")


@pytest.mark.parametrize("qtype,name", [(q, n) for q in FORMATS for n in CASES[q]])
def test_cases_match_ggml(ggml, qtype, name):
    check_against_ggml(ggml, qtype, CASES[qtype][name])


@pytest.mark.parametrize("qtype", FORMATS)
@SETTINGS
@given(data=st.data())
def test_corner_rows_match_ggml(ggml, qtype, data):
    f = FORMATS[qtype]
    check_against_ggml(ggml, qtype, data.draw(float_rows(f.qk, max_rows=3, max_blocks=f.corner_blocks)))


@pytest.mark.parametrize("qtype", FORMATS)
@SETTINGS
@given(data=st.data())
def test_any_finite_floats_match_ggml(ggml, qtype, data):
    check_against_ggml(ggml, qtype, data.draw(raw_floats(FORMATS[qtype].qk)))


@pytest.mark.parametrize("qtype", FORMATS)
def test_random_bytes_dequantize_like_ggml(ggml, qtype):
    """Every byte pattern (inf/NaN/subnormal scales included) dequantizes as ggml does."""
    f = FORMATS[qtype]
    n = f.random_blocks
    raw = np.random.default_rng(3).integers(0, 256, (8, n * f.bb), dtype=np.uint8)
    want = ggml.dequantize(raw, qtype, n * f.qk)
    oracles.assert_bits_equal(quant.dequantize(raw, qtype, n * f.qk), want, "fast")
    oracles.assert_bits_equal(f.module.dequantize_ref(raw, n * f.qk), want, "reference")


# reference vs fast path, without the oracle: (format, operation, tolerance, why)
TABLE = [(qtype, op, 0, why) for qtype, f in FORMATS.items() for op, why in (
    ("quantize", "a quantizer must reproduce ggml's bytes exactly"),
    ("dequantize", f.dequantize_why))]


@pytest.mark.parametrize("qtype,op,tol,why", TABLE)
@SETTINGS
@given(data=st.data())
def test_reference_vs_fast(qtype, op, tol, why, data):
    f = FORMATS[qtype]
    x = data.draw(float_rows(f.qk, max_rows=3, max_blocks=f.table_blocks))
    raw = f.module.quantize_ref(x)
    if op == "quantize":
        got, ref = quant.quantize(x, qtype), raw
    else:
        got, ref = quant.dequantize(raw, qtype, x.shape[1]), f.module.dequantize_ref(raw, x.shape[1])
    assert tol == 0, "only exact comparisons in this table"
    assert np.array_equal(got.view(np.uint8), ref.view(np.uint8)), why
