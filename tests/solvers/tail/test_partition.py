"""The partition identity: LSE' from LSE_rest and the edited logits of S equals a full recompute."""
from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings, strategies as st

from exactedit.solvers.tail.forward.head_ref import logits_ref
from exactedit.solvers.tail.partition import edited_logits, logsumexp_rows, lse_edited, lse_rest
from exactedit.solvers.tail.passes.vocab_pass import ArrayRows, vocab_pass


def full_lse(logits):
    return logsumexp_rows(logits)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(1, 5), n=st.integers(1, 32),
       V=st.integers(2, 300), s_frac=st.floats(0.0, 1.0), scale=st.sampled_from([0.1, 1.0, 3.0]))
@example(seed=1, T=4, n=13, V=2, s_frac=0.0, scale=3.0)  # S holds ~all the mass, then loses it
@example(seed=3, T=3, n=22, V=22, s_frac=0.75, scale=3.0)  # the rest rounds to 0, then matters
def test_partition_identity_equals_full_recompute(seed, T, n, V, s_frac, scale):
    rng = np.random.default_rng(seed)
    mix, W = rng.standard_normal((T, n)), rng.standard_normal((V, n)) * scale
    S = rng.choice(V, size=max(1, int(s_frac * V)), replace=False)
    dW = rng.standard_normal((S.size, n)) * scale
    base = logits_ref(mix, W)
    rest = lse_rest(full_lse(base), base[:, S])
    W2 = W.copy()
    W2[S] += dW
    got = lse_edited(rest, edited_logits(base[:, S], mix, dW))
    want = full_lse(logits_ref(mix, W2))
    # float64 throughout. LSE_rest comes from 1 - p_S = -expm1(LSE_S - LSE): the rounding of
    # LSE_S - LSE (u64 times their size) is an absolute error of the rest mass in units of
    # exp(LSE) (also when it rounds the rest to 0: then the true rest is below it), which moves
    # exp(LSE') by that much, i.e. LSE' by gap_err * exp(LSE - LSE').
    lse0 = full_lse(base)
    gap_err = 8 * 2.0**-53 * (np.abs(lse0) + np.abs(logsumexp_rows(base[:, S])) + 1)
    tol = gap_err * np.exp(lse0 - want) + 1e-13 * (1 + np.abs(want))
    assert np.all(np.abs(got - want) <= tol), (got - want, tol)


def test_rest_is_exact_without_s():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 30)) * 5
    S = np.array([3, 17, 29])
    keep = np.setdiff1d(np.arange(30), S)
    np.testing.assert_allclose(lse_rest(full_lse(logits), logits[:, S]), full_lse(logits[:, keep]),
                               rtol=1e-13)


def test_s_with_all_the_mass_gives_minus_inf_rest():
    logits = np.array([[0.0, -2000.0, -2000.0]])
    rest = lse_rest(full_lse(logits), logits[:, [0]])
    assert rest[0] < -1999 or rest[0] == -np.inf
    assert lse_edited(lse_rest(full_lse(logits), logits), logits)[0] == 0.0


def test_with_streaming_pass():
    """LSE from the streaming pass (float32 logits) and `selected` feed the identity directly."""
    rng = np.random.default_rng(5)
    mix, W = rng.standard_normal((3, 16)).astype(np.float32), rng.standard_normal((200, 16)).astype(np.float32)
    S = np.array([5, 50, 150])
    vp = vocab_pass(mix, ArrayRows(W), token_sets=S, tile_rows=64)
    dW = np.zeros((3, 16))
    again = lse_edited(lse_rest(vp.lse, vp.selected), edited_logits(vp.selected, mix, dW))
    np.testing.assert_allclose(again, vp.lse, rtol=1e-12)


def test_streaming_rest_is_exact_where_subtraction_is_not():
    """When S holds nearly all the mass (p_rest ~ e^-30), `lse_rest(lse, l_S)` has lost most
    digits to 1 - p_S, while the pass's own `exclude` accumulator keeps them."""
    rng = np.random.default_rng(9)
    W = rng.standard_normal((300, 8)).astype(np.float32)
    mix = np.ones((1, 8), np.float32)
    W[7] = 10.0  # logit 80 against others of size ~3: p_rest ~ e^-75
    S = np.array([7])
    vp = vocab_pass(mix, ArrayRows(W), token_sets=S, exclude=S, tile_rows=64)
    full = (mix @ W.T).astype(np.float64)
    keep = np.setdiff1d(np.arange(300), S)
    want = full_lse(full[:, keep])
    np.testing.assert_allclose(vp.lse_rest, want, rtol=0, atol=float(4 * 2.0**-24 * np.abs(want).max() + 1e-6))
    subtracted = lse_rest(vp.lse, vp.selected)
    assert not np.isfinite(subtracted[0]) or abs(subtracted[0] - want[0]) > 1.0
