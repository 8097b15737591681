"""Q8_K activation quantization: reference == fast path == ggml's quantize_row_q8_K_ref, bit for bit."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from exactedit.quant.formats import q8_k
from tests import oracles


@pytest.fixture(scope="module")
def q8k_ref():
    """ggml's quantize_row_q8_K_ref from libggml-base (tests.oracles decides what a missing one means)."""
    fn = oracles.load().lib.quantize_row_q8_K_ref
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    return fn


def oracle(fn, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    out = np.zeros((x.shape[0], x.shape[1] // q8_k.QK), dtype=q8_k.BLOCK)
    for r in range(x.shape[0]):
        fn(x[r].ctypes.data, out[r].ctypes.data, x.shape[1])
    return out


def assert_blocks_equal(got: np.ndarray, want: np.ndarray) -> None:
    live = want["d"] != 0  # ggml leaves bsums unwritten in an all-zero block
    same = (got["d"].view(np.uint32) == want["d"].view(np.uint32)) & (got["qs"] == want["qs"]).all(-1)
    same &= ~live | (got["bsums"] == want["bsums"]).all(-1)
    if not same.all():
        r, b = np.argwhere(~same)[0]
        raise AssertionError(f"first bad block: row {r} block {b}: d {got['d'][r, b]!r} vs {want['d'][r, b]!r}")


def _rows(seed: int, scale: float, rows: int = 3, cols: int = 512) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)


CASES = [  # (name, input); tolerance is 0 for every case: a quantizer must match bit for bit
    ("normal", _rows(0, 1.0)),
    ("large", _rows(1, 6.0e4)),
    ("tiny", _rows(2, 1e-30)),
    ("zeros", np.zeros((2, 256), np.float32)),
    ("ties", np.tile(np.array([1.0, -1.0, 0.5, -0.25] * 64, np.float32), (2, 1))),
    ("one_hot", np.eye(4, 256, k=17, dtype=np.float32) * -3.0),
    ("halves", (np.arange(512, dtype=np.float32).reshape(2, 256) - 127.0) / 127.0 * 0.5),
]


@pytest.mark.parametrize("name,x", CASES, ids=[c[0] for c in CASES])
def test_ref_fast_oracle_table(q8k_ref, name, x):
    ref = q8_k.quantize_ref(x)
    assert_blocks_equal(q8_k.quantize(x), ref)
    assert_blocks_equal(ref, oracle(q8k_ref, x))


@settings(max_examples=40, deadline=None)
@given(arrays(np.float32, (2, 256), elements=st.floats(-7e4, 7e4, width=32, allow_subnormal=True)))
@example(np.full((2, 256), 1e-40, np.float32))
@example(np.concatenate([np.full((1, 256), 2.5, np.float32), np.full((1, 256), -2.5, np.float32)]))
def test_matches_ggml_on_random_rows(q8k_ref, x):
    ref = q8_k.quantize_ref(x)
    assert_blocks_equal(ref, oracle(q8k_ref, x))
    assert_blocks_equal(q8_k.quantize(x), ref)


def test_dequantize_is_within_half_a_step():
    x = _rows(3, 2.0)
    y = q8_k.dequantize_ref(q8_k.quantize(x))
    step = np.abs(q8_k.quantize(x)["d"]).repeat(q8_k.QK, axis=1)
    assert np.all(np.abs(y - x) <= 0.5 * step * (1 + 1e-5))


def test_rejects_bad_shape():
    from exactedit.errors import QuantError

    with pytest.raises(QuantError):
        q8_k.quantize(np.zeros((1, 100), np.float32))
