"""Streaming full-vocabulary pass vs a whole-matrix float64 reference.

Tolerances: logits come out of a float32 product of length n, so each differs from the float64
value by at most gamma_n |mix|.|W| (u = 2^-24); the LSE, a softmax-weighted mean of logits, moves
by at most the largest such logit error, plus float64 accumulation (negligible) and the float32
exp of each tile term (relative 2u, i.e. <= 2u absolute in the LSE).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from exactedit.solvers.tail.forward.head_ref import logits_ref
from exactedit.solvers.tail.passes.vocab_pass import ArrayRows, lse_finish, lse_init, lse_update, vocab_pass

U32 = 2.0 ** -24


def gamma(k: int) -> float:
    return k * U32 / (1 - k * U32)


@st.composite
def heads(draw):
    T, n, V = draw(st.integers(1, 6)), draw(st.integers(1, 48)), draw(st.integers(1, 400))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = 10.0 ** draw(st.integers(-2, 1))
    mix = (rng.standard_normal((T, n)) * scale).astype(np.float32)
    W = (rng.standard_normal((V, n)) * draw(st.sampled_from([0.1, 1.0, 4.0]))).astype(np.float32)
    if draw(st.booleans()):  # exact ties in the logits: duplicated rows
        W[rng.integers(0, V, size=V // 3)] = W[0]
    return mix, W, draw(st.integers(1, V + 3)), draw(st.integers(0, 7)), draw(st.sampled_from([None, 20.0]))


@settings(max_examples=60, deadline=None)
@given(case=heads())
@example(case=(np.ones((1, 1), np.float32), np.zeros((5, 1), np.float32), 2, 5, None))
def test_vocab_pass_matches_whole_matrix(case):
    mix, W, tile_rows, topk, softcap = case
    V = W.shape[0]
    ref = logits_ref(mix, W, softcap)
    ids = np.array([0, V - 1, V // 2, -1])
    seen = []
    out = vocab_pass(mix, ArrayRows(W), token_sets=ids, topk=topk, tile_rows=tile_rows,
                     softcap=softcap, sink=lambda a, b, t: seen.append((a, b, t.copy())),
                     progress=lambda d, tot: None)
    err = gamma(mix.shape[1]) * (np.abs(mix.astype(np.float64)) @ np.abs(W.astype(np.float64)).T)
    err += 4 * U32 * np.abs(ref)
    # every tile was seen once, in order, and the tiles are the logits
    assert [s[:2] for s in seen] == [(a, min(a + tile_rows, V)) for a in range(0, V, tile_rows)]
    full = np.concatenate([s[2] for s in seen], axis=1)
    assert np.all(np.abs(full - ref) <= err)
    # LSE
    m = ref.max(axis=1)
    lse = m + np.log(np.exp(ref - m[:, None]).sum(axis=1))
    assert np.all(np.abs(out.lse - lse) <= err.max(axis=1) + 4 * U32 * (1 + np.abs(lse)))
    # argmax / max: exactly the float32 logits' first maximum
    np.testing.assert_array_equal(out.argmax, full.argmax(axis=1))
    np.testing.assert_array_equal(out.max_logit, full.max(axis=1))
    # top-k: the k largest float32 logits, by decreasing value
    k = min(topk, V)
    assert out.topk_ids.shape == (mix.shape[0], k)
    expect = -np.sort(-full, axis=1)[:, :k]
    np.testing.assert_array_equal(out.topk_logits, expect)
    np.testing.assert_array_equal(np.take_along_axis(full, out.topk_ids, axis=1), expect)
    # selected logits; id -1 gives nan
    np.testing.assert_array_equal(out.selected[:, :3], full[:, ids[:3]])
    assert np.isnan(out.selected[:, 3]).all()


def test_per_row_token_sets():
    rng = np.random.default_rng(3)
    mix, W = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((50, 5)).astype(np.float32)
    ids = np.array([[7], [-1], [49]])
    out = vocab_pass(mix, ArrayRows(W), token_sets=ids, tile_rows=16)
    full = mix @ W.T
    assert out.selected[0, 0] == full[0, 7] and np.isnan(out.selected[1, 0]) and out.selected[2, 0] == full[2, 49]


def test_lse_accumulator_order_free_and_extreme():
    """Tiles with wildly different maxima (1e3 apart) fold without overflow, in any order;
    the tolerance is the float32 exp of each term (relative 2u, so <= 2u in the LSE)."""
    tiles = [np.array([[0.0, -1.0]], np.float32), np.array([[1000.0, 999.0]], np.float32),
             np.array([[-np.inf, -np.inf]], np.float32)]
    expect = 1000.0 + np.log1p(np.exp(-1.0))
    for order in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
        state = lse_init(1)
        for i in order:
            state = lse_update(state, tiles[i])
        np.testing.assert_allclose(lse_finish(state), [expect], rtol=0, atol=2 * U32)


def test_progress_reaches_total_and_memory_is_per_tile():
    """The source is only ever asked for tiles of at most tile_rows rows."""
    W = np.arange(40.0, dtype=np.float32).reshape(20, 2)

    class Spy(ArrayRows):
        asked = []

        def read(self, a, b):
            self.asked.append(b - a)
            return super().read(a, b)

    calls = []
    vocab_pass(np.ones((1, 2), np.float32), Spy(W), tile_rows=6, progress=lambda d, t: calls.append((d, t)))
    assert max(Spy.asked) <= 6 and sum(Spy.asked) == 20
    assert calls[-1] == (20, 20)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="mix must be"):
        vocab_pass(np.ones((2, 3)), ArrayRows(np.ones((4, 2))))
    with pytest.raises(ValueError, match="token_sets"):
        vocab_pass(np.ones((2, 2)), ArrayRows(np.ones((4, 2))), token_sets=np.zeros((3, 1)))
