"""Parameterizations of the head edit dW_S (|S| x n): full rows, or rank r with B in a null space.

Full rows:   dW = D P             (D free, |S| x n)
Rank r:      dW = A (P B)^T,      P = I - Q Q^T
             (A: |S| x r, B: n x r, Q: n x k orthonormal, the top-k eigenvectors of the train
             anchors' mix covariance sum_t z_t z_t^T, so the edit cannot move an anchor direction.)

`P` sits inside the map, so dW lies in the null space for any D or B and the gradient is exact;
`project` also re-projects B after each optimizer step (Adam's per-coordinate scaling would
otherwise let B drift out of the null space; dW is unchanged by it). An empty Q (k = 0) is no
constraint. This is the numpy reference; objective_jax.py has the same maps in JAX.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class FullRows(NamedTuple):
    d: np.ndarray  # [|S|, n]


class LowRank(NamedTuple):
    a: np.ndarray  # [|S|, r]
    b: np.ndarray  # [n, r]


Params = FullRows | LowRank


def null_basis(z_anchor: np.ndarray, k: int) -> np.ndarray:
    """Q (n x k): top-k eigenvectors of sum_t z_t z_t^T over the anchor rows (float64)."""
    n = z_anchor.shape[1]
    if not 0 <= k < n:
        raise ValueError(f"null_k must be in [0, n) = [0, {n}), got {k}")
    if k == 0:
        return np.zeros((n, 0))
    z = np.asarray(z_anchor, dtype=np.float64)
    cov = z.T @ z
    _, vecs = np.linalg.eigh(cov)
    return np.ascontiguousarray(vecs[:, ::-1][:, :k])


def anchor_energy_kept(z_anchor: np.ndarray, q: np.ndarray) -> float:
    """Share of the anchors' mix energy inside span(Q): what the null space protects."""
    z = np.asarray(z_anchor, dtype=np.float64)
    total = float(np.sum(z * z))
    return float(np.sum((z @ q) ** 2)) / total if total > 0 else 0.0


def project_out(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(I - Q Q^T) x for x with n rows."""
    return x - q @ (q.T @ x)


def delta_w(params: Params, q: np.ndarray) -> np.ndarray:
    """dW (|S| x n) of the parameters."""
    if isinstance(params, FullRows):
        return project_out(params.d.T, q).T
    return params.a @ project_out(params.b, q).T


def pullback(params: Params, q: np.ndarray, grad_w: np.ndarray) -> Params:
    """Chain rule: the gradient with respect to the parameters, given G_W = dJ/d dW."""
    if isinstance(params, FullRows):
        return FullRows(project_out(grad_w.T, q).T)
    pb = project_out(params.b, q)
    return LowRank(a=grad_w @ pb, b=project_out(grad_w.T @ params.a, q))


def project(params: Params, q: np.ndarray) -> Params:
    """Put D or B back into the null space (no change to dW)."""
    if isinstance(params, FullRows):
        return FullRows(project_out(params.d.T, q).T)
    return LowRank(params.a, project_out(params.b, q))


def init_params(rank: int, grad_w0: np.ndarray, q: np.ndarray) -> Params:
    """Zero edit. Rank r: A = 0 and B = the top-r right singular vectors of P G_W0^T, the steepest
    rank-r null-space direction at dW = 0 (deterministic; no random seed in a bundle's config)."""
    k, n = grad_w0.shape
    if rank == 0:
        return FullRows(np.zeros((k, n)))
    projected = project_out(np.asarray(grad_w0, dtype=np.float64).T, q)  # n x |S|
    u, _, _ = np.linalg.svd(projected, full_matrices=False)
    b = np.zeros((n, rank))
    cols = min(rank, u.shape[1])
    b[:, :cols] = u[:, :cols]
    return LowRank(a=np.zeros((k, rank)), b=b)


def n_params(params: Params) -> int:
    return int(sum(np.size(x) for x in params))
