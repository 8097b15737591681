"""The round-trip rule: only edited rows are re-quantized; everything else keeps its bytes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactedit import quant
from exactedit.errors import QuantError
from exactedit.quant.rounding.roundtrip import RoundTrip, requantize_rows
from tests import oracles

COLS = 512


@pytest.fixture(scope="module")
def ggml():
    return oracles.load()


def _tensor(qtype: str, rows: int = 12, seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal((rows, COLS)) * 0.02
    return quant.quantize(w.astype(np.float32), qtype)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(qtype=st.sampled_from(quant.SUPPORTED),
       picks=st.lists(st.integers(0, 11), unique=True, max_size=6),
       scale=st.floats(0, 0.05), seed=st.integers(0, 2**16))
def test_invariants(ggml, qtype, picks, scale, seed):
    orig = _tensor(qtype)
    ids = np.array(picks, np.int64)
    rng = np.random.default_rng(seed)
    base = quant.dequantize(orig[ids], qtype, COLS)
    edited = (base + rng.standard_normal(base.shape) * scale).astype(np.float32)
    rt = requantize_rows(orig, qtype, COLS, ids, edited)
    assert isinstance(rt, RoundTrip)
    untouched = np.setdiff1d(np.arange(len(orig)), ids)
    assert np.array_equal(rt.raw[untouched], orig[untouched])
    if ids.size:
        oracles.assert_bytes_equal(rt.raw[ids], ggml.quantize(edited, qtype), 1, "edited rows")
    really_changed = ids[(rt.raw[ids] != orig[ids]).any(axis=1)] if ids.size else ids
    assert np.array_equal(rt.changed_rows, np.sort(really_changed))
    assert np.array_equal(rt.row_ids, ids)
    shipped = quant.dequantize(rt.raw[ids], qtype, COLS)
    assert np.array_equal(rt.dequantized, shipped)
    diff = shipped.astype(np.float64) - edited
    assert np.array_equal(rt.quant_error.max_abs, np.abs(diff).max(axis=1, initial=0.0))
    assert np.allclose(rt.quant_error.rms, np.sqrt((diff**2).mean(axis=1)), rtol=1e-12, atol=0)


def test_unedited_values_keep_bytes_only_where_idempotent():
    """Writing back a row's own dequantized values: Q8_0 (normal fp16 scales) gives the same
    bytes, Q6_K and Q5_K in general do not (their scale searches see different values), and the
    round trip reports exactly which rows moved."""
    for qtype, expect_change in (("Q8_0", False), ("Q6_K", True), ("Q5_K", True)):
        orig = _tensor(qtype, rows=40, seed=3)
        ids = np.arange(0, 40, 2)
        rt = requantize_rows(orig, qtype, COLS, ids, quant.dequantize(orig[ids], qtype, COLS))
        assert (rt.changed_rows.size > 0) == expect_change, qtype
        assert np.array_equal(rt.raw[1::2], orig[1::2])


def test_real_edit_is_reported_and_inputs_untouched(tmp_path):
    orig = _tensor("Q6_K")
    path = tmp_path / "t.bin"
    orig.tofile(path)
    mm = np.memmap(path, np.uint8, "r", shape=orig.shape)
    edited = quant.dequantize(orig[[4]], "Q6_K", COLS) + np.float32(0.5)
    before = edited.copy()
    rt = requantize_rows(mm, "Q6_K", COLS, [4], edited)
    assert rt.changed_rows.tolist() == [4]
    assert 0 < rt.quant_error.max_abs[0] <= 0.065 * np.abs(edited).max()  # test_q6_k's bound
    assert path.read_bytes() == orig.tobytes() and np.array_equal(edited, before)
    for a in (rt.raw, rt.changed_rows, rt.dequantized, rt.quant_error.max_abs, rt.row_ids):
        assert not a.flags.writeable
    assert type(rt.raw) is np.ndarray


@pytest.mark.parametrize("kwargs,match", [
    ({"row_ids": [1, 1], "edited_rows": np.zeros((2, COLS))}, "repeated"),
    ({"row_ids": [12], "edited_rows": np.zeros((1, COLS))}, "outside"),
    ({"row_ids": [-1], "edited_rows": np.zeros((1, COLS))}, "outside"),
    ({"row_ids": [0.5], "edited_rows": np.zeros((1, COLS))}, "integer"),
    ({"row_ids": [0, 1], "edited_rows": np.zeros((1, COLS))}, r"\[2, 512\]"),
    ({"row_ids": [0], "edited_rows": np.full((1, COLS), np.inf)}, "finite"),
])
def test_bad_requests_raise_quant_error(kwargs, match):
    with pytest.raises(QuantError, match=match):
        requantize_rows(_tensor("Q8_0"), "Q8_0", COLS, **kwargs)


def test_bad_original_raises_quant_error():
    with pytest.raises(QuantError, match="orig_raw"):
        requantize_rows(_tensor("Q8_0"), "Q6_K", COLS, [0], np.zeros((1, COLS)))
