"""The KL pass, three implementations against one float64 truth: one table, tolerance and reason per row.

Each implementation gets the same base and edited activations over the same head; the truth is the
float64 KL of the float64 logits. Edits range from none (KL exactly 0) to tens of nats (the expm1
and series branches, the big-term folds).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from exactedit.bench.head import synthetic_q6k
from exactedit.solvers.tail.forward import device as devmod
from exactedit.solvers.tail.forward.head_ref import apply_softcap, logits_ref
from exactedit.solvers.tail.passes.kl_pass import kl_rows
from exactedit.solvers.tail.passes.kl_pass_jax import kl_pass_jax
from exactedit.solvers.tail.passes.kl_pass_numba import kl_rows_numba
from exactedit.solvers.tail.passes.device_pass import to_device
from exactedit.solvers.tail.passes.vocab_pass import ArrayRows, QuantRows

DEVICE = devmod.select(os.environ.get("EXACTEDIT_TEST_DEVICE", "cpu"))
U = 2.0 ** -24


def _gamma(k: int) -> float:
    return k * U / (1 - k * U)


def _reference(mb, me, src, nxt, softcap, tile):
    return kl_rows(mb, src, me, src, next_ids=nxt, softcap=softcap, tile_rows=tile)


def _numba(mb, me, src, nxt, softcap, tile):
    return kl_rows_numba(mb, me, src, next_ids=nxt, softcap=softcap, tile_rows=tile)


def _jax(mb, me, src, nxt, softcap, tile):
    return kl_pass_jax(mb, me, to_device(src, DEVICE), next_ids=nxt, softcap=softcap, tile_rows=tile)


# (name, implementation, relative KL slack beyond the float32-logit bound, unedited row exactly 0
#  with a softcap, reason)
IMPLS = [
    ("reference", _reference, 1e-5, True, "numpy: float32 logits and exp tiles, float64 folds"),
    ("numba", _numba, 1e-5, True, "two sgemms of one shape per tile, exp and fold in float64 per element"),
    ("jax", _jax, 1e-5, False, "device logits (HIGHEST fp32) and tile partials in float32, host fold in "
     "float64; XLA may fuse the two sides' softcap differently, so an unedited row is ~1e-16, not 0"),
]


def _case(head: str, seed: int):
    rng = np.random.default_rng(seed)
    V, n, T = 1000, 256, 9
    if head == "Q6_K":
        raw = synthetic_q6k(V, n, seed)
        src = QuantRows(lambda a, b: raw[a:b], "Q6_K", V, n)
        W = src.read(0, V).astype(np.float64)
    else:
        W32 = (rng.standard_normal((V, n)) * 0.05).astype(np.float32)
        src, W = ArrayRows(W32), W32.astype(np.float64)
    mb = rng.standard_normal((T, n)).astype(np.float32)
    scales = np.array([0, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1, 3, 10], np.float32)[:, None]
    me = (mb + rng.standard_normal((T, n)).astype(np.float32) * scales).astype(np.float32)
    nxt = rng.integers(-1, V, T)
    return src, W, mb, me, nxt


def _lse(x):
    m = x.max(axis=1)
    return m + np.log(np.exp(x - m[:, None]).sum(axis=1))


@pytest.mark.parametrize("name,impl,rel,zero_capped,reason", IMPLS, ids=[i[0] for i in IMPLS])
@pytest.mark.parametrize("head,softcap,tile", [("Q6_K", None, 300), ("F32", None, 64), ("F32", 5.0, 1000)])
def test_kl_pass_table(name, impl, rel, zero_capped, reason, head, softcap, tile):
    """Tolerance: each side's float32 logits err by at most gamma_n |mix|.|W| (n = 256), which moves
    KL and the LSEs by at most twice the sum of both sides' bounds; plus `rel` of KL for the float32
    parts of each implementation's sums (the reason column). Argmaxes are exact (ties do not occur
    in these draws); a row without an edit gives KL exactly 0."""
    src, W, mb, me, nxt = _case(head, seed=5)
    got = impl(mb, me, src, nxt, softcap, tile)
    lb, le = logits_ref(mb, W), logits_ref(me, W)
    if softcap is not None:
        lb, le = apply_softcap(lb, softcap), apply_softcap(le, softcap)
    lp, lq = lb - _lse(lb)[:, None], le - _lse(le)[:, None]
    kl = np.sum(np.exp(lp) * (lp - lq), axis=1)
    err = _gamma(256) * (np.abs(np.r_[mb, me].astype(np.float64)) @ np.abs(W).T).max(axis=1)
    bound = 2 * (err[:9] + err[9:]) + rel * kl
    if softcap is None or zero_capped:
        assert got.kl[0] == 0.0, reason
    assert np.all(np.abs(got.kl - kl) <= bound), (name, got.kl, kl)
    np.testing.assert_array_equal(got.argmax_base, np.argmax(lb, axis=1))
    np.testing.assert_array_equal(got.argmax_edited, np.argmax(le, axis=1))
    for a, b in ((got.lse_base, _lse(lb)), (got.lse_edited, _lse(le))):
        assert np.all(np.abs(a - b) <= bound + 1e-5)
    known = nxt >= 0
    assert np.all(np.isnan(got.logp_next_base[~known])) and np.all(np.isnan(got.logp_next_edited[~known]))
    np.testing.assert_allclose(got.logp_next_base[known], lp[known, nxt[known]], atol=1e-4)
    np.testing.assert_allclose(got.logp_next_edited[known], lq[known, nxt[known]], atol=1e-4)


def test_kl_pass_jax_rejects_mismatched_rows():
    src, _, mb, me, _ = _case("F32", seed=1)
    with pytest.raises(ValueError, match="must both be"):
        kl_pass_jax(mb, me[:3], to_device(src, DEVICE))


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_the_rank_one_pass_is_the_kl_of_the_moved_residual(softcap):
    """kl_rows_rank1 against the float64 KL of the logits recomputed from each moved residual:
    y_c = y + h_c col_c through the final norm (a = s_c / s, b = s_c h_c, the direction w * col_c).
    Tolerance: float32 logits of magnitude <= 10 (rounding 1e-6) give KLs within 1e-9 + 1e-4 rel."""
    from exactedit.solvers.tail.passes.kl_pass_numba import kl_rows_rank1

    rng = np.random.default_rng(4)
    T, n, V, C = 9, 24, 200, 3
    H = rng.standard_normal((V, n))
    w = 1 + 0.1 * rng.standard_normal(n)
    y = rng.standard_normal((T, n))
    cols = rng.standard_normal((n, C)) * 0.3
    h = rng.standard_normal((T, C))
    norm = lambda x: 1.0 / np.sqrt(np.mean(x * x, axis=1) + 1e-6)  # noqa: E731
    s = norm(y)
    a, b = np.zeros((T, C)), np.zeros((T, C))
    want = np.zeros((T, C))
    zb = apply_softcap((y * s[:, None] * w) @ H.T, softcap)
    lpb = zb - np.logaddexp.reduce(zb, axis=1, keepdims=True)
    for c in range(C):
        ye = y + h[:, c:c + 1] * cols[:, c]
        se = norm(ye)
        a[:, c], b[:, c] = se / s, se * h[:, c]
        ze = apply_softcap((ye * se[:, None] * w) @ H.T, softcap)
        lpe = ze - np.logaddexp.reduce(ze, axis=1, keepdims=True)
        want[:, c] = np.sum(np.exp(lpb) * (lpb - lpe), axis=1)
    got = kl_rows_rank1((y * s[:, None] * w).astype(np.float32), ArrayRows(H), a, b, w[:, None] * cols,
                        softcap=softcap, tile_rows=64)
    assert want.max() > 0.1                   # edits that move the distribution, not only its rounding
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-9)
