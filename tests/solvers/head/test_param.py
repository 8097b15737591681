"""Parameterizations of the head edit: chain rule vs float64 finite differences, the null space."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from exactedit.bench.solve_head import synthetic_batch
from exactedit.solvers.head.objective import Weights, edited, logsumexp, objective, objective_grad
from exactedit.solvers.head.param import (
    FullRows, LowRank, anchor_energy_kept, delta_w, init_params, n_params, null_basis, project, pullback,
)

W = Weights(nll=1.0, margin=0.5, ul=0.7, close=0.4, kl=3.0, guard=2.0, guard_eps=0.01, ridge=0.1)


def _min_one_minus(batch, dw) -> float:
    """The smallest 1 - P over the unlikelihood terms' rows: -log(1 - P) is computed from log P, so
    its float64 rounding error is about eps * |LSE| / (1 - P)."""
    ls, lse2 = edited(batch, batch.z @ dw.T)
    out = 1.0
    for term in (batch.opener, batch.closer):
        if len(term.rows):
            inside = logsumexp(np.where(term.mask, ls[term.rows], -np.inf))
            log_p = np.logaddexp(term.lse_out, inside) - lse2[term.rows]
            out = min(out, float(np.min(-np.expm1(log_p))))
    return out


def _random_params(rng, rank, k, n):
    if rank == 0:
        return FullRows(rng.standard_normal((k, n)))
    return LowRank(rng.standard_normal((k, rank)), rng.standard_normal((n, rank)))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rank=st.integers(0, 3), k=st.integers(1, 5),
       n=st.integers(2, 8), null_k=st.integers(0, 3))
def test_parameter_gradient_matches_finite_differences(seed, rank, k, n, null_k):
    rng = np.random.default_rng(seed)
    batch = synthetic_batch(rng, 10, k, n, z_scale=float(np.sqrt(n)))
    q = null_basis(batch.z[batch.anchor], min(null_k, n - 1))
    params = _random_params(rng, rank, k, n)
    direction = _random_params(rng, rank, k, n)

    def f(p):
        return objective(batch, delta_w(p, q), W).total

    # central differences at h = 1e-5 resolve rel 1e-5 only where the objective's own rounding
    # (above) stays below ~1e-12: where a set already holds all but 1e-6 of the mass, the value
    # -log(1 - P) is too noisy in float64 for any finite difference to check a gradient against
    assume(_min_one_minus(batch, delta_w(params, q)) > 1e-6)
    _, grad_w = objective_grad(batch, delta_w(params, q), W)
    grads = pullback(params, q, grad_w)
    h = 1e-5
    plus = type(params)(*(x + h * d for x, d in zip(params, direction)))
    minus = type(params)(*(x - h * d for x, d in zip(params, direction)))
    numeric = (f(plus) - f(minus)) / (2 * h)
    analytic = sum(float(np.sum(g * d)) for g, d in zip(grads, direction))
    assert numeric == pytest.approx(analytic, rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_edit_never_moves_the_protected_anchor_directions(rank):
    rng = np.random.default_rng(rank)
    z_anchor = rng.standard_normal((40, 12)) * np.linspace(3, 0.1, 12)
    q = null_basis(z_anchor, 4)
    params = _random_params(rng, rank, 5, 12)
    dw = delta_w(params, q)
    assert np.abs(dw @ q).max() < 1e-12
    assert np.allclose(q.T @ q, np.eye(4))
    assert np.allclose(delta_w(project(params, q), q), dw)
    if rank:
        assert np.abs(q.T @ project(params, q).b).max() < 1e-12


def test_null_basis_is_the_top_eigenspace():
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.standard_normal((6, 6)))[0]
    z = rng.standard_normal((500, 6)) * np.array([10, 5, 1, 0.1, 0.1, 0.1]) @ basis.T
    q = null_basis(z, 2)
    assert np.allclose(np.abs(q.T @ basis[:, :2]), np.eye(2), atol=0.05)
    assert anchor_energy_kept(z, q) > 0.99
    assert anchor_energy_kept(z, null_basis(z, 0)) == 0.0


@pytest.mark.parametrize("k", [-1, 6, 7])
def test_null_k_out_of_range_is_refused(k):
    with pytest.raises(ValueError, match="null_k"):
        null_basis(np.ones((3, 6)), k)


def test_low_rank_init_is_the_steepest_null_space_direction():
    rng = np.random.default_rng(1)
    grad_w0 = rng.standard_normal((4, 9))
    q = null_basis(rng.standard_normal((20, 9)), 3)
    params = init_params(1, grad_w0, q)
    assert not params.a.any() and not delta_w(params, q).any()
    b = params.b[:, 0]
    top = np.linalg.svd((grad_w0 - (grad_w0 @ q) @ q.T).T, full_matrices=False)[0][:, 0]
    assert abs(abs(b @ top) - 1.0) < 1e-12 and np.abs(q.T @ b).max() < 1e-12
    assert n_params(params) == 4 + 9
    full = init_params(0, grad_w0, q)
    assert isinstance(full, FullRows) and full.d.shape == (4, 9) and not full.d.any()
