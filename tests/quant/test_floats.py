"""F32, F16, BF16 rows and the fp16 / bf16 scalar conversions, against ggml's C and numpy;
and the public quantize / dequantize contract (shapes, validation, read-only inputs)."""
from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from exactedit import quant
from exactedit.quant import registry
from exactedit.quant.formats import bf16, f16, f32
from exactedit.errors import QuantError
from tests import oracles
from tests.strategies import float_rows, raw_floats

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
FLOATS = {"F32": f32, "F16": f16, "BF16": bf16}


@pytest.fixture(scope="module")
def ggml():
    return oracles.load()


def _fp16_ties_and_neighbours() -> np.ndarray:
    """Every finite fp16 value, the exact float32 midpoint between each pair of neighbours (a
    rounding tie), one float32 ulp either side of it, and the overflow boundary; both signs."""
    h = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = ((h[:-1] + h[1:]) / 2).astype(np.float32)
    edge = np.float32([65504, 65519.996, 65520, 65520.004, 65536, 1e6, 3.4e38])
    pos = np.concatenate([h.astype(np.float32), mids, np.nextafter(mids, np.float32(0)),
                          np.nextafter(mids, np.float32(np.inf)), edge])
    return np.concatenate([pos, -pos])


def _fp32_patterns() -> np.ndarray:
    """Every float32 exponent with mantissas at the fp16/bf16 rounding boundaries, + random."""
    rng = np.random.default_rng(7)
    mant = np.concatenate([[0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000, 0x7FFF, 0x8000,
                            0x8001, 0x10000, 0x18000, 0x400000, 0x7FFFFF],
                           rng.integers(0, 0x800000, 40)]).astype(np.uint32)
    bits = (np.arange(256, dtype=np.uint32)[:, None] << 23) | mant[None, :]
    bits = np.concatenate([bits.ravel(), bits.ravel() | np.uint32(0x80000000)])
    return bits.view(np.float32)


def _kernel(module, x: np.ndarray) -> np.ndarray:
    """A format's numba fast path directly (non-finite inputs included)."""
    x = np.ascontiguousarray(x, np.float32).reshape(1, -1)
    out = np.empty((1, 2 * x.shape[1]), np.uint8)
    module.quantize_into(x, out)
    return out.view(np.uint16).reshape(-1)


@pytest.mark.parametrize("values", [_fp16_ties_and_neighbours(), _fp32_patterns()],
                         ids=["fp16_ties", "fp32_patterns"])
def test_fp32_to_fp16_matches_ggml_and_numpy(ggml, values):
    want = oracles.fp32_to_fp16_bits(ggml, values)
    got = _kernel(f16, values)
    assert np.array_equal(got, want), f"first difference at {values[np.argmax(got != want)]!r}"
    finite = np.isfinite(values)  # numpy keeps NaN payload bits; ggml and we do not
    with np.errstate(over="ignore"):
        assert np.array_equal(values[finite].astype(np.float16).view(np.uint16), want[finite])


def test_fp16_to_fp32_all_65536(ggml):
    h = np.arange(1 << 16, dtype=np.uint16)
    want = oracles.fp16_bits_to_fp32(ggml, h)
    out = np.empty((1, h.size), np.float32)
    f16.dequantize_into(h.view(np.uint8).reshape(1, -1), out)
    oracles.assert_bits_equal(out[0], want, "numba fp16 -> fp32")
    quiet = ~np.isnan(want) | ((want.view(np.uint32) & 0x400000) != 0)
    assert quiet.all(), "ggml returns quiet NaNs"
    signaling = (h & 0x7C00 == 0x7C00) & (h & 0x3FF != 0) & (h & 0x200 == 0)
    numpy_view = h.view(np.float16).astype(np.float32)  # keeps signaling NaNs signaling
    oracles.assert_bits_equal(numpy_view[~signaling], want[~signaling], "numpy fp16 -> fp32")


def test_fp32_to_bf16_matches_ggml(ggml):
    values = _fp32_patterns()
    want = oracles.fp32_to_bf16_bits(ggml, values)
    assert np.array_equal(_kernel(bf16, values), want)
    assert np.array_equal(bf16.quantize_ref(values[None, :]).view(np.uint16)[0], want)


@pytest.mark.parametrize("qtype", list(FLOATS))
@SETTINGS
@given(x=float_rows(32, max_rows=3, max_blocks=3))
def test_rows_match_ggml(ggml, qtype, x):
    want = ggml.quantize(x, qtype)
    nbytes = registry.get(qtype).type_size
    oracles.assert_bytes_equal(quant.quantize(x, qtype), want, nbytes, "fast")
    oracles.assert_bytes_equal(FLOATS[qtype].quantize_ref(x), want, nbytes, "reference")
    values = ggml.dequantize(want, qtype, x.shape[1])
    oracles.assert_bits_equal(quant.dequantize(want, qtype, x.shape[1]), values, "fast")
    oracles.assert_bits_equal(FLOATS[qtype].dequantize_ref(want, x.shape[1]), values, "reference")


# reference vs fast path, without the oracle: (format, operation, tolerance, why)
TABLE = [
    ("F32", "quantize", 0, "a byte copy"),
    ("F32", "dequantize", 0, "a byte copy"),
    ("F16", "quantize", 0, "IEEE round to nearest even on both sides"),
    ("F16", "dequantize", 0, "fp16 -> fp32 is exact"),
    ("BF16", "quantize", 0, "the same integer rounding on both sides"),
    ("BF16", "dequantize", 0, "bf16 -> fp32 is exact"),
]


@pytest.mark.parametrize("qtype,op,tol,why", TABLE)
@SETTINGS
@given(x=raw_floats(1, max_rows=3, max_blocks=40))
def test_reference_vs_fast(qtype, op, tol, why, x):
    mod = FLOATS[qtype]
    raw = mod.quantize_ref(x)
    if op == "quantize":
        got, ref = quant.quantize(x, qtype), raw
    else:
        got, ref = quant.dequantize(raw, qtype, x.shape[1]), mod.dequantize_ref(raw, x.shape[1])
    assert tol == 0 and np.array_equal(got.view(np.uint8), ref.view(np.uint8)), why


@SETTINGS
@given(x=float_rows(32, max_rows=2, max_blocks=3, kinds=("normal", "tiny_huge", "subnormal")))
def test_round_trip_error_bounds(x):
    """F32 exact; BF16 within half a bf16 ulp: 2**-8 |x| (normal) or 2**-134 (subnormal);
    F16 within 2**-11 |x| (normal fp16 range) or 2**-25 (below it), inf at |x| >= 65520."""
    x64 = x.astype(np.float64)
    assert np.array_equal(quant.dequantize(quant.quantize(x, "F32"), "F32", x.shape[1]), x)
    err = np.abs(quant.dequantize(quant.quantize(x, "BF16"), "BF16", x.shape[1]) - x64)
    assert np.all(err <= np.maximum(np.abs(x64) * 2.0**-8, 2.0**-134))
    with np.errstate(invalid="ignore"):
        y = quant.dequantize(quant.quantize(x, "F16"), "F16", x.shape[1]).astype(np.float64)
        big = np.abs(x64) >= 65520
        assert np.all(np.isinf(y[big]))
        err = np.abs(y - x64)[~big]
    assert np.all(err <= np.maximum(np.abs(x64[~big]) * 2.0**-11, 2.0**-25))


# ---- the public API contract ---------------------------------------------------------------

def test_supported_and_row_bytes_follow_gguf():
    assert quant.SUPPORTED == registry.SUPPORTED == ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q4_0",
                                                     "Q4_1", "Q5_0", "Q4_K", "Q5_K")
    assert [quant.row_bytes(q, 2560) for q in quant.SUPPORTED] == [10240, 5120, 5120, 2720, 2100,
                                                                   1440, 1600, 1760, 1440, 1760]


@pytest.mark.parametrize("call,match", [
    (lambda: quant.quantize(np.zeros((2, 64), np.float32), "Q5_1"), "unsupported"),
    (lambda: quant.quantize(np.zeros((2, 100), np.float32), "Q8_0"), "multiple of 32"),
    (lambda: quant.quantize(np.zeros((2, 2, 32), np.float32), "Q8_0"), "rows, cols"),
    (lambda: quant.quantize(np.array([[1.0, np.nan] * 16]), "Q8_0"), r"x\[0, 1\]"),
    (lambda: quant.quantize(np.array([["a"] * 32]), "Q8_0"), "real numbers"),
    (lambda: quant.row_bytes("Q6_K", 0), "positive multiple of 256"),
    (lambda: quant.row_bytes("Q6_K", 2.5), "positive integer"),
    (lambda: quant.dequantize(np.zeros((2, 33), np.uint8), "Q8_0", 32), r"\[rows, 34\]"),
    (lambda: quant.dequantize(np.zeros((2, 34), np.float32), "Q8_0", 32), "uint8"),
    (lambda: quant.dequantize(np.zeros(35, np.uint8), "Q8_0", 32), "whole number"),
])
def test_bad_input_raises_quant_error(call, match):
    with pytest.raises(QuantError, match=match):
        call()


def test_one_dimensional_input_is_one_row():
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    raw = quant.quantize(x, "Q6_K")
    assert raw.shape == (1, 210)
    assert np.array_equal(quant.dequantize(raw[0], "Q6_K", 256), quant.dequantize(raw, "Q6_K", 256))


def test_dequantize_reads_a_read_only_memmap_in_place(tmp_path):
    x = np.random.default_rng(0).standard_normal((5, 512)).astype(np.float32)
    for qtype in quant.SUPPORTED:
        raw = quant.quantize(x, qtype)
        path = tmp_path / f"{qtype}.bin"
        raw.tofile(path)
        mm = np.memmap(path, np.uint8, "r", shape=raw.shape)
        got = quant.dequantize(mm[1:4], qtype, 512)
        assert np.array_equal(got.view(np.uint8), quant.dequantize(raw[1:4], qtype, 512).view(np.uint8))
        assert not mm.flags.writeable and path.read_bytes() == raw.tobytes()


@pytest.mark.parametrize("qtype", quant.SUPPORTED)
def test_strided_views_work(qtype):
    x = np.random.default_rng(4).standard_normal((6, 512)).astype(np.float32)
    raw = quant.quantize(x, qtype)
    assert np.array_equal(quant.quantize(x[::2], qtype), raw[::2])
    got = quant.dequantize(raw[::2], qtype, 512)
    assert np.array_equal(got.view(np.uint8), quant.dequantize(raw, qtype, 512)[::2].view(np.uint8))


def test_quantize_does_not_modify_its_input():
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    before = x.copy()
    for qtype in quant.SUPPORTED:
        quant.quantize(x, qtype)
    assert np.array_equal(x, before)


def test_progress_and_threads_do_not_change_bytes(monkeypatch):
    monkeypatch.setattr(quant, "CHUNK_ROWS", 3)
    x = np.random.default_rng(2).standard_normal((10, 512)).astype(np.float32)
    calls = []
    one = quant.quantize(x, "Q6_K", progress=lambda done, total: calls.append((done, total)))
    assert calls == [(3, 10), (6, 10), (9, 10), (10, 10)]
    numba.set_num_threads(1)
    try:
        assert np.array_equal(quant.quantize(x, "Q6_K"), one)
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
