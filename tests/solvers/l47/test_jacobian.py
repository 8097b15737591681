"""u_tv (the linearized logit of token v at row t in the edit dW of the layer-47 tensor) against
central finite differences in float64, and the JAX float32 fast path against the float64
analytic reference. One table drives both; the post-FFN norm (Gemma style) is in it, and a
hypothesis test draws post-norm tails over magnitudes (activations, post-norm weights, residuals,
eps) against finite differences of the exact float64 forward.

Tolerances: the reference vs finite differences is float64 all the way; with step eps the
central difference's truncation error is O(eps^2 * |l'''|), so 1e-6 relative to the largest |u.z|.
JAX runs in float32: its VJP differs from the float64 one by a few float32 roundings per
product of length 4n (n <= 64 here), so 2e-4 relative to the largest |u|.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from exactedit.solvers.tail.forward.head_ref import Hc4Head, RmsnormHead
from exactedit.solvers.tail.passes.vocab_pass import ArrayRows
from exactedit.solvers.tail.forward.last_layer_ref import Hc4L47, RmsnormL47
from exactedit.solvers.l47.jacobian import (RowSet, editable_weight, linearize, post_norm_vjp_jax, post_norm_vjp_ref,
    with_weights)
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


def rms_case(seed, softcap=None, post=False, T=5, n=40, h=10, V=30, w_scale=0.1, post_scale=1.0, r_scale=1.0,
             eps=1e-6):
    """A random rmsnorm tail; with `post`, a post-FFN norm whose weights are post_scale * (1 + N(0, 0.5))
    (signs mixed, as Gemma's are): R' = R + rmsnorm(W hh, eps) * w_post."""
    rng = np.random.default_rng(seed)
    w_down = (w_scale * rng.standard_normal((n, h))).astype(np.float32)
    w_post = (post_scale * (1 + 0.5 * rng.standard_normal(n))).astype(np.float32) if post else None
    tail = RmsnormTail(None, "mem", RmsnormL47(w_down, w_post, eps),
                       RmsnormHead(1 + 0.1 * rng.standard_normal(n), 1e-6, softcap),
                       ArrayRows(rng.standard_normal((V, n))), None)
    rs = RowSet((r_scale * rng.standard_normal((T, n))).astype(np.float32),
                rng.standard_normal((T, h)).astype(np.float32))
    return tail, rs


CASES = [
    # (name, builder, backend, tolerance vs finite differences)
    ("hc4 numpy", lambda s: hc4_case(s), "numpy", 1e-6),
    ("hc4 jax", lambda s: hc4_case(s), "jax", 2e-4),
    ("rmsnorm numpy", lambda s: rms_case(s), "numpy", 1e-6),
    ("rmsnorm jax", lambda s: rms_case(s), "jax", 2e-4),
    ("rmsnorm softcap numpy", lambda s: rms_case(s, softcap=3.0), "numpy", 1e-6),
    ("rmsnorm softcap jax", lambda s: rms_case(s, softcap=3.0), "jax", 2e-4),
    ("post-norm numpy", lambda s: rms_case(s, post=True), "numpy", 1e-6),
    ("post-norm jax", lambda s: rms_case(s, post=True), "jax", 2e-4),
    ("post-norm softcap numpy", lambda s: rms_case(s, softcap=3.0, post=True), "numpy", 1e-6),
    ("post-norm softcap jax", lambda s: rms_case(s, softcap=3.0, post=True), "jax", 2e-4),
]


def _tokens(rng, T, V):
    tok = rng.integers(0, V, size=(T, 3))
    tok[0, 2] = -1
    return tok


@pytest.mark.parametrize("name,build,backend,tol", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_u_against_finite_differences(name, build, backend, tol, seed):
    tail, rs = build(seed)
    _check_against_finite_differences(tail, rs, backend, tol, seed)


def _check_against_finite_differences(tail, rs, backend, tol, seed):
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


def post_case(seed, **kw):
    return rms_case(seed, post=True, **kw)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("build", [hc4_case, rms_case, post_case], ids=["hc4", "rmsnorm", "post-norm"])
def test_jax_matches_reference(build, seed):
    tail, rs = build(seed)
    tok = _tokens(np.random.default_rng(seed), rs.rows, tail.head.rows)
    ref = linearize(tail, rs, tok, backend="numpy")
    fast = linearize(tail, rs, tok, backend="jax")
    ok = tok >= 0
    np.testing.assert_allclose(fast.u, ref.u, rtol=0, atol=2e-4 * np.abs(ref.u).max())
    np.testing.assert_allclose(fast.logits[ok], ref.logits[ok], rtol=0, atol=1e-4 * np.abs(ref.logits[ok]).max())


@pytest.mark.parametrize("build", [hc4_case, rms_case, post_case], ids=["hc4", "rmsnorm", "post-norm"])
def test_many_tokens_per_row(build):
    """A full 64-row chunk with 17 tokens per row (and a 6-row rest): the batched pull of every
    cotangent at once (jax.vmap) came out wrong by up to 0.2 on XLA:CPU at these shapes."""
    tail, rs = build(0, T=70)
    tok = np.random.default_rng(5).integers(0, tail.head.rows, size=(rs.rows, 17))
    ref = linearize(tail, rs, tok, backend="numpy")
    fast = linearize(tail, rs, tok, backend="jax")
    np.testing.assert_allclose(fast.u, ref.u, rtol=0, atol=2e-4 * np.abs(ref.u).max())


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 16), w_exp=st.integers(-3, 2), post_exp=st.integers(-1, 1),
       r_exp=st.integers(-1, 4), eps=st.sampled_from([1e-6, 1e-2]), softcap=st.sampled_from([None, 30.0]),
       backend=st.sampled_from(["numpy", "jax"]))
@example(seed=0, w_exp=-3, post_exp=0, r_exp=4, eps=1e-2, softcap=None, backend="numpy")  # mean(y^2) << eps
def test_post_norm_linearization_over_magnitudes(seed, w_exp, post_exp, r_exp, eps, softcap, backend):
    """Post-norm tails drawn over magnitudes: W at 10^w_exp (so mean(y^2) ranges from far below
    the norm's eps to far above it), post-norm weights at 10^post_exp, residuals R at 10^r_exp
    (Gemma's reach 1e4: the final norm then sees the FFN write as a small part of R'), both eps
    values, with and without a softcap. Tolerances are the table's (module doc): 1e-6 of the
    largest |u.z| for the float64 reference (central differences' truncation), 2e-4 for the
    float32 JAX path. The finite differences run the exact float64 forward (rmsnorm_l47_ref, then
    rmsnorm_mix_ref), so the normalization term of J_post is checked, not assumed."""
    tail, rs = rms_case(seed, softcap=softcap, post=True, w_scale=10.0 ** w_exp, post_scale=10.0 ** post_exp,
                        r_scale=10.0 ** r_exp, eps=eps)
    _check_against_finite_differences(tail, rs, backend, 1e-6 if backend == "numpy" else 2e-4, seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_post_norm_vjp_ref_and_jax_against_the_norms_jacobian(seed):
    """J_post^T c on its own: the analytic reference against the dense Jacobian of the float64
    norm by central differences (1e-7 relative: truncation O(step^2) at step = 1e-5 of max |y|),
    the JAX path against the reference (2e-5 relative: float32, n = 24); and the normalization
    term is not negligible (dropping it is off by far more than either tolerance)."""
    rng = np.random.default_rng(seed)
    T, m, n, h = 3, 4, 24, 7
    tail, _ = rms_case(seed, post=True, n=n, h=h)
    hh = rng.standard_normal((T, h)).astype(np.float32)
    cot = rng.standard_normal((T, m, n))
    p = tail.l47
    y = hh.astype(np.float64) @ np.asarray(p.w_down, np.float64).T
    ref = post_norm_vjp_ref(y, p.w_post, p.eps, cot)
    f = lambda v: v / np.sqrt(np.mean(v * v) + p.eps) * np.asarray(p.w_post, np.float64)  # noqa: E731
    step = 1e-5 * np.abs(y).max()
    for t in range(T):
        J = np.stack([(f(y[t] + step * e) - f(y[t] - step * e)) / (2 * step) for e in np.eye(n)], axis=1)
        want = cot[t] @ J                              # J[i, j] = d f_i / d y_j: (J^T c)_j = sum_i c_i J_ij
        np.testing.assert_allclose(ref[t], want, rtol=0, atol=1e-7 * np.abs(want).max())
        r = 1.0 / np.sqrt(np.mean(y[t] ** 2) + p.eps)
        dropped = np.max(np.abs(ref[t] - r * cot[t] * np.asarray(p.w_post, np.float64)))
        assert dropped > 1e3 * 1e-7 * np.abs(want).max()
    fast = post_norm_vjp_jax(tail, hh, cot)
    np.testing.assert_allclose(fast, ref, rtol=0, atol=2e-5 * np.abs(ref).max())


def test_post_norm_linearization_is_not_the_plain_one():
    """The post-norm tail's u differs from the same tail's without the norm (a wrong branch would
    pass a finite-difference test only by accident): the norm's Jacobian really is applied."""
    tail, rs = rms_case(0, post=True)
    plain = type(tail)(None, "mem", tail.l47._replace(w_post=None), tail.mix_params, tail.head, None)
    tok = np.zeros((rs.rows, 1), np.int64)
    a, b = linearize(tail, rs, tok, backend="numpy"), linearize(plain, rs, tok, backend="numpy")
    assert np.abs(a.u - b.u).max() > 0.1 * np.abs(b.u).max()
