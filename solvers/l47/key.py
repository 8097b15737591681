"""The edit's key: which input directions (hh space) of the FFN down projection a WFLD edit may use.

An edit dW (n x h) changes row t's FFN output y_t = W hh_t by dW hh_t (the residual by that, or by
a post-FFN norm's response to it), so what decides where it acts is its input side: dW hh = 0
leaves y_t, hence R'_t, exactly unchanged, post-FFN norm or not. The min-norm solve
(solvers.l47.gauss_newton) puts every condition's key at M hh_k, M the background metric's inverse
restricted to the null space: "a context where this word is likely".
A specific edit acts after the phrase's prefix and not at the word's other contexts, so it needs
directions that separate the two. With a key space Q (h x q, orthonormal columns) the edit is
restricted to dW = D Q^T and the solve is today's one in q coordinates:
    C_q = Q^T C Q,  B_q = null basis of the held uses projected, Q^T hh,  M = Q M_q Q^T,
so dW Q_perp = 0 exactly, and every condition, hold and shipping step is unchanged.

Kinds (per banned word w: its slop rows S_w, the train FTPO positions whose rejected token is w,
and its plausible rows P_w, rows where the base gives w probability >= a floor outside every
slop context, and its legitimate uses):
- "dense": Q = I (today's key);
- "discriminative": per word the top generalized eigenvectors of (S_w^T S_w / |S_w|) v =
  lam (P_w^T P_w / |P_w| + ridge * mean diag * I) v, the directions with the most slop energy per
  unit of plausible energy; the words' directions stacked and orthonormalized;
- "units": per word the FFN units (hh coordinates) whose mean |h| on slop rows is at least
  `min_ratio` times their mean on plausible rows, the `dims` largest ratios: Q is those columns of
  the identity, so dW is nonzero only in those columns (column-sparse).
`generalized_eig_ref` is the dense scipy reference of the discriminative directions;
`discriminative_directions` the fast path (a Cholesky of P and a |S_w| x |S_w| eigenproblem).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.linalg as sla

from exactedit.solvers.l47 import gauss_newton as gn
from exactedit.solvers.l47.config import KEYS, WfldError

__all__ = ["KEYS", "Key", "build_key", "dense_key", "discriminative_directions", "generalized_eig_ref",
           "key_metric", "unit_ratios"]


@dataclass(frozen=True, eq=False)
class Key:
    """A key space: `Q` [h, q] orthonormal (None: every direction), and per direction the word
    (index into the mining's words) that chose it and its score (generalized eigenvalue or unit
    ratio); `units` the chosen hh coordinates of a "units" key."""

    kind: str
    Q: np.ndarray | None
    word: np.ndarray             # int64 [q]
    score: np.ndarray            # float64 [q]
    units: np.ndarray            # int64 [q] ("units"), else empty
    slop_rows: tuple[int, ...]   # per word: slop rows it was chosen on
    plausible_rows: tuple[int, ...]  # per word: plausible rows it was chosen against

    @property
    def dims(self) -> int | None:
        return None if self.Q is None else int(self.Q.shape[1])

    def summary(self) -> dict:
        return {"kind": self.kind, "dims": self.dims, "word": self.word.tolist(),
                "score": [float(s) for s in self.score], "units": self.units.tolist(),
                "slop_rows": list(self.slop_rows), "plausible_rows": list(self.plausible_rows)}


def dense_key() -> Key:
    e = np.zeros(0, dtype=np.int64)
    return Key("dense", None, e, np.zeros(0), e, (), ())


def _second_moment(rows, ridge: float) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float64)
    P = x.T @ x / x.shape[0]
    scale = float(np.mean(np.diag(P)))
    if not scale > 0:
        raise WfldError("key", "plausible rows", "the plausible rows' activations are all zero")
    return P + ridge * scale * np.eye(P.shape[0])


def generalized_eig_ref(slop, plausible, dims: int, ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """The reference: scipy's dense generalized eigensolver of (S, P + ridge) for the `dims`
    largest eigenvalues; (eigenvalues descending [d], eigenvectors [h, d] with v^T P v = 1)."""
    s = np.asarray(slop, dtype=np.float64)
    S = s.T @ s / s.shape[0]
    P = _second_moment(plausible, ridge)
    h = S.shape[0]
    d = min(dims, s.shape[0], h)
    lam, V = sla.eigh(S, P, subset_by_index=[h - d, h - 1])
    return lam[::-1], V[:, ::-1]


def discriminative_directions(slop, plausible, dims: int, ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """The fast path of `generalized_eig_ref` (same normalization v^T P v = 1, signs free): with
    P = L L^T and Y = S_rows L^-T, the nonzero spectrum of L^-1 S L^-T is that of Y Y^T / p, a
    p x p problem (p slop rows); v = L^-T (Y^T a) / sqrt(p lam)."""
    s = np.asarray(slop, dtype=np.float64)
    p = s.shape[0]
    if p == 0:
        return np.zeros(0), np.zeros((s.shape[1], 0))
    L = sla.cholesky(_second_moment(plausible, ridge), lower=True)
    Y = sla.solve_triangular(L, s.T, lower=True).T            # [p, h] = s L^-T
    lam, A = np.linalg.eigh(Y @ Y.T / p)
    d = min(dims, p)
    order = np.argsort(lam)[::-1][:d]
    lam, A = lam[order], A[:, order]
    keep = lam > 1e-12 * max(float(lam[0]), 1e-300) if lam.size else lam.astype(bool)
    lam, A = lam[keep], A[:, keep]
    W = Y.T @ A / np.sqrt(p * lam)                            # orthonormal w = L^T v
    V = sla.solve_triangular(L.T, W, lower=False)
    return lam, V


def unit_ratios(slop, plausible) -> np.ndarray:
    """Per unit: mean |h| on slop rows / mean |h| on plausible rows (float64 [h]; a unit silent on
    the plausible rows gets inf where it fires on slop rows, 0 where neither)."""
    a = np.mean(np.abs(np.asarray(slop, dtype=np.float64)), axis=0)
    b = np.mean(np.abs(np.asarray(plausible, dtype=np.float64)), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(b > 0, a / np.where(b > 0, b, 1.0), np.where(a > 0, np.inf, 0.0))
    return r


def build_key(kind: str, slop_by_word: Sequence[np.ndarray], plausible_by_word: Sequence[np.ndarray], *,
              dims: int, ridge: float, min_ratio: float, h: int) -> Key:
    """The key of `kind` from per-word slop rows and plausible rows (hh [m, h] each). A word with
    no slop row adds nothing; a word with slop rows but no plausible row cannot be discriminated
    and raises."""
    if kind not in KEYS:
        raise WfldError("key", "kind", f"expected one of {KEYS}, got {kind!r}")
    if kind == "dense":
        return dense_key()
    if len(slop_by_word) != len(plausible_by_word):
        raise WfldError("key", "words", "one slop block and one plausible block per word")
    cols, words, scores, units = [], [], [], []
    for wi, (s, p) in enumerate(zip(slop_by_word, plausible_by_word)):
        s, p = np.asarray(s, np.float64).reshape(-1, h), np.asarray(p, np.float64).reshape(-1, h)
        if s.shape[0] == 0:
            continue
        if p.shape[0] == 0:
            raise WfldError("key", "plausible rows", f"word {wi} has slop rows but no plausible context to "
                            "separate them from (lower --key-floor or give more text)")
        if kind == "discriminative":
            lam, V = discriminative_directions(s, p, dims, ridge)
            cols.append(V)
            words += [wi] * V.shape[1]
            scores += lam.tolist()
        else:
            r = unit_ratios(s, p)
            order = np.argsort(-r, kind="stable")
            chosen = [int(u) for u in order[:dims] if r[u] >= min_ratio]
            units += chosen
            words += [wi] * len(chosen)
            scores += [float(r[u]) for u in chosen]
    slop_n = tuple(int(np.asarray(s).reshape(-1, h).shape[0]) for s in slop_by_word)
    plaus_n = tuple(int(np.asarray(p).reshape(-1, h).shape[0]) for p in plausible_by_word)
    if kind == "units":
        if not units:
            raise WfldError("key", "units", f"no FFN unit reaches a slop / plausible ratio of {min_ratio}: the "
                            "phrases' contexts are not unit-specific at this layer (try --key discriminative)")
        first = np.sort(np.unique(units, return_index=True)[1])     # a unit two words chose: kept once, first
        u = np.asarray(units, dtype=np.int64)[first]
        Q = np.zeros((h, u.size))
        Q[u, np.arange(u.size)] = 1.0
        return Key("units", Q, np.asarray(words, np.int64)[first], np.asarray(scores)[first], u, slop_n, plaus_n)
    if not cols:
        raise WfldError("key", "slop rows", "no word has a slop row: nothing to build a key on")
    V = np.concatenate(cols, axis=1)
    Q, R = np.linalg.qr(V)
    keep = np.abs(np.diag(R)) > 1e-10 * np.max(np.abs(np.diag(R)))
    return Key("discriminative", Q[:, keep], np.asarray(words, np.int64)[keep], np.asarray(scores)[keep],
               np.zeros(0, np.int64), slop_n, plaus_n)


def key_metric(key: Key, C: np.ndarray, held_groups: Sequence[np.ndarray], *, null_rank: int, null_tol: float
               ) -> tuple[np.ndarray, np.ndarray]:
    """(M [h, h], B [h, r]) of the solve restricted to the key: M = Q M_q Q^T with M_q the metric
    C_q = Q^T C Q restricted to the null basis B_q of the held uses projected on Q (at most
    `null_rank` directions per word, fewer than q in all); B = Q B_q. Dense: today's M and B."""
    h = C.shape[0]
    if key.Q is None:
        B = gn.null_basis(held_groups, null_rank, null_tol, h)
        return gn.restricted_inverse(C, B), B
    Q = key.Q
    q = Q.shape[1]
    proj = [np.asarray(g, np.float64).reshape(-1, h) @ Q for g in held_groups]
    B_q = gn.null_basis(proj, null_rank, null_tol, q) if null_rank else np.zeros((q, 0))
    M_q = gn.restricted_inverse(Q.T @ C @ Q, B_q)
    return Q @ M_q @ Q.T, Q @ B_q
