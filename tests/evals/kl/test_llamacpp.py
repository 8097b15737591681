"""llama-perplexity's KL conventions: the numba kernels against the numpy/libm reference (bit for
bit), the codes against their definition, and the report's formulas against hand computation."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from exactedit.evals.kl import llamacpp as lp
from exactedit.evals.kl.llamacpp_stats import (
    base_ppl, lp_stats, median, percentile, render_chunk_table, render_lp_report,
)

ROW_KINDS = ("normal", "wide", "ties", "constant", "one_hot")


def make_logits(kind: str, T: int, V: int, rng) -> np.ndarray:
    if kind == "normal":            # spread < 16 nats: the window's floor is the row's minimum
        x = rng.standard_normal((T, V)) * 2.0 ** rng.uniform(-4, 1)
    elif kind == "wide":            # spread > 16 nats: most tokens fall below the window
        x = rng.standard_normal((T, V)) * 2.0 ** rng.uniform(2, 6) + 2.0 ** rng.uniform(-2, 10)
    elif kind == "ties":            # repeated maxima (first-maximum rules) and grid values (round-half cases)
        x = rng.integers(-40, 8, (T, V)) / 4.0
    elif kind == "constant":        # scale 0: every code is 0
        x = np.full((T, V), rng.uniform(-30, 30))
    else:                           # one token far above all others
        x = rng.standard_normal((T, V))
        x[np.arange(T), rng.integers(0, V, T)] += 40.0
    return x.astype(np.float32)


@st.composite
def logits_case(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(ROW_KINDS))
    T, V = draw(st.integers(1, 3)), draw(st.integers(1, 300))
    base = make_logits(kind, T, V, rng)
    shift = draw(st.sampled_from([0.0, 1e-3, 0.3, 5.0]))
    edited = (base + shift * rng.standard_normal((T, V))).astype(np.float32)
    return base, edited, rng.integers(0, V, T)


# One table: fast path, reference, tolerance, reason.
KERNELS = [
    ("encode_base", lp.encode_base, lp.encode_base_ref, 0,
     "same float32 operations in the same order, libm's expf and log on both sides"),
    ("score_rows", lp.score_rows, lp.score_rows_ref, 0,
     "same float32 operations in the same order, libm's expf and log on both sides"),
]


def _run(name, fn, base, edited, nxt):
    if name == "encode_base":
        rows, nll = fn(base, nxt)
        return (*rows, nll)
    rows, _ = lp.encode_base(base, nxt)
    return tuple(fn(edited, rows, nxt))


@pytest.mark.parametrize("name,fast,ref,tol,reason", KERNELS, ids=[k[0] for k in KERNELS])
@settings(max_examples=40, deadline=None)
@given(case=logits_case())
@example(case=(np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32), np.array([0])))
@example(case=(np.array([[0.0, 0.0, -16.0, -16.0001, -40.0]], np.float32),
               np.array([[0.0, 1.0, -16.0, 3.0, -40.0]], np.float32), np.array([3])))
def test_fast_path_equals_reference(name, fast, ref, tol, reason, case):
    base, edited, nxt = case
    got, want = _run(name, fast, base, edited, nxt), _run(name, ref, base, edited, nxt)
    for g, w, field in zip(got, want, range(len(got))):
        assert g.dtype == w.dtype and np.array_equal(g, w), (name, field, reason, g, w)


def test_numba_exp_is_libm_expf():
    """The premise of the fast paths: numba's float32 math.exp calls the C library's expf (numpy's
    own float32 exp is another approximation and differs on many inputs)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(20000) * 8 - 8).astype(np.float32)
    rows, _ = lp.encode_base(x[None, :], np.array([0]))
    ref, _ = lp.encode_base_ref(x[None, :], np.array([0]))
    assert np.array_equal(rows.codes, ref.codes) and rows.min_log_prob[0] == ref.min_log_prob[0]


def test_codes_decode_to_the_log_softmax_within_the_window():
    rng = np.random.default_rng(1)
    x = make_logits("wide", 4, 500, rng)
    rows, nll = lp.encode_base(x, np.zeros(4, np.int64))
    lse = np.log(np.exp(x.astype(np.float64) - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    exact = x - lse[:, None]
    dec = rows.decoded()
    top = x.max(1, keepdims=True)
    inside = x > top - 16
    step = rows.scale[:, None]
    assert np.all(np.abs(dec - exact)[inside] <= step.repeat(500, 1)[inside] / 2 + 1e-5)
    assert np.all(rows.codes[~inside] == 0)                          # below the window: the floor code
    assert np.all(rows.codes.max(1) == 65535)                       # the top logit gets the top code
    np.testing.assert_allclose(rows.scale, np.float32(16) / np.float32(65535), rtol=1e-6)
    np.testing.assert_allclose(nll, -exact[:, 0], atol=1e-5)


def test_kl_of_a_model_with_itself_is_only_the_code_rounding():
    """Same logits on both sides: the tool's KL is not 0 but the codes' rounding (either sign),
    far below a real edit; same top always agrees unless two logits share the top code."""
    rng = np.random.default_rng(2)
    x = make_logits("normal", 6, 400, rng)
    rows, _ = lp.encode_base(x, np.zeros(6, np.int64))
    r = lp.score_rows(x, rows, np.zeros(6, np.int64))
    assert np.all(np.abs(r.kld) < 1e-6) and np.any(r.kld != 0)
    assert np.all(r.argmax == r.argmax_base)
    assert np.all(np.abs(r.p_diff) < 1e-4)


def test_cutoff_drops_tokens_at_or_below_minus_16():
    """One token of edited mass where the base has < e^-16: the tool's KL leaves its term out."""
    base = np.array([[0.0, -30.0]], np.float32)       # p(token 1) ~ e^-30: below the window
    edited = np.array([[0.0, 0.0]], np.float32)
    rows, _ = lp.encode_base(base, np.array([0]))
    r = lp.score_rows(edited, rows, np.array([0]))
    assert rows.decoded()[0, 1] <= -16                 # the floor code decodes to the window's bottom
    # only token 0 counts: p0 (log p0 - log q0) with p0 ~ 1, q0 = 1/2
    assert r.kld[0] == pytest.approx(math.log(2), rel=1e-5)


def test_bad_inputs_are_refused():
    x = np.zeros((2, 5), np.float32)
    with pytest.raises(ValueError, match="next"):
        lp.encode_base(x, np.array([0, -1]))
    rows, _ = lp.encode_base(x, np.array([0, 1]))
    with pytest.raises(ValueError, match="columns"):
        lp.score_rows(np.zeros((2, 4), np.float32), rows, np.array([0, 1]))


# ---- the report ---------------------------------------------------------------------------------
def _rows(n: int, seed: int = 0) -> lp.LpRows:
    rng = np.random.default_rng(seed)
    nll = rng.uniform(0.1, 6, n).astype(np.float32)
    nll_b = (nll + rng.normal(0, 0.1, n)).astype(np.float32)
    p_diff = (np.exp(-nll) - np.exp(-nll_b)).astype(np.float32)
    kld = np.abs(rng.standard_normal(n)) * 1e-2
    arg = rng.integers(0, 5, n)
    return lp.LpRows(kld, nll, nll_b, p_diff, arg, np.where(rng.random(n) < 0.9, arg, -1))


def test_report_formulas_by_hand():
    r = _rows(300)
    s = lp_stats(r, (150, 150))
    n = 300
    nll, nllb = r.nll.astype(float), r.nll_base.astype(float)
    se = lambda x: math.sqrt((np.mean(x * x) - np.mean(x) ** 2) / (n - 1))  # noqa: E731
    assert s.ppl == pytest.approx(math.exp(nll.mean()), rel=1e-12)
    assert s.ppl_unc == pytest.approx(s.ppl * se(nll), rel=1e-5)
    assert s.ppl_base == pytest.approx(math.exp(nllb.mean()), rel=1e-12)
    cov = (np.mean(nll * nllb) - nll.mean() * nllb.mean()) / (n - 1)
    assert s.cor == pytest.approx(cov / (se(nll) * se(nllb)), rel=1e-4)
    assert s.ln_ratio == pytest.approx(nll.mean() - nllb.mean(), rel=1e-12)
    assert s.ln_ratio_unc == pytest.approx(math.sqrt(se(nll) ** 2 + se(nllb) ** 2 - 2 * cov), rel=1e-4)
    assert s.kld_mean == pytest.approx(r.kld.mean(), rel=1e-12)
    assert s.kld_unc == pytest.approx(se(r.kld), rel=1e-6)
    srt = np.sort(r.kld.astype(np.float32))
    assert s.kld["Maximum"] == srt[-1] and s.kld["Minimum"] == srt[0]
    assert s.kld["Median"] == pytest.approx(0.5 * (srt[149] + srt[150]), rel=1e-7)
    p = np.float32(0.9) * np.float32(299)                            # 269.1 in float32
    assert s.kld["90.0%"] == pytest.approx((1 - (p - 269)) * srt[269] + (p - 269) * srt[270], rel=1e-6)
    pd = r.p_diff.astype(float)
    assert s.dp_mean == pytest.approx(pd.mean(), rel=1e-6)
    assert s.rms_dp == pytest.approx(math.sqrt(np.mean(pd * pd)), rel=1e-6)
    assert s.same_top == pytest.approx(np.mean(r.argmax == r.argmax_base))
    assert s.same_top_unc == pytest.approx(math.sqrt(s.same_top * (1 - s.same_top) / (n - 1)))
    # the running table: its last line is the summary, its first the first chunk alone
    last, first = s.chunks[-1], s.chunks[0]
    assert (last.ppl, last.kld, last.rms_dp, last.same_top) == (s.ppl, s.kld_mean, s.rms_dp, s.same_top)
    head = lp_stats(lp.LpRows(*(f[:150] for f in r)))
    assert (first.ppl, first.kld, first.same_top) == (head.ppl, head.kld_mean, head.same_top)


def test_order_statistics_in_float32():
    v = np.sort(np.array([1e-3, 2e-3, 7e-3, 0.5], np.float32))
    assert median(v) == np.float32(np.float32(0.5) * (v[1] + v[2]))
    assert median(v[:3]) == v[1]
    assert percentile(v, 0.0) == v[0] and percentile(v, 1.0) == v[-1]
    p = np.float32(np.float32(0.999) * np.float32(3))
    frac = np.float32(p - np.float32(2))
    assert percentile(v, 0.999) == np.float32((np.float32(1) - frac) * v[2] + frac * v[3])


def test_uncertainties_vanish_below_eleven_rows():
    s = lp_stats(_rows(10))
    assert s.kld_unc == 0 and s.ppl_unc == 0 and s.dp_unc == 0


def test_report_prints_the_tools_lines():
    s = lp_stats(_rows(200), (100, 100))
    lines = render_lp_report(s)
    assert lines[0] == "====== Perplexity statistics ======"
    assert lines[1] == "Mean PPL(Q)                   : %10.6f ± %10.6f" % (s.ppl, s.ppl_unc)
    assert lines[3] == "Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%" % (100 * s.cor)
    assert "Mean    KLD: %10.6f ± %10.6f" % (s.kld_mean, s.kld_unc) in lines
    assert "99.9%%   KLD: %10.6f" % s.kld["99.9%"] in lines and " 0.1%%   KLD: %10.6f" % s.kld[" 0.1%"] in lines
    assert "Median  Δp: %6.3f%%" % (100 * s.dp["Median"]) in lines
    assert lines[-1] == "Same top p: %6.3f ± %5.3f %%" % (100 * s.same_top, 100 * s.same_top_unc)
    assert len(lines) == 7 + 2 + 1 + 11 + 2 + 1 + 13 + 2
    table = render_chunk_table(s)
    assert table[1].startswith("   1    ") and table[2].endswith(" %") and len(table) == 3


def test_base_pass_estimate():
    nll = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    ppl, unc = base_ppl(nll)
    assert ppl == pytest.approx(math.exp(2.5))
    assert unc == pytest.approx(math.exp(2.5) * math.sqrt((7.5 - 6.25) / 3))


def test_nan_printed_as_glibc_prints_it():
    """sqrt of a negative variance (10 rows: covariance counted, uncertainties not) is x86's default
    NaN, which glibc prints as -nan."""
    from exactedit.evals.kl.llamacpp_stats import _c

    s = lp_stats(_rows(10), (10,))
    assert math.isnan(s.chunks[0].ln_ratio_unc) or s.chunks[0].ln_ratio_unc >= 0
    assert _c("%10.5f ± %10.5f %%", 1.5, -float("nan")) == "   1.50000 ±       -nan %"
    assert _c("%6.2f%%", float("inf")) == "   inf%"
