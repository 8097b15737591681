"""The gated unit's down column (solvers/l47/gated/column.py, down.py): the objective's exact
gradient by finite differences (hypothesis), the target distribution's construction, the support's
logits against a full float64 head, the solve (the phrase's token lowered by the asked amount, the
rest of the distribution kept, the bound held, a token rising outside the support taken in), and
the column shipped as codes within the tensor's own block scales (every other byte kept)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactedit import quant
from exactedit.solvers.l47.gated.column import (ColumnConfig, column_loss, column_problem, solve_column,
                                                target_distribution)
from exactedit.solvers.l47.gated.down import bound_of, context_rejected, set_column, zero_column


class _Head:
    def __init__(self, w):
        self.w = np.asarray(w, np.float32)
        self.rows, self.cols = self.w.shape

    def read(self, start, stop):
        return self.w[start:stop]


def _tail(seed, V=60, n=12, softcap=None, post=False):
    rng = np.random.default_rng(seed)
    l47 = SimpleNamespace(w_post=rng.uniform(0.5, 3.0, n) if post else None, eps=1e-6)
    return SimpleNamespace(mix_params=SimpleNamespace(w_norm=rng.uniform(0.5, 1.5, n), eps=1e-6),
                           head=_Head(rng.normal(size=(V, n))), softcap=softcap, l47=l47)


def _f0(seed, T=5, n=12):
    return np.random.default_rng(seed + 9).normal(size=(T, n)) * 0.5


def _contexts(seed, T=5, n=12):
    rng = np.random.default_rng(seed + 1)
    y0 = rng.normal(size=(T, n)) * 3
    a = rng.uniform(5, 20, T)
    return y0, a


def _full_logp(tail, y0, a, d, f0=None):
    mp = tail.mix_params
    write = np.asarray(a)[:, None] * np.asarray(d)[None, :]
    if f0 is None:
        y = np.asarray(y0, np.float64) + write
    else:                                       # R + w_post * rmsnorm(f0 + a d), written out
        f = f0 + write
        y = y0 + f / np.sqrt(np.mean(f * f, axis=1, keepdims=True) + tail.l47.eps) * tail.l47.w_post
    m = y / np.sqrt(np.mean(y * y, axis=1, keepdims=True) + mp.eps) * mp.w_norm
    z = m @ tail.head.w.astype(np.float64).T
    if tail.softcap is not None:
        z = tail.softcap * np.tanh(z / tail.softcap)
    return z - np.logaddexp.reduce(z, axis=1, keepdims=True)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([None, 5.0]), st.floats(0.0, 1e-1), st.floats(0.1, 3.0),
       st.booleans())
def test_gradient_by_finite_differences(seed, softcap, ridge, strength, post):
    tail = _tail(seed, softcap=softcap, post=post)
    y0, a = _contexts(seed)
    rej = [[3], [3, 7], [7], [3], [11]]
    p = column_problem(tail, y0, a, rej, [0], top=20, tile_rows=16, f0=_f0(seed) if post else None)
    q = target_distribution(p.z0, p.rej, p.spec, p.tok >= 0, strength, 1.0)
    rng = np.random.default_rng(seed + 2)
    d = rng.normal(size=12) * 0.05
    f, g = column_loss(p, q, d, ridge)
    v = rng.normal(size=12)
    h = 1e-6
    fd = (column_loss(p, q, d + h * v, ridge)[0] - column_loss(p, q, d - h * v, ridge)[0]) / (2 * h)
    assert fd == pytest.approx(float(g @ v), rel=1e-5, abs=1e-8)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([None, 5.0]), st.floats(0.0, 1e-1), st.floats(0.1, 3.0),
       st.floats(-3, 0))
def test_the_fast_path_is_the_reference(seed, softcap, ridge, strength, log_scale):
    """Without a post-FFN norm the loss and gradient through the supports' union (no Hs) equal the
    reference through Hs [T, K, n]: the same float64 math reassociated, 1e-9 relative."""
    tail = _tail(seed, softcap=softcap)
    y0, a = _contexts(seed)
    rej = [[3], [3, 7], [7], [3], [11]]
    p = column_problem(tail, y0, a, rej, [0], top=20, tile_rows=16, reference=True)
    assert p.HU is not None and p.Hs is not None
    q = target_distribution(p.z0, p.rej, p.spec, p.tok >= 0, strength, 1.0)
    d = np.random.default_rng(seed + 3).normal(size=12) * 10.0 ** log_scale
    f, g = column_loss(p, q, d, ridge)
    fr, gr = column_loss(p, q, d, ridge, reference=True)
    assert f == pytest.approx(fr, rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(g, gr, rtol=1e-7, atol=1e-9 * np.abs(gr).max())
    lean = column_problem(tail, y0, a, rej, [0], top=20, tile_rows=16)
    assert lean.Hs is None and np.array_equal(lean.tok, p.tok)
    np.testing.assert_allclose(lean.z0, p.z0, rtol=1e-12)


@pytest.mark.parametrize("post", [False, True])
def test_the_support_logits_are_the_heads(post):
    tail = _tail(3, post=post)
    y0, a = _contexts(3)
    f0 = _f0(3) if post else None
    p = column_problem(tail, y0, a, [[3]] * 5, [0, 1], top=10, tile_rows=7, f0=f0)
    full = _full_logp(tail, y0, a, np.zeros(12), f0)
    z = full + 0.0                                  # logits up to each row's constant
    for r in range(5):
        toks = p.tok[r][p.tok[r] >= 0]
        top = np.argsort(-full[r])[:10]
        assert set(top.tolist()) | {3, 0, 1} == set(toks.tolist())
        diff = p.z0[r, :toks.size] - z[r, toks]
        np.testing.assert_allclose(diff, diff[0], atol=1e-5)    # float32 head: 1e-5 on logits of ~10
        assert p.rej[r, :toks.size].tolist() == (toks == 3).tolist()
        assert p.spec[r, :toks.size].tolist() == np.isin(toks, [0, 1]).tolist()


@given(st.integers(0, 2**31), st.floats(0.0, 4.0), st.floats(0.0, 2.0))
@settings(max_examples=40, deadline=None)
def test_target_distribution(seed, strength, margin):
    rng = np.random.default_rng(seed)
    z0 = rng.normal(size=(4, 9)) * 3
    valid = np.ones_like(z0, bool)
    valid[:, -1] = False
    rej = np.zeros_like(valid)
    rej[:, 2] = True
    spec = np.zeros_like(valid)
    spec[:, 0] = True
    q = target_distribution(z0, rej, spec, valid, strength, margin)
    p0 = np.where(valid, np.exp(z0 - np.logaddexp.reduce(np.where(valid, z0, -np.inf), axis=1, keepdims=True)), 0)
    np.testing.assert_allclose(q.sum(axis=1), 1.0, rtol=1e-12)
    assert np.all(q[:, -1] == 0)
    np.testing.assert_allclose(q[:, 0], p0[:, 0], rtol=1e-10)                 # the specials stay
    other = valid & ~rej & ~spec
    gap = z0[:, 2] - np.max(np.where(other, z0, -np.inf), axis=1)
    delta = strength * np.maximum(gap + margin, margin)
    np.testing.assert_allclose(q[:, 2], p0[:, 2] * np.exp(-delta), rtol=1e-9, atol=1e-300)
    ratio = np.where(other & (p0 > 0), q / np.where(p0 > 0, p0, 1.0), np.nan)                                  # the rest in proportion
    np.testing.assert_allclose(np.nanmax(ratio, axis=1), np.nanmin(ratio, axis=1), rtol=1e-10)


@pytest.mark.parametrize("post", [False, True])
def test_the_solve_lowers_the_phrase_and_keeps_the_rest(post):
    tail = _tail(7, V=80, n=48, post=post)        # n = 12 is too few directions for one column to
    y0, a = _contexts(7, T=6, n=48)               # lower one word at 6 contexts and keep the rest
    f0 = _f0(7, T=6, n=48) * 4 if post else None  # Gemma-like: the FFN output of the residual's size
    full0 = _full_logp(tail, y0, a, np.zeros(48), f0)
    w = int(np.argsort(-full0[0])[1])             # the phrase's word: second at the first context
    rej = [[w]] * 6
    cfg = ColumnConfig(top=16, support_floor=1e-4, rounds=4, maxiter=2000)
    sol = solve_column(tail, y0, a, rej, [0], 1.0, cfg, f0=f0)
    full = _full_logp(tail, y0, a, sol.d, f0)
    drop = full0[:, w] - full[:, w]
    assert np.all(drop > 0.9), drop                # at least `margin` (1 nat) at every context, nearly
    assert sol.others_kl < 0.05, sol
    # the rest of the distribution: the other tokens' ranking at the first context is kept
    others = [t for t in np.argsort(-full0[0])[:6] if t != w]
    assert [t for t in np.argsort(-full[0]) if t in others][:len(others)] == others
    bound = np.full(48, 1e-3)                     # a bound that holds the column: it is held
    tight = solve_column(tail, y0, a, rej, [0], 1.0, cfg, bound=bound, f0=f0)
    assert np.all(np.abs(tight.d) <= bound + 1e-15)


def test_f0_is_required_exactly_with_a_post_norm():
    from exactedit.solvers.l47.gated import GatedError

    y0, a = _contexts(1)
    with pytest.raises(GatedError, match="f0"):
        column_problem(_tail(1, post=True), y0, a, [[3]] * 5, [0], top=5)
    with pytest.raises(GatedError, match="f0"):
        column_problem(_tail(1), y0, a, [[3]] * 5, [0], top=5, f0=_f0(1))


def test_a_token_rising_outside_the_support_is_taken_in():
    """With a support of 2 tokens per row, the solve's column raises tokens it never saw; the
    full-vocabulary check adds them and the solve repeats."""
    tail = _tail(11, V=50)
    y0, a = _contexts(11, T=4)
    full0 = _full_logp(tail, y0, a, np.zeros(12))
    w = int(np.argmax(full0[0]))
    sol = solve_column(tail, y0, a, [[w]] * 4, [], 2.0, ColumnConfig(top=2, support_floor=1e-3, rounds=5))
    assert sol.added > 0 and sol.support > 3


def test_context_rejected_per_row():
    tokens = np.array([5, 1, 2, 9, 1, 2, 1, 4])
    doc = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    got = context_rejected(tokens, doc, [(1, 2, 7), (1, 2, 8), (2, 9), (4, 1, 2, 7)])
    assert got[2] == [7, 8, 9] and got[5] == [7, 8, 9]   # "1 2" (and "2") within each document
    assert [got[r] for r in (0, 1, 3, 4, 6, 7)] == [[]] * 6
    doc2 = np.array([0, 0, 1, 1, 1, 1, 1, 1])         # "1 | 2" across documents: no context
    assert context_rejected(tokens, doc2, [(1, 2, 7)])[2] == []


@pytest.mark.parametrize("qtype", ["Q6_K", "Q8_0", "Q4_1"])
def test_the_column_ships_within_the_block_scales(qtype):
    """Symmetric grids and Q4_1's affine one (SmolLM2's ffn_down): a column within the bound ships
    within half a step of what was asked, every other byte kept, the removal at the nearest-to-zero
    code (exactly 0 on the symmetric grids, within half a step on Q4_1's, whose blocks of normal
    weights hold 0 within their range)."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(6, 512)).astype(np.float32) * 0.05
    raw = quant.quantize(w, qtype)
    j = 37
    bound = bound_of(raw, qtype, 512, j)
    assert np.all(bound > 0)
    want = rng.uniform(-1, 1, 6) * bound
    out = set_column(raw, qtype, 512, j, want)
    v0, v1 = quant.dequantize(raw, qtype, 512), quant.dequantize(out, qtype, 512)
    keep = np.ones(512, bool)
    keep[j] = False
    assert np.array_equal(v0[:, keep], v1[:, keep])             # every other value kept
    from exactedit.quant.rounding.grid import grid_of

    step = grid_of(raw, qtype, 512).steps[:, j]
    assert np.all(np.abs(v1[:, j] - want) <= np.abs(step) / 2 + 1e-9)   # half a step: never clamped
    from exactedit.solvers.l47.gated.down import _one_column, _shipped

    # what the strength frontier scores without packing: bit for bit the column the bytes load as
    assert np.array_equal(_shipped(_one_column(grid_of(raw, qtype, 512), j), want), v1[:, j].astype(np.float64))
    z = zero_column(raw, qtype, 512, j)
    zj = quant.dequantize(z, qtype, 512)[:, j]
    if qtype == "Q4_1":
        assert np.all(np.abs(zj) <= np.abs(step) / 2 + 1e-9) and np.any(zj != 0)
    else:
        assert np.all(zj == 0)
    assert np.array_equal(quant.dequantize(z, qtype, 512)[:, keep], v0[:, keep])


def test_an_affine_block_whose_range_misses_zero_bounds_the_column_at_zero():
    """A Q4_1 block of values all above 0: no symmetric interval around 0 ships unclamped (bound
    0), and the removal ships the block's least value."""
    w = np.full((2, 64), 0.01, np.float32)
    w[0, :32] = np.linspace(0.2, 0.5, 32)          # row 0's first block: 0.2 .. 0.5
    w[1] = np.random.default_rng(3).normal(size=64) * 0.05
    raw = quant.quantize(w, "Q4_1")
    b = bound_of(raw, "Q4_1", 64, 5)
    assert b[0] == 0.0 and b[1] > 0
    z = quant.dequantize(zero_column(raw, "Q4_1", 64, 5), "Q4_1", 64)[:, 5]
    assert z[0] == quant.dequantize(raw, "Q4_1", 64)[0, :32].min()


@given(st.integers(0, 2**31), st.floats(0.0, 4.0), st.floats(0.0, 2.0))
@settings(max_examples=40, deadline=None)
def test_target_distribution_raising_a_style(seed, strength, margin):
    """lower=False: the style's tokens raised by strength * max(margin - gap, margin) in logit,
    the specials kept, every other non-special token scaled alike."""
    rng = np.random.default_rng(seed)
    z0 = rng.normal(size=(4, 9)) * 3
    valid = np.ones_like(z0, bool)
    valid[:, -1] = False
    rej = np.zeros_like(valid)
    rej[:, [2, 5]] = True
    spec = np.zeros_like(valid)
    spec[:, 0] = True
    q = target_distribution(z0, rej, spec, valid, strength, margin, lower=False)
    p0 = np.where(valid, np.exp(z0 - np.logaddexp.reduce(np.where(valid, z0, -np.inf), axis=1, keepdims=True)), 0)
    np.testing.assert_allclose(q.sum(axis=1), 1.0, rtol=1e-12)
    assert np.all(q[:, -1] == 0)
    np.testing.assert_allclose(q[:, 0], p0[:, 0], rtol=1e-10)                 # the specials stay
    other = valid & ~rej & ~spec
    gap = np.max(np.where(rej, z0, -np.inf), axis=1) - np.max(np.where(other, z0, -np.inf), axis=1)
    delta = strength * np.maximum(margin - gap, margin)
    lr = np.log(q[:, 2] / q[:, 1]) - np.log(p0[:, 2] / p0[:, 1])               # a style token against another
    np.testing.assert_allclose(lr, delta, rtol=1e-9, atol=1e-9)
    ratio = np.where(other & (p0 > 0), q / np.where(p0 > 0, p0, 1.0), np.nan)
    np.testing.assert_allclose(np.nanmax(ratio, axis=1), np.nanmin(ratio, axis=1), rtol=1e-10)
    if strength == 1.0:
        best_other = np.max(np.where(other, np.log(np.maximum(q, 1e-300)), -np.inf), axis=1)
        best_rej = np.max(np.where(rej, np.log(np.maximum(q, 1e-300)), -np.inf), axis=1)
        np.testing.assert_allclose(best_rej - best_other, np.maximum(gap + margin, margin), rtol=1e-9, atol=1e-9)
