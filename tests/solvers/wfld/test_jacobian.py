"""u_tv (the linearized logit of token v at row t in the edit dW of the layer-47 tensor) against
central finite differences in float64, and the JAX float32 fast path against the float64
analytic reference. One table drives both.

Tolerances: the reference vs finite differences is float64 all the way; with step eps the
central difference's truncation error is O(eps^2 * |l'''|), so 1e-6 relative to the largest |u.z|.
JAX runs in float32: its VJP differs from the float64 one by a few float32 roundings per
product of length 4n (n <= 64 here), so 2e-4 relative to the largest |u|.
"""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.solvers.tail.head_ref import Hc4Head, RmsnormHead
from exactedit.solvers.tail.vocab_pass import ArrayRows
from exactedit.solvers.wfld.config import WfldError
from exactedit.solvers.tail.last_layer_ref import Hc4L47, RmsnormL47
from exactedit.solvers.wfld.jacobian import RowSet, editable_weight, linearize, with_weights
from exactedit.solvers.tail.model import Hc4Tail, RmsnormTail


def hc4_case(seed, T=5, n=48, h=12, d_lo=8, V=30):
    rng = np.random.default_rng(seed)
    head = Hc4Head(1 + 0.2 * rng.standard_normal((4, n)), 0.1 * rng.standard_normal((d_lo, 4 * n)),
                   0.3 * rng.standard_normal((4 * n, d_lo)))
    tail = Hc4Tail(None, "mem", Hc4L47(0.1 * rng.standard_normal((n, h)).astype(np.float32)), head,
                   ArrayRows(rng.standard_normal((V, n))), None)
    rs = RowSet(rng.standard_normal((T, 4, n)).astype(np.float32), rng.standard_normal((T, h)).astype(np.float32),
                (2 * rng.standard_normal((T, 4))).astype(np.float32), rng.standard_normal(T).astype(np.float32),
                rng.standard_normal((T, n)).astype(np.float32))
    return tail, rs


def rms_case(seed, softcap=None, post=False, T=5, n=40, h=10, V=30):
    rng = np.random.default_rng(seed)
    tail = RmsnormTail(None, "mem", RmsnormL47(0.1 * rng.standard_normal((n, h)).astype(np.float32),
                                               np.ones(n) if post else None),
                       RmsnormHead(1 + 0.1 * rng.standard_normal(n), 1e-6, softcap),
                       ArrayRows(rng.standard_normal((V, n))), None)
    rs = RowSet(rng.standard_normal((T, n)).astype(np.float32), rng.standard_normal((T, h)).astype(np.float32))
    return tail, rs


CASES = [
    # (name, builder, backend, tolerance vs finite differences)
    ("hc4 numpy", lambda s: hc4_case(s), "numpy", 1e-6),
    ("hc4 jax", lambda s: hc4_case(s), "jax", 2e-4),
    ("rmsnorm numpy", lambda s: rms_case(s), "numpy", 1e-6),
    ("rmsnorm jax", lambda s: rms_case(s), "jax", 2e-4),
    ("rmsnorm softcap numpy", lambda s: rms_case(s, softcap=3.0), "numpy", 1e-6),
    ("rmsnorm softcap jax", lambda s: rms_case(s, softcap=3.0), "jax", 2e-4),
]


def _tokens(rng, T, V):
    tok = rng.integers(0, V, size=(T, 3))
    tok[0, 2] = -1
    return tok


@pytest.mark.parametrize("name,build,backend,tol", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_u_against_finite_differences(name, build, backend, tol, seed):
    tail, rs = build(seed)
    rng = np.random.default_rng(100 + seed)
    tok = _tokens(rng, rs.rows, tail.head.rows)
    lin = linearize(tail, rs, tok, backend=backend)
    w = editable_weight(tail).astype(np.float64)
    E = rng.standard_normal(w.shape)
    eps = 1e-4 * np.linalg.norm(w) / np.linalg.norm(E)

    def logits(sign):
        return linearize(with_weights(tail, w + sign * eps * E), rs, tok, backend="numpy").logits

    # with_weights stores float32 weights: difference the stored values, not the requested ones
    w_plus = np.float32(w + eps * E).astype(np.float64)
    w_minus = np.float32(w - eps * E).astype(np.float64)
    fd = (logits(+1) - logits(-1))
    z = (w_plus - w_minus) @ np.asarray(rs.hh, dtype=np.float64).T            # [n, T]
    pred = np.einsum("tmn,nt->tm", lin.u, z)
    ok = tok >= 0
    scale = np.max(np.abs(pred[ok]))
    assert np.all(np.isnan(lin.logits[~ok])) and np.all(lin.u[~ok] == 0)
    np.testing.assert_allclose(fd[ok], pred[ok], rtol=0, atol=tol * scale + 1e-9)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("build", [hc4_case, rms_case], ids=["hc4", "rmsnorm"])
def test_jax_matches_reference(build, seed):
    tail, rs = build(seed)
    tok = _tokens(np.random.default_rng(seed), rs.rows, tail.head.rows)
    ref = linearize(tail, rs, tok, backend="numpy")
    fast = linearize(tail, rs, tok, backend="jax")
    ok = tok >= 0
    np.testing.assert_allclose(fast.u, ref.u, rtol=0, atol=2e-4 * np.abs(ref.u).max())
    np.testing.assert_allclose(fast.logits[ok], ref.logits[ok], rtol=0, atol=1e-4 * np.abs(ref.logits[ok]).max())


@pytest.mark.parametrize("build", [hc4_case, rms_case], ids=["hc4", "rmsnorm"])
def test_many_tokens_per_row(build):
    """A full 64-row chunk with 17 tokens per row (and a 6-row rest): the batched pull of every
    cotangent at once (jax.vmap) came out wrong by up to 0.2 on XLA:CPU at these shapes."""
    tail, rs = build(0, T=70)
    tok = np.random.default_rng(5).integers(0, tail.head.rows, size=(rs.rows, 17))
    ref = linearize(tail, rs, tok, backend="numpy")
    fast = linearize(tail, rs, tok, backend="jax")
    np.testing.assert_allclose(fast.u, ref.u, rtol=0, atol=2e-4 * np.abs(ref.u).max())


def test_post_ffn_norm_is_refused():
    tail, rs = rms_case(0, post=True)
    with pytest.raises(WfldError, match="post-FFN norm"):
        linearize(tail, rs, np.zeros((rs.rows, 1), np.int64))
