"""The shared scale-and-min K-quant pieces (quant/kquants/k_scale_min.py): the 12-byte scales field and
the make_qkx2_quants search, numba against the numpy reference. Whole blocks against ggml's C are
in tests/quant/test_oracle_formats.py."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactedit.quant.kquants import k_scale_min as ksm
from exactedit.quant.kquants import q4_k, q5_k
from exactedit.quant.formats.f16 import FP16_TO_FP32
from tests.strategies import float_rows

SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
SEARCHES = {"Q4_K": q4_k.SEARCH, "Q5_K": q5_k.SEARCH}


def test_scales_field_round_trips_every_6_bit_value():
    rng = np.random.default_rng(0)
    sc = rng.integers(0, 64, (4096, ksm.N_SUB))
    m = rng.integers(0, 64, (4096, ksm.N_SUB))
    sc[:64, :] = np.arange(64)[:, None]      # every value at every position
    m[:64, :] = np.arange(64)[::-1, None]
    packed = ksm.pack_scales_ref(sc, m)
    got_sc, got_m = ksm.unpack_scales_ref(packed)
    assert np.array_equal(got_sc, sc) and np.array_equal(got_m, m)


def test_numba_header_matches_the_reference():
    """write_header / read_header (numba) against pack_scales_ref and d * sc, dmin * m."""
    rng = np.random.default_rng(1)
    nb = 512
    sc = rng.integers(0, 64, (nb, ksm.N_SUB))
    m = rng.integers(0, 64, (nb, ksm.N_SUB))
    dh = rng.integers(0, 1 << 16, nb)
    mh = rng.integers(0, 1 << 16, nb)
    out = np.zeros((nb, 16), np.uint8)
    for b in range(nb):
        ksm.write_header(out[b], 0, dh[b], mh[b], sc[b], m[b])
    assert np.array_equal(out[:, 4:], ksm.pack_scales_ref(sc, m))
    assert np.array_equal(out[:, 0:2].copy().view("<u2")[:, 0], dh)
    assert np.array_equal(out[:, 2:4].copy().view("<u2")[:, 0], mh)
    d1 = np.empty(ksm.N_SUB, np.float32)
    m1 = np.empty(ksm.N_SUB, np.float32)
    with np.errstate(invalid="ignore"):
        want_d = FP16_TO_FP32[dh][:, None] * sc.astype(np.float32)
        want_m = FP16_TO_FP32[mh][:, None] * m.astype(np.float32)
    for b in range(nb):
        ksm.read_header(out, b, FP16_TO_FP32, d1, m1)
        assert np.array_equal(d1.view(np.uint32), want_d[b].view(np.uint32))
        assert np.array_equal(m1.view(np.uint32), want_m[b].view(np.uint32))


@pytest.mark.parametrize("qtype", SEARCHES)
@SETTINGS
@given(data=st.data())
def test_search_numba_equals_reference(qtype, data):
    """make_qkx2_quants: scale, min and codes bit for bit (tolerance 0: it is a quantizer)."""
    xs = data.draw(float_rows(ksm.SUB, max_rows=1, max_blocks=8)).reshape(-1, ksm.SUB)
    search = SEARCHES[qtype]
    with np.errstate(all="ignore"):
        w = ksm.weights_ref(xs)
        scale, the_min, L = ksm.search_ref(xs, w, search)
    L_fast = np.empty(ksm.SUB, np.int64)
    laux = np.empty(ksm.SUB, np.int64)
    for s in range(len(xs)):
        got = ksm.search(xs[s], w[s], *search.args(), L_fast, laux)
        assert np.float32(got[0]).view(np.uint32) == scale[s].view(np.uint32), s
        assert np.float32(got[1]).view(np.uint32) == the_min[s].view(np.uint32), s
        assert np.array_equal(L_fast, L[s]), s


@pytest.mark.parametrize("qtype", SEARCHES)
def test_search_never_does_worse_than_its_first_guess(qtype):
    """The kept fit's weighted error is at most that of the plain min/max codes (the search only
    replaces its fit by a strictly better one)."""
    search = SEARCHES[qtype]
    xs = (np.random.default_rng(2).standard_normal((2000, ksm.SUB)) * 0.02).astype(np.float32)
    w = ksm.weights_ref(xs)
    scale, the_min, L = ksm.search_ref(xs, w, search)
    mn = np.minimum(xs.min(axis=1), 0)
    first_scale = (xs.max(axis=1) - mn) / np.float32(search.nmax)
    first = np.clip(np.round((xs - mn[:, None]) / first_scale[:, None]), 0, search.nmax)

    def err(s, m, codes):
        return (w * (s[:, None] * codes - m[:, None] - xs) ** 2).sum(axis=1)

    kept = err(scale.astype(np.float64), the_min.astype(np.float64), L)
    assert np.all(kept <= err(first_scale.astype(np.float64), -mn.astype(np.float64), first) * (1 + 1e-5))
    assert np.all(L >= 0) and np.all(L <= search.nmax) and np.all(the_min >= 0)
