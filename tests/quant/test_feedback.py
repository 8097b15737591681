"""quant.rounding.feedback: error-feedback rounding within fixed block scales, scored in an H-norm.

One table drives the reference-vs-fast comparison; the properties (never worse than ggml's
quantizer or than rounding within the same scales, valid bytes) run under hypothesis."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactedit import quant
from exactedit.quant.rounding import feedback as fb
from exactedit.quant.rounding import grid as gr
from exactedit.errors import QuantError
from tests import oracles
from tests.strategies import float_rows

SETTINGS = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
BLOCKS = {"Q8_0": 32, "Q6_K": 256}


def _metric(h: int, rank: int, weight: float, seed: int) -> tuple[fb.Metric, np.ndarray]:
    """H = I + weight * V V^T / h with V [h, rank] Gaussian: a ridge plus hard directions."""
    V = np.random.default_rng(seed).standard_normal((h, rank))
    return fb.Metric(np.ones(h), np.sqrt(weight / h) * V.T), V


def _edited(qtype: str, rows: int, h: int, edit: float, seed: int):
    """Rows on a quantized grid (the original tensor) and a small edit of them."""
    rng = np.random.default_rng(seed)
    raw0 = quant.quantize((rng.standard_normal((rows, h)) * 0.02).astype(np.float32), qtype)
    w0 = quant.dequantize(raw0, qtype, h).astype(np.float64)
    return raw0, w0 + rng.standard_normal((rows, h)) * edit


class Case(NamedTuple):
    qtype: str
    h: int
    rank: int
    weight: float
    edit: float      # edit scale; large values push codes into the clamp
    tol_codes: int   # codes allowed to differ between reference and fast path
    why: str


CASES = {
    "q6_k_ridge_only": Case("Q6_K", 512, 0, 0.0, 1e-3, 0, "H = I: no feedback, both round each value"),
    "q6_k_hard_dirs": Case("Q6_K", 768, 12, 1e3, 1e-3, 0,
                           "the reference (H multiplied out, Cholesky of H^-1) and the fast path (Woodbury, "
                           "one p-vector per row) round the same targets up to ~1e-12 relative: a code can "
                           "flip only where a target is that close to a half step; Gaussian data never is"),
    "q6_k_clamped": Case("Q6_K", 512, 8, 1e2, 2e-2, 0, "as above; clamped codes are clamped alike"),
    "q8_0_hard_dirs": Case("Q8_0", 512, 12, 1e3, 1e-3, 0, "as q6_k_hard_dirs"),
    "q8_0_clamped": Case("Q8_0", 256, 4, 1e2, 3e-2, 0, "as q6_k_clamped"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fast_matches_reference(name):
    c = CASES[name]
    raw0, target = _edited(c.qtype, 3, c.h, c.edit, seed=len(name))
    metric, _ = _metric(c.h, c.rank, c.weight, seed=7)
    grid = gr.grid_of(raw0, c.qtype, c.h)
    ref = fb.feedback_ref(target, grid, metric)
    fast = fb.feedback(target, grid, metric)
    assert int(np.sum(ref != fast)) <= c.tol_codes, c.why
    pref = fb.polish_ref(target, grid, metric, ref)
    pfast = fb.polish(target, grid, metric, fast)
    assert int(np.sum(pref != pfast)) <= c.tol_codes, c.why
    if c.rank == 0:
        assert np.array_equal(ref, gr.nearest(grid, target)), "a diagonal H has no feedback"


def _check_ship(ship: fb.FeedbackShip, target, qtype, metric, sources, ggml=None):
    cols = target.shape[1]
    ggml_raw = quant.quantize(target.astype(np.float32), qtype)
    ggml_obj = metric.objective(quant.dequantize(ggml_raw, qtype, cols) - target)
    finite = np.isfinite(ggml_obj)
    assert np.all(ship.objective[finite] <= ggml_obj[finite]), "worse than ggml's quantizer"
    for src in sources.values():
        g = gr.grid_of(src, qtype, cols)
        near = gr.values(g, gr.nearest(g, target)).astype(np.float64) - target
        obj = metric.objective(near)
        ok = np.isfinite(obj) & np.all(np.isfinite(g.steps), axis=1)
        assert np.all(ship.objective[ok] <= obj[ok]), "worse than rounding within the same scales"
    # valid bytes: each row has the scale fields of ggml's bytes or of a source, codes in range,
    # and dequantizes to the values reported
    got = gr.grid_of(ship.raw, qtype, cols)
    lo, hi = gr.CODE_RANGE[qtype]
    codes = gr.codes_of(ship.raw, qtype, cols)
    assert codes.min() >= lo and codes.max() <= hi
    scale_sources = [ggml_raw] + list(sources.values())
    for r in range(target.shape[0]):
        assert any(np.array_equal(gr.grid_of(s[r], qtype, cols).steps, got.steps[r:r + 1], equal_nan=True)
                   for s in scale_sources), f"row {r}: scales of no candidate"
    oracles.assert_bits_equal(quant.dequantize(ship.raw, qtype, cols), ship.values, "shipped values")
    if ggml is not None:
        oracles.assert_bits_equal(ggml.dequantize(np.array(ship.raw), qtype, cols), ship.values, "ggml reads")


@SETTINGS
@given(qtype=st.sampled_from(list(gr.GRID_TYPES)), rank=st.integers(0, 10),
       weight=st.sampled_from([0.0, 1.0, 1e2, 1e4]), edit=st.sampled_from([0.0, 1e-4, 1e-3, 1e-2, 5e-2]),
       seed=st.integers(0, 2**16))
@example(qtype="Q6_K", rank=10, weight=1e4, edit=5e-2, seed=0)
def test_ship_never_worse_valid_bytes(qtype, rank, weight, edit, seed):
    h = 512
    raw0, target = _edited(qtype, 2, h, edit, seed)
    metric, _ = _metric(h, max(rank, 1), weight, seed + 1)
    sources = {"orig": raw0}
    ship = fb.ship_rows(target, qtype, metric, sources)
    _check_ship(ship, target, qtype, metric, sources)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), qtype=st.sampled_from(list(gr.GRID_TYPES)), seed=st.integers(0, 2**16))
def test_ship_corner_rows(ggml, data, qtype, seed):
    """Rows from the format tests' corner kinds (ggml's own candidate has inf or NaN scales in
    some): the result still loads in ggml and is never worse than its quantizer where finite."""
    x = data.draw(float_rows(BLOCKS[qtype] * (8 if qtype == "Q8_0" else 1), max_rows=2, max_blocks=2,
                             kinds=("normal", "zero", "constant", "ties", "outlier", "fp16_underflow",
                                    "fp16_overflow")))
    h = x.shape[1]
    target = x.astype(np.float64)
    metric, _ = _metric(h, 4, 1e2, seed)
    perturbed = quant.quantize((x * np.float32(1.01)).astype(np.float32), qtype)
    sources = {"other": perturbed}
    ship = fb.ship_rows(target, qtype, metric, sources)
    _check_ship(ship, target, qtype, metric, sources, ggml)


@pytest.fixture(scope="module")
def ggml():
    return oracles.load()


@pytest.mark.parametrize("qtype", gr.GRID_TYPES)
def test_hard_directions_kept(qtype):
    """What the module is for: with hard directions V weighted into H, the shipped error's
    projection on them is far below plain rounding's (measured: ~17x on Q6_K and Q8_0 at h = 1024,
    rank 20), while its plain size grows by less than 2x."""
    h = 1024
    raw0, target = _edited(qtype, 8, h, 1e-3, seed=3)
    metric, V = _metric(h, 20, 1e3, seed=4)
    ship = fb.ship_rows(target, qtype, metric, {"orig": raw0})
    plain = quant.dequantize(quant.quantize(target.astype(np.float32), qtype), qtype, h) - target
    e = ship.values - target
    assert np.linalg.norm(e @ V) * 8 < np.linalg.norm(plain @ V)
    assert np.linalg.norm(e) < 2 * np.linalg.norm(plain)


@pytest.mark.parametrize("qtype", gr.GRID_TYPES)
def test_no_edit_keeps_values(qtype):
    """Target = the original rows: on the original grid every candidate but ggml's is exact."""
    raw0, _ = _edited(qtype, 3, 512, 0.0, seed=5)
    w0 = quant.dequantize(raw0, qtype, 512).astype(np.float64)
    metric, _ = _metric(512, 6, 1e3, seed=6)
    ship = fb.ship_rows(w0, qtype, metric, {"orig": raw0})
    assert np.all(ship.objective == 0)
    assert np.array_equal(ship.values, w0.astype(np.float32))


def test_metric_plan_matches_the_dense_inverse():
    """The planned S_qq and S_qj (Woodbury, from the last column down) against inverting the
    principal submatrices of H directly; a factor with more rows than columns is folded."""
    rng = np.random.default_rng(0)
    h = 96
    d, F = rng.uniform(0.5, 2.0, h), rng.standard_normal((20, h)) * 3
    for m in (fb.Metric(d, F), fb.Metric(d, np.concatenate([F, rng.standard_normal((150, h))]))):
        H = m.H
        for q in (0, 1, 50, h - 2):
            S = np.linalg.inv(H[q:, q:])
            assert m.c[q] == pytest.approx(S[0, 0], rel=1e-10)
            pred = -(m.Z[q] @ m.F[:, q + 1:]) / (m.d[q] * m.d[q + 1:])
            np.testing.assert_allclose(pred, S[0, 1:], rtol=0, atol=1e-10 * np.abs(S[0]).max())
    H = rng.standard_normal((h, h))
    H = H @ H.T + np.eye(h)
    np.testing.assert_allclose(fb.Metric.dense(H).H, H, rtol=1e-12, atol=1e-12 * np.abs(H).max())


def test_metric_errors():
    with pytest.raises(QuantError, match="square"):
        fb.Metric.dense(np.ones((2, 3)))
    with pytest.raises(QuantError, match="symmetric"):
        fb.Metric.dense(np.array([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(QuantError, match="positive definite"):
        fb.Metric.dense(np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(QuantError, match="must be > 0"):
        fb.Metric(np.zeros(3), np.ones((1, 3)))
    with pytest.raises(QuantError, match="factor rows"):
        fb.Metric(np.ones(3), np.ones((1, 4)))
    metric, _ = _metric(256, 2, 1.0, 0)
    with pytest.raises(QuantError, match="target"):
        fb.ship_rows(np.zeros((1, 128)), "Q6_K", metric, {})


@SETTINGS
@given(rows=st.integers(1, 9), p=st.integers(1, 70), extra=st.integers(0, 40), block=st.integers(1, 32),
       seed=st.integers(0, 2**16))
def test_times_ft_of_an_upper_factor(rows, p, extra, block, seed, monkeypatch):
    """x @ F.T by row blocks skipping F's zeros below its diagonal: the full product's values
    within float64 rounding (the same sums less exact zero terms, summed in other blocks)."""
    monkeypatch.setattr(fb, "TRI_BLOCK", block)
    rng = np.random.default_rng(seed)
    F = np.triu(rng.standard_normal((p, p + extra)))
    x = rng.standard_normal((rows, p + extra))
    assert fb.upper(F) and fb.upper(F + np.tril(np.ones_like(F), -1)) == (p == 1)
    assert not fb.upper(rng.standard_normal((p + extra + 1, p + extra)))      # taller than wide
    want = x @ F.T
    got = fb.times_ft(x, F, True)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13 * float(np.abs(x).sum(1).max() * np.abs(F).max()))
    assert np.array_equal(fb.times_ft(x, F, False), want)


def test_an_upper_factor_skips_its_zeros(monkeypatch):
    """A factor with more rows than columns is folded to its QR's R (upper): the plan, the
    feedback, the polish and the objective then skip R's zeros. Against the same metric used as a
    general factor: the plan's numbers within 1e-10, the same codes, the same shipped bytes."""
    rng = np.random.default_rng(3)
    h = 768                        # 6 blocks of feedback, 3 of Q6_K
    d = rng.uniform(0.5, 2.0, h)
    F = rng.standard_normal((h + 60, h)) * np.sqrt(30.0 / h)
    monkeypatch.setattr(fb, "TRI_BLOCK", 100)
    tri = fb.Metric(d, F)
    full = fb.Metric(d, F, general=True)
    assert tri.tri and not full.tri and tri.top[0] == fb.BLOCK and full.top[0] == h
    np.testing.assert_array_equal(tri.F, full.F)
    np.testing.assert_allclose(tri.c, full.c, rtol=1e-10)
    np.testing.assert_allclose(tri.Z, full.Z, rtol=0, atol=1e-10 * np.abs(full.Z).max())
    raw0, target = _edited("Q6_K", 4, h, 2e-3, seed=5)
    grid = gr.grid_of(raw0, "Q6_K", h)
    codes = fb.feedback(target, grid, tri)
    assert np.array_equal(codes, fb.feedback(target, grid, full))
    assert np.array_equal(fb.polish(target, grid, tri, codes), fb.polish(target, grid, full, codes))
    err = gr.values(grid, codes).astype(np.float64) - target
    np.testing.assert_allclose(tri.objective(err), full.objective(err), rtol=1e-12)
    assert np.array_equal(fb.ship_rows(target, "Q6_K", tri, {"orig": raw0}).raw,
                          fb.ship_rows(target, "Q6_K", full, {"orig": raw0}).raw)
