"""The head objective: definition (brute force over a small vocabulary), analytic gradient vs
float64 finite differences for every term, and the JAX float32 version vs the reference."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from exactedit.bench.solve_head import synthetic_batch
from exactedit.solvers.head.objective import (
    HeadBatch, MarginTerm, SetTerm, TargetTerm, Weights, logsumexp, objective, objective_grad,
)

ONLY = {
    "nll": Weights(nll=1.0, kl=0.0, guard=0.0),
    "margin": Weights(nll=0.0, margin=1.0, margin_m=0.7, kl=0.0, guard=0.0),
    "opener": Weights(nll=0.0, ul=1.0, kl=0.0, guard=0.0),
    "closer": Weights(nll=0.0, close=1.0, kl=0.0, guard=0.0),
    "kl": Weights(nll=0.0, kl=1.0, guard=0.0),
    "guard": Weights(nll=0.0, kl=0.0, guard=1.0, guard_eps=0.01),
    "ridge": Weights(nll=0.0, kl=0.0, guard=0.0, ridge=0.3),
}
ALL = Weights(nll=1.0, margin=0.5, margin_m=1.0, ul=0.7, close=0.4, kl=3.0, guard=2.0, guard_eps=0.01,
              ridge=0.1)


def _fd_check(f, grad, x, direction, h=1e-5):
    numeric = (f(x + h * direction) - f(x - h * direction)) / (2 * h)
    analytic = float(np.sum(grad * direction))
    assert numeric == pytest.approx(analytic, rel=1e-5, abs=1e-8)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), term=st.sampled_from(sorted(ONLY) + ["all"]),
       rows=st.integers(1, 12), k=st.integers(1, 5), n=st.integers(1, 7),
       scale=st.sampled_from([0.1, 0.5, 1.5]))
def test_gradient_matches_finite_differences(seed, term, rows, k, n, scale):
    rng = np.random.default_rng(seed)
    batch = synthetic_batch(rng, rows, k, n, z_scale=float(np.sqrt(n)))
    w = ALL if term == "all" else ONLY[term]
    dw = rng.normal(0.0, scale, (k, n))
    terms, g = objective_grad(batch, dw, w)
    assert terms.total == pytest.approx(sum(terms[:-1]))
    _fd_check(lambda x: objective(batch, x, w).total, g, dw, rng.standard_normal((k, n)))


def test_guard_gradient_is_exercised():
    """The guard's hinge is active somewhere in the finite-difference cases (else its test is empty)."""
    rng = np.random.default_rng(3)
    batch = synthetic_batch(rng, 12, 4, 5, z_scale=np.sqrt(5))
    row = batch.guard[0]
    dw = np.outer(np.ones(4), -10.0 * batch.z[row] / np.sum(batch.z[row] ** 2))  # delta = -10 on that row
    terms, g = objective_grad(batch, dw, ONLY["guard"])
    assert terms.guard > 0 and np.abs(g).max() > 0


# ---- the definition, by brute force over a whole (small) vocabulary ----------------------------

def _full_vocab_case(seed):
    """Explicit logits over V = 24 tokens; S = 5 edited ids; token 0 is a special."""
    rng = np.random.default_rng(seed)
    rows, n, vocab = 9, 6, 24
    w_out = rng.standard_normal((vocab, n))
    z = rng.standard_normal((rows, n))
    s_ids = np.array([3, 7, 8, 15, 20])
    opener_ids, closer_ids = np.array([2, 7, 9, 15]), np.array([5, 8, 11])
    y = rng.integers(1, vocab, rows)
    y[0], y[1] = 7, 9          # targets inside S and inside the opener set
    cho, rej = np.full(rows, 8), np.full(rows, 4)
    return z, w_out, s_ids, opener_ids, closer_ids, y, cho, rej


def _batch_from_full_logits(logits, z, s_ids, opener_ids, closer_ids, y, cho, rej):
    rows = np.arange(len(z))
    outside = np.setdiff1d(np.arange(logits.shape[1]), s_ids)
    slot_of = {int(v): i for i, v in enumerate(s_ids)}

    def target(tokens):
        return TargetTerm(rows, logits[rows, tokens], np.array([slot_of.get(int(v), -1) for v in tokens]))

    def set_term(ids, exclude_target):
        mask = np.zeros((len(rows), len(s_ids)), bool)
        lse_out = np.full(len(rows), -np.inf)
        for t in rows:
            members = [v for v in ids if not (exclude_target and v == y[t])]
            for v in members:
                if v in slot_of:
                    mask[t, slot_of[v]] = True
            out = [v for v in members if v not in slot_of]
            lse_out[t] = logsumexp(logits[t, out]) if out else -np.inf
        return SetTerm(rows, mask, lse_out)

    return HeadBatch(z=z, base_s=logits[:, s_ids], lse_rest=logsumexp(logits[:, outside]),
                     lse=logsumexp(logits), nll=target(y), margin=MarginTerm(target(cho), target(rej)),
                     opener=set_term(opener_ids, True), closer=set_term(closer_ids, False),
                     anchor=rows, guard=rows)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_terms_equal_their_definition_over_the_whole_vocabulary(seed):
    z, w_out, s_ids, opener_ids, closer_ids, y, cho, rej = _full_vocab_case(seed)
    logits = z @ w_out.T
    batch = _batch_from_full_logits(logits, z, s_ids, opener_ids, closer_ids, y, cho, rej)
    dw = np.random.default_rng(seed + 10).normal(0, 0.7, (len(s_ids), z.shape[1]))
    edited = logits.copy()
    edited[:, s_ids] += z @ dw.T
    logp = logits - logsumexp(logits)[:, None]
    logp2 = edited - logsumexp(edited)[:, None]
    p2 = np.exp(logp2)
    rows = np.arange(len(z))
    eps, m = 0.01, 0.7

    opener = [-np.log1p(-sum(p2[t, o] for o in opener_ids if o != y[t])) for t in rows]
    closer = [-np.log1p(-p2[t, closer_ids].sum()) for t in rows]
    special_rise = logp2[:, 0] - logp[:, 0]   # token 0 is never in S
    expected = {
        "nll": np.mean(-logp2[rows, y]),
        "margin": np.mean(np.logaddexp(0, m - (edited[rows, cho] - edited[rows, rej]))),
        "opener": np.mean(opener),
        "closer": np.mean(closer),
        "kl": np.mean(np.sum(np.exp(logp) * (logp - logp2), axis=1)),
        "guard": np.mean(np.maximum(special_rise - eps, 0) ** 2),
        "ridge": np.sum(dw * dw),
    }
    assert np.any(special_rise > eps), "the case must exercise the guard's hinge"
    for name, weights in ONLY.items():
        w = replace(weights, margin_m=m, guard_eps=eps)
        got = getattr(objective(batch, dw, w), name) / max(getattr(w, _weight_field(name)), 1e-300)
        assert got == pytest.approx(expected[name], rel=1e-10, abs=1e-12), name


def _weight_field(term):
    return {"opener": "ul", "closer": "close"}.get(term, term)


def test_empty_terms_contribute_zero():
    rng = np.random.default_rng(0)
    batch = synthetic_batch(rng, 6, 3, 4)
    empty = np.zeros(0, dtype=np.int64)
    no_target = TargetTerm(empty, np.zeros(0), empty)
    no_set = SetTerm(empty, np.zeros((0, 3), bool), np.zeros(0))
    batch = batch._replace(nll=no_target, margin=MarginTerm(no_target, no_target), opener=no_set,
                           closer=no_set, anchor=empty, guard=empty)
    terms, g = objective_grad(batch, rng.standard_normal((3, 4)), replace(ALL, ridge=0.0))
    assert terms.total == 0.0 and not g.any()


@pytest.mark.parametrize("field, value", [("kl", -1.0), ("ridge", float("nan")), ("guard_eps", -0.1),
                                          ("margin_m", float("inf"))])
def test_weights_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        Weights(**{field: value})


# ---- the JAX fast path against the float64 reference -------------------------------------------

# (name, rank, null_k, float dtype, rtol, why this tolerance)
JAX_TABLE = [
    ("full-f64", 0, 0, "float64", 1e-9, "same math in float64: only summation order differs"),
    ("rank2-null-f64", 2, 2, "float64", 1e-9, "same math in float64: only summation order differs"),
    ("full-f32", 0, 0, "float32", 2e-4, "float32 rounding of z.dW, exp and the row means"),
    ("rank1-null-f32", 1, 3, "float32", 2e-4, "float32 rounding of z.dW, exp and the row means"),
]


@pytest.mark.parametrize("name, rank, null_k, dtype, rtol, why", JAX_TABLE, ids=[c[0] for c in JAX_TABLE])
def test_jax_matches_reference(name, rank, null_k, dtype, rtol, why):
    import jax
    import jax.numpy as jnp

    from exactedit.solvers.head import objective_jax as oj
    from exactedit.solvers.head.param import FullRows, LowRank, delta_w, null_basis, pullback

    rng = np.random.default_rng(7)
    k, n = 4, 9
    batch = synthetic_batch(rng, 30, k, n, z_scale=3.0)
    q = null_basis(batch.z[batch.anchor], null_k)
    params = (FullRows(rng.normal(0, 0.3, (k, n))) if rank == 0 else
              LowRank(rng.normal(0, 0.5, (k, rank)), rng.normal(0, 0.5, (n, rank))))
    ref_terms, grad_w = objective_grad(batch, delta_w(params, q), ALL)
    ref_grads = pullback(params, q, grad_w)
    with jax.enable_x64(dtype == "float64"):
        jdtype = jnp.dtype(dtype)
        data = oj.to_device(batch, q, dtype=jdtype)
        jparams = type(params)(*(jnp.asarray(x, jdtype) for x in params))
        terms, grads = jax.jit(oj.value_and_grad, static_argnames="w")(jparams, data, ALL)
        terms = [float(x) for x in terms]
        grads = [np.asarray(g, dtype=np.float64) for g in grads]
    assert terms == pytest.approx(list(ref_terms), rel=rtol, abs=rtol * 1e-2), why
    for got, want in zip(grads, ref_grads):
        assert np.linalg.norm(got - want) <= rtol * np.linalg.norm(want), why
