"""KL statistics: the streamed per-row KL against a float64 whole-matrix reference, exact zeros
for unedited models, the statistics against hand computation, and `kld` end to end on GGUFs."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from exactedit.evals.kl.compare import KldConfig, compare
from exactedit.evals.kl.stats import kld_stats
from exactedit.solvers.tail.passes.kl_pass import KlRows, kl_rows
from exactedit.solvers.tail.forward.head_ref import log_softmax_ref, logits_ref
from exactedit.solvers.tail.passes.vocab_pass import ArrayRows

U32 = 2.0 ** -24


def gamma(k: int) -> float:
    return k * U32 / (1 - k * U32)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(1, 5), n=st.integers(1, 32),
       V=st.integers(2, 300), tile=st.integers(1, 128), edit=st.sampled_from(["rows", "mix", "both"]),
       size=st.sampled_from([1e-3, 0.1, 2.0]), softcap=st.sampled_from([None, 10.0]))
def test_kl_rows_matches_float64_reference(seed, T, n, V, tile, edit, size, softcap):
    """Tolerance, from KL = E_p[d] + log E_p[e^-d] with d = l - l': each float32 logit is off by
    at most e = gamma_n |mix|.|W|, so d_v by at most e + e' (exactly 0 where row and mix are
    unchanged). dKL/dd_v = p_v - q_v gives TV(p, q)-weighted (e + e'); moving l with d fixed, or
    the weights by the float32 exp (relative 2u), cancels between the two terms to first order,
    leaving O(max|d|^2) times the perturbation. Factor 2 for second-order terms, plus float64
    rounding of the final sum."""
    rng = np.random.default_rng(seed)
    mix, W = rng.standard_normal((T, n)).astype(np.float32), rng.standard_normal((V, n)).astype(np.float32)
    mix2, W2 = mix.copy(), W.copy()
    if edit in ("rows", "both"):
        S = rng.choice(V, size=max(1, V // 10), replace=False)
        W2[S] += (size * rng.standard_normal((S.size, n))).astype(np.float32)
    if edit in ("mix", "both"):
        mix2 += (size * rng.standard_normal((T, n))).astype(np.float32)
    nxt = rng.integers(-1, V, T)
    r = kl_rows(mix, ArrayRows(W), mix2, ArrayRows(W2), next_ids=nxt, softcap=softcap, tile_rows=tile)
    lp, lq = log_softmax_ref(logits_ref(mix, W, softcap)), log_softmax_ref(logits_ref(mix2, W2, softcap))
    ref = np.sum(np.exp(lp) * (lp - lq), axis=1)
    e1 = (gamma(n) * (np.abs(mix.astype(float)) @ np.abs(W.astype(float)).T)).max(axis=1)
    e2 = (gamma(n) * (np.abs(mix2.astype(float)) @ np.abs(W2.astype(float)).T)).max(axis=1)
    dmax = np.abs(logits_ref(mix, W, softcap) - logits_ref(mix2, W2, softcap)).max(axis=1)
    tv = np.abs(np.exp(lp) - np.exp(lq)).sum(axis=1)
    tol = 2 * (tv * (e1 + e2) + (dmax + e1 + e2) ** 2 * (e1 + e2 + 4 * U32)) + 4 * U32 * ref
    tol += 1e-14 * (dmax + 1e-3)
    assert np.all(np.abs(r.kl - ref) <= tol), (r.kl, ref, tol)
    known = nxt >= 0
    want = np.take_along_axis(lq, np.maximum(nxt, 0)[:, None], axis=1)[:, 0]
    assert np.all(np.abs(r.logp_next_edited[known] - want[known]) <= 2 * e2[known] + 4 * U32 * (1 + np.abs(want[known])))
    assert np.isnan(r.logp_next_base[~known]).all()


def test_unedited_gives_exact_zero_and_reuses_tiles():
    rng = np.random.default_rng(0)
    mix, W = rng.standard_normal((4, 16)).astype(np.float32), rng.standard_normal((100, 16)).astype(np.float32)

    class Count(ArrayRows):
        reads = 0

        def read(self, a, b):
            Count.reads += 1
            return super().read(a, b)

    r = kl_rows(mix, Count(W), mix.copy(), Count(W.copy()), next_ids=np.arange(4), tile_rows=32)
    assert np.array_equal(r.kl, np.zeros(4)) and Count.reads == 4  # 4 tiles, read once each
    s = kld_stats(r)
    assert s.kld_max == 0 and s.same_top == 1 and s.ppl_base == s.ppl_edited and s.dp_rms == 0


def test_one_row_edit_moves_only_its_rows():
    """An edit of head row v changes KL only where it matters; tiles without v contribute 0."""
    rng = np.random.default_rng(1)
    mix, W = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((64, 8)).astype(np.float32)
    W2 = W.copy()
    W2[5] += 3.0
    r = kl_rows(mix, ArrayRows(W), mix, ArrayRows(W2), tile_rows=16)
    lp, lq = log_softmax_ref(logits_ref(mix, W)), log_softmax_ref(logits_ref(mix, W2))
    np.testing.assert_allclose(r.kl, np.sum(np.exp(lp) * (lp - lq), axis=1), rtol=1e-5)
    assert np.all(r.kl > 0)


def test_stats_by_hand():
    kl = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 1.0, 0.05, 0.02, 0.01, 0.5])
    lb = np.log(np.array([0.5, 0.25, np.nan, 0.1, 0.5, 0.2, 0.3, 0.4, 0.5, 0.6]))
    le = np.log(np.array([0.4, 0.25, np.nan, 0.2, 0.5, 0.1, 0.3, 0.4, 0.6, 0.6]))
    arg_b = np.arange(10)
    arg_e = np.where(np.arange(10) < 7, arg_b, 0)
    r = KlRows(kl, arg_b, arg_e, np.zeros(10), np.zeros(10), lb, le)
    s = kld_stats(r)
    srt = np.sort(kl)
    assert s.rows == 10 and s.kld_mean == pytest.approx(kl.mean()) and s.kld_max == 1.0 and s.kld_min == 0
    assert s.kld_median == pytest.approx((srt[4] + srt[5]) / 2)
    assert s.kld_p90 == pytest.approx(srt[8] + 0.1 * (srt[9] - srt[8]))  # position 0.9 * 9 = 8.1
    assert s.kld_mean_stderr == pytest.approx(np.std(kl, ddof=1) / np.sqrt(10))
    assert s.same_top == pytest.approx(0.7) and s.ppl_rows == 9
    known = ~np.isnan(lb)
    assert s.ppl_base == pytest.approx(np.exp(-lb[known].mean()))
    assert s.ppl_edited == pytest.approx(np.exp(-le[known].mean()))
    assert s.dp_mean == pytest.approx(np.mean(np.exp(le[known]) - np.exp(lb[known])))
    assert s.ln_ppl_ratio == pytest.approx(np.mean(lb[known] - le[known]))
    with pytest.raises(ValueError):
        kld_stats(KlRows(*(np.zeros(0),) * 7))


def test_kld_end_to_end_on_gguf(tmp_path):
    """Base vs a copy with one head row replaced (re-quantized Q6_K) and vs itself."""
    from exactedit import quant
    from exactedit.dumps import DocInfo, write_dump
    from exactedit.quant import gguf
    from exactedit.quant.gguf.write import synthetic_model
    from exactedit.quant.gguf.transplant import transplant

    base = tmp_path / "base.gguf"
    synthetic_model(base, tail="hc4", vocab=300, n=256, h=32, d_lo=32, layers=2, seed=3)
    rng = np.random.default_rng(2)
    T = 10
    write_dump(tmp_path / "d", arch="hc4", layer=1, docs=[DocInfo("d", 0, T, "s", "c")], fields={
        "tokens": rng.integers(0, 300, T), "next": np.r_[rng.integers(0, 300, T - 1), -1],
        "R": rng.standard_normal((T, 4, 256)), "inj": rng.standard_normal((T, 4)),
        "hh": rng.standard_normal((T, 32)), "sgv": rng.standard_normal(T), "yr": rng.standard_normal((T, 256))})
    with gguf.open(base) as g:
        W = g.read_rows("output.weight")
        raw = np.array(g.read_raw("output.weight"))
    raw[17] = quant.quantize(W[17] + 0.5, "Q6_K")[0]
    edited = tmp_path / "edited.gguf"
    transplant(base, edited, replace={"output.weight": raw})
    cfg = lambda e, rows=(): KldConfig(dumps=(str(tmp_path / "d"),), model=str(base), edited=str(e), rows=rows)  # noqa: E731
    same = compare(cfg(base)).exact
    assert same.kld_max == 0 and same.same_top == 1 and same.ppl_rows == T - 1
    res = compare(cfg(edited, ("0:8",)), progress=lambda d, t: None)
    assert res.exact.rows == 8 and res.exact.kld_min > 0 and res.dumps[0].spans[0][1:] == (0, 8)
    assert res.edited_sha256 != res.model_sha256
    d = res.exact.to_dict()
    for key in ("kld_mean", "kld_median", "kld_p90", "kld_p99", "kld_max", "same_top", "ppl_base", "ppl_edited"):
        assert key in d
