"""Q4_0, Q4_1, Q5_0, Q4_K, Q5_K: round-trip error bounds (why each holds is in its docstring).
The byte-for-byte checks against ggml and the numpy references are in test_oracle_formats.py."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from exactedit import quant
from exactedit.quant.kquants import k_scale_min as ksm
from exactedit.quant.formats import q4_0, q4_1, q5_0
from exactedit.quant.kquants import q4_k, q5_k
from tests.strategies import float_rows

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
KINDS = ("normal", "zero", "constant", "ties", "outlier", "fp16_underflow")
SLACK = 1 + 2.0**-7   # fp16 rounding of the scales (2**-11 relative, times at most 16 codes) and float32


def _normal_fp16(v: np.ndarray) -> np.ndarray:
    a = np.abs(v.astype(np.float64))
    return (a >= 2.0**-14) & (a <= 65504)


def _round_trip(x, qtype):
    raw = quant.quantize(x, qtype)
    return raw, quant.dequantize(raw, qtype, x.shape[1]).astype(np.float64)


@pytest.mark.parametrize("module,nmax", [(q4_0, 8), (q5_0, 16)])
@SETTINGS
@given(data=float_rows(32, max_rows=2, max_blocks=6, kinds=KINDS))
def test_symmetric_formats(module, nmax, data):
    """Q4_0 / Q5_0: d = max / -nmax (max: the signed value of largest magnitude A), code - nmax =
    x/d rounded half up, clamped at nmax - 1. So |x^ - x| <= |d|/2 where x/d < nmax - 1/2 and
    <= |d| = A/nmax at the clamped end (the value -max), within SLACK. Blocks with a subnormal
    or overflowing fp16 d are left out."""
    x = data
    raw, y = _round_trip(x, module.NAME)
    xs = x.astype(np.float64).reshape(-1, 32)
    d = raw.view(module.BLOCK)["d"].reshape(-1).astype(np.float64)
    ok = _normal_fp16(d)
    d_exact = q4_0.signed_max_ref(x.reshape(-1, 32)).astype(np.float64)[:, None] / -nmax
    with np.errstate(divide="ignore", invalid="ignore"):
        t = xs / d_exact
    step = np.abs(d_exact)
    bound = np.where(t < nmax - 0.5, step / 2, step) * SLACK
    err = np.abs(y.reshape(xs.shape) - xs)
    assert np.all((err <= bound)[ok])


@SETTINGS
@given(data=float_rows(32, max_rows=2, max_blocks=6, kinds=KINDS))
def test_q4_1(data):
    """Q4_1: d = (max - min)/15, codes (x - min)/d rounded half up in 0..15, value code*d + min
    through fp16 d and m: |x^ - x| <= d/2 + 15 |d - fp16 d| + |min - fp16 min| + float32
    roundings <= (d/2 + |min| 2**-10) * SLACK. Blocks with non-normal fp16 d or m are left out."""
    x = data
    raw, y = _round_trip(x, "Q4_1")
    xs = x.astype(np.float64).reshape(-1, 32)
    b = raw.view(q4_1.BLOCK).reshape(-1)
    d, m = b["d"].astype(np.float64), b["m"].astype(np.float64)
    ok = _normal_fp16(d) & (_normal_fp16(m) | (m == 0))
    lo, hi = xs.min(axis=1), xs.max(axis=1)
    bound = ((hi - lo) / 30 + np.abs(lo) * 2.0**-10 + np.abs(xs).max(axis=1) * 2.0**-20) * SLACK
    err = np.abs(y.reshape(xs.shape) - xs).max(axis=1)
    assert np.all((err <= bound)[ok])


@pytest.mark.parametrize("module", [q4_k, q5_k])
@SETTINGS
@given(data=float_rows(256, max_rows=2, max_blocks=2, kinds=KINDS))
def test_k_quants_round_to_nearest_under_their_header(module, data):
    """Q4_K / Q5_K: given the stored header (d, dmin, 6-bit sc_j, m_j), each code is the nearest
    one: where (x + dmin m_j) / (d sc_j) lies in [0, nmax], |x^ - x| <= d sc_j / 2 (within float32
    rounding); outside, the code is the clamped end. Sub-blocks with d sc_j == 0 or a non-normal
    fp16 d are left out."""
    x = data
    raw, y = _round_trip(x, module.NAME)
    b = raw.view(module.BLOCK).reshape(-1)
    sc, m = ksm.unpack_scales_ref(b["scales"])
    d, dmin = b["d"].astype(np.float64)[:, None], b["dmin"].astype(np.float64)[:, None]
    with np.errstate(invalid="ignore"):  # inf * 0 in blocks left out below
        dj, mj = d * sc, dmin * m                                    # [nb, 8]
    xs = x.astype(np.float64).reshape(-1, ksm.N_SUB, ksm.SUB)
    ys = y.reshape(xs.shape)
    codes = module.codes_ref(b).reshape(xs.shape)
    ok = ((dj > 0) & _normal_fp16(d) & (_normal_fp16(dmin) | (dmin == 0)))[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (xs + mj[:, :, None]) / dj[:, :, None]
    nmax = module.SEARCH.nmax
    inside = (t >= 0) & (t <= nmax)
    tiny = 2.0**-20 * (np.abs(xs) + mj[:, :, None])
    assert np.all((np.abs(ys - xs) <= dj[:, :, None] * 0.5 * (1 + 2.0**-16) + tiny)[ok & inside])
    assert np.all((codes == 0)[ok & (t < 0)]) and np.all((codes == nmax)[ok & (t > nmax)])


@pytest.mark.parametrize("qtype,rel_rms", [("Q4_0", 0.090), ("Q4_1", 0.082), ("Q5_0", 0.045),
                                           ("Q4_K", 0.075), ("Q5_K", 0.038)])
def test_gaussian_weight_error(qtype, rel_rms):
    """Relative RMS round-trip error on Gaussian weight rows, a regression bar set about 5% above
    the measured values (0.086, 0.078, 0.043, 0.071, 0.036): the K-quants' scale search must beat
    the legacy formats of the same width."""
    w = (np.random.default_rng(3).standard_normal((64, 2560)) * 0.02).astype(np.float32)
    _, y = _round_trip(w, qtype)
    err = np.sqrt(np.mean((y - w) ** 2)) / np.sqrt(np.mean(w.astype(np.float64) ** 2))
    assert err <= rel_rms
