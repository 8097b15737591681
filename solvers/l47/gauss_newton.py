"""The WFLD solve: the least-energy edit dW (n x h) that moves given logits by given amounts.

Every condition k is linear in dW after linearization: <dW, u_k hh_k^T> = b_k (row slot_k, token
token_k; u from `solvers.l47.jacobian`: the head's VJP, through a post-FFN norm's Jacobian at the
point where the tail has one). With the background metric C (h x h: the anchors' hh
covariance plus ridge * mean(diag) * I) and the collateral null space span(B) folded in,
    minimize tr(dW C dW^T)  subject to  dW B = 0  and the K conditions,
whose solution lies in the span of the rank-1 conditions:
    M     = C^-1 - C^-1 B (B^T C^-1 B)^-1 B^T C^-1        (the metric restricted to dW B = 0)
    G_kl  = (u_k . u_l)(hh_k^T M hh_l)                    K x K Gram system
    lam   = (G + diag(eps_k * mean diag G))^-1 b
    dW    = sum_k lam_k u_k (M hh_k)^T                    so dW B = 0 exactly (M B = 0).
eps_k is a small Tikhonov weight per condition: hard holds (special tokens) get `hold_eps`,
targets `target_eps`, so an infeasible target (its hh inside the null space) stays bounded.

`gauss_newton` repeats: linearize at the edit as shipped (the tensor's quantization, by `ship`:
a plain round trip, `Shipper`, or codes chosen to keep the conditions, `solvers.l47.ship`), solve for the whole
dW with the conditions' total targets, ship, re-score exactly through the nonlinear head.
Round i solves <dW, U_i hh> = target - (l(W_i) - l(W_0)) + <dW_i, U_i hh>, the first-order model of
l at the shipped point W_i = W_0 + dW_i; nothing assumes R' affine in dW, so a post-FFN norm (Gemma
style: R' = R + rmsnorm(W hh) * w_post) converges the same way as long as U_i is the exact
Jacobian at W_i (tests/solvers/l47/test_jacobian.py checks it by finite differences; the rounds
converge quadratically in float, tests/solvers/l47/test_gauss_newton.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import scipy.linalg as sla

from exactedit.solvers.l47.config import WfldError

REJECTED, ALTERNATIVE, SPECIAL_TARGET, SPECIAL_ANCHOR, VARIANT, WORD_HOLD = 0, 1, 2, 3, 4, 5
KIND_NAMES = ("rejected", "alternative", "special@target", "special@anchor", "variant@target", "word@plausible")
HOLD_KINDS = (SPECIAL_TARGET, SPECIAL_ANCHOR, VARIANT)


class Conditions(NamedTuple):
    """K linear conditions: at condition row `slot` (index into the stacked condition rows), token
    `token` should change its logit by `target` from the base; `eps` its relative Tikhonov weight."""

    slot: np.ndarray     # int64 [K]
    token: np.ndarray    # int64 [K]
    kind: np.ndarray     # int8 [K] (REJECTED, ALTERNATIVE, SPECIAL_TARGET, SPECIAL_ANCHOR, VARIANT, WORD_HOLD)
    target: np.ndarray   # float64 [K]
    eps: np.ndarray      # float64 [K]

    @property
    def size(self) -> int:
        return int(self.slot.size)


def background_metric(hh_bg, ridge: float) -> np.ndarray:
    """C = mean_a hh_a hh_a^T + ridge * mean(diag) * I (h x h float64) over background rows."""
    hh = np.asarray(hh_bg, dtype=np.float64)
    if hh.ndim != 2 or hh.shape[0] == 0:
        raise WfldError("background", "hh", f"expected [rows >= 1, h] anchor activations, got {list(hh.shape)}")
    C = hh.T @ hh / hh.shape[0]
    scale = float(np.mean(np.diag(C)))
    if not scale > 0:
        raise WfldError("background", "hh", "anchor activations are all zero")
    return C + ridge * scale * np.eye(C.shape[0])


def null_basis(groups, rank: int, tol: float, h: int) -> np.ndarray:
    """Orthonormal B [h, r]: per group (one banned word's collateral hh [m, h]) its top singular
    directions (at most `rank`, singular values >= tol * the largest), then all groups together."""
    parts = []
    for hh in groups:
        hh = np.asarray(hh, dtype=np.float64)
        if hh.shape[0] == 0 or rank == 0:
            continue
        _, s, vt = np.linalg.svd(hh, full_matrices=False)
        keep = min(rank, int(np.sum(s >= tol * s[0]))) if s[0] > 0 else 0
        parts.append(vt[:keep])
    if not parts:
        return np.zeros((h, 0))
    stack = np.concatenate(parts, axis=0)
    _, s, vt = np.linalg.svd(stack, full_matrices=False)
    r = int(np.sum(s >= max(tol, 1e-12) * s[0]))
    if r >= h:
        raise WfldError("collateral", "null space", f"the words' legitimate uses span all {h} hh "
                        "directions: no edit is left; lower null_rank")
    return vt[:r].T


def spd_inverse(C: np.ndarray) -> np.ndarray:
    """C^-1 of a symmetric positive definite C, from its Cholesky factor by LAPACK's potri (a third
    of the flops of solving against the identity); LinAlgError where C is not positive definite."""
    from scipy.linalg import lapack

    R, info = lapack.dpotrf(np.asarray(C, dtype=np.float64), lower=0, clean=1)
    if info == 0:
        inv, info = lapack.dpotri(R, lower=0)
    if info != 0:
        raise np.linalg.LinAlgError(f"the metric is not positive definite (LAPACK info {info})")
    return np.triu(inv) + np.triu(inv, 1).T       # potri writes the upper triangle


def restricted_inverse(C: np.ndarray, B: np.ndarray) -> np.ndarray:
    """M = C^-1 - C^-1 B (B^T C^-1 B)^-1 B^T C^-1 (symmetric h x h): M B = 0."""
    Cinv = spd_inverse(C)
    if B.shape[1] == 0:
        return Cinv
    CB = Cinv @ B
    M = Cinv - CB @ np.linalg.solve(B.T @ CB, CB.T)
    return (M + M.T) / 2


class MinNorm(NamedTuple):
    dW: np.ndarray       # float64 [n, h]
    lam: np.ndarray      # float64 [K]
    linear: np.ndarray   # float64 [K] the linearized change <dW, u_k hh_k^T>
    rhs: np.ndarray      # float64 [K] what the conditions asked of it


def linear_change(dW, U, Hh) -> np.ndarray:
    """<dW, u_k hh_k^T> for every condition: float64 [K]."""
    return np.einsum("kh,kh->k", np.asarray(U, np.float64) @ np.asarray(dW, np.float64), Hh)


class Gram(NamedTuple):
    """The parts of the Gram system that do not depend on the linearization U: computed once per
    solve (they cost K h^2 and K^2 h, the rounds' U-dependent part K^2 n + K^3 / 3)."""

    G: np.ndarray        # float64 [K, h] rows (M hh_k)^T
    GH: np.ndarray       # float64 [K, K] G Hh^T


def gram_parts(Hh, M) -> Gram:
    """`Gram` of the conditions' hidden states Hh [K, h] under the metric M [h, h]."""
    Hh = np.asarray(Hh, dtype=np.float64)
    G = Hh @ np.asarray(M, dtype=np.float64)
    return Gram(G, G @ Hh.T)


def _gram_solve(U, Hh, M, b, eps, gram: Gram | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(lam [K] or [K, m], G [K, h]) of the Gram system for one right-hand side b [K] or several [K, m];
    `gram`: gram_parts(Hh, M) when the caller has it (the same numbers, computed once)."""
    gram = gram_parts(Hh, M) if gram is None else gram
    A = (U @ U.T) * gram.GH
    scale = float(np.mean(np.diag(A))) if A.size else 0.0
    if not scale > 0:
        raise WfldError("wfld", "conditions", "every condition's vector is zero (no edit can move them)")
    A[np.diag_indices_from(A)] += np.asarray(eps, dtype=np.float64) * scale
    try:
        lam = sla.cho_solve(sla.cho_factor(A), b)
    except np.linalg.LinAlgError:
        lam = np.linalg.lstsq(A, b, rcond=None)[0]
    return lam, gram.G


def solve_min_norm(U, Hh, M, b, eps, gram: Gram | None = None) -> MinNorm:
    """The Gram solve of the module docstring; U [K, n], Hh [K, h], M [h, h], b [K], eps [K];
    `gram` as in `_gram_solve`."""
    U, Hh, b = (np.asarray(x, dtype=np.float64) for x in (U, Hh, b))
    lam, G = _gram_solve(U, Hh, M, b, eps, gram)
    dW = (U * lam[:, None]).T @ G
    return MinNorm(dW, lam, linear_change(dW, U, Hh), b)


class PartFactors(NamedTuple):
    """The m edits of `min_norm_parts` unformed: dW_j = (U * lam[:, j])^T G. A combination's effect
    on rows hh [T, h] is ((hh G^T) * (lam s)) U, T K (h + n) flops instead of the m n h K that
    forming the edits costs (`frontier.line_scorer` reads them so)."""

    U: np.ndarray        # float64 [K, n]
    lam: np.ndarray      # float64 [K, m]
    G: np.ndarray        # float64 [K, h]

    def dense(self) -> np.ndarray:
        """float64 [m, n, h]: every edit formed."""
        out = np.empty((self.lam.shape[1], self.U.shape[1], self.G.shape[1]))
        for j in range(self.lam.shape[1]):
            np.matmul((self.U * self.lam[:, j][:, None]).T, self.G, out=out[j])
        return out


def min_norm_factors(U, Hh, M, bs, eps, gram: Gram | None = None) -> PartFactors:
    """The Gram solve for each column of bs [K, m] (one factorization), its edits unformed
    (`PartFactors`); `gram` as in `_gram_solve`."""
    U, Hh, bs = (np.asarray(x, dtype=np.float64) for x in (U, Hh, bs))
    lam, G = _gram_solve(U, Hh, M, bs, eps, gram)
    return PartFactors(U, np.asarray(lam, np.float64).reshape(bs.shape), G)


def min_norm_parts(U, Hh, M, bs, eps, gram: Gram | None = None) -> np.ndarray:
    """The Gram solve for each column of bs [K, m] (one factorization): float64 [m, n, h], m edits
    dW [n, h] in one array (a combination of them is one product with it), whose sum is
    `solve_min_norm` of bs.sum(axis=1) (the solve is linear in its right-hand side); `gram` as in
    `_gram_solve`."""
    return min_norm_factors(U, Hh, M, bs, eps, gram).dense()


class Evaluation(NamedTuple):
    """Exact logits at the conditions for one weight, and the linearization there."""

    logits: np.ndarray   # float64 [K]
    U: np.ndarray        # float64 [K, n]


@dataclass(frozen=True)
class Iteration:
    """One Gauss-Newton round, scored exactly after shipping (the tensor's quantization)."""

    it: int
    conditions: int
    dw_rel: float              # ||dW_shipped|| / ||W||
    ship_rel: float            # ||dW_shipped - dW|| / ||dW|| (the round trip's share)
    linear_residual: dict      # kind -> max |<dW, u_k hh_k^T> - b_k| of the solve (before shipping)
    exact_err: dict            # kind -> max |exact change - target| after shipping
    mean_change: dict          # kind -> mean exact change
    moved: float               # max |exact logits - previous round's|
    seconds: dict              # linearize / solve / ship / rescore


@dataclass(frozen=True, eq=False)
class GaussNewton:
    w_new: np.ndarray          # float32 [n, h] the shipped weights' runtime view
    raw: np.ndarray            # uint8 the shipped tensor's bytes
    dW: np.ndarray             # float64 [n, h] shipped - original
    logits: np.ndarray         # float64 [K] exact logits at the conditions, last round
    base_logits: np.ndarray    # float64 [K]
    iterations: tuple[Iteration, ...]
    last_solve: MinNorm
    last_U: np.ndarray         # float64 [K, n] linearization the last solve used


def _by_kind(values, kind, fn) -> dict:
    return {KIND_NAMES[k]: float(fn(values[kind == k])) for k in range(len(KIND_NAMES)) if np.any(kind == k)}


def gauss_newton(w0, cond: Conditions, Hh, M, evaluate: Callable[[np.ndarray], Evaluation],
                 ship: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], *, iters: int, tol: float,
                 base: Evaluation | None = None, gram: Gram | None = None,
                 progress: Callable[[int, int], None] | None = None) -> GaussNewton:
    """`evaluate(w)` gives exact logits and vectors at weights w [n, h]; `ship(w)` gives (raw bytes,
    runtime view) of w after the tensor's quantization. Conditions ask for total changes from the
    base logits (`base`, else evaluate(w0)); each round solves the linearization at the shipped
    point. Stops after `iters` rounds, once no exact logit moved by `tol` in a round, or once a
    round's rms exact error is over twice the best round's and `tol` above it (diverging); returns the round of the
    least rms exact error (every round stays in `iterations`). `gram`: gram_parts(Hh, M) when the
    caller has it (else the first round computes it)."""
    w0 = np.asarray(w0, dtype=np.float64)
    Hh = np.asarray(Hh, dtype=np.float64)
    t0 = time.perf_counter()
    ev = base if base is not None else evaluate(w0.astype(np.float32))
    base = ev.logits
    if not np.all(np.isfinite(base)):
        raise WfldError("wfld", "conditions", "a condition's base logit is not finite")
    w_norm = float(np.linalg.norm(w0))
    dW_ship = np.zeros_like(w0)
    cur = base
    its: list[Iteration] = []
    raw = None
    w_new = w0.astype(np.float32)
    t_lin = time.perf_counter() - t0
    sol = None
    U_used = ev.U
    best = None                          # (rms exact error, the round's state): the round returned
    # the same for every round (only U is relinearized): the caller's, else the first round computes it
    for it in range(iters):
        t1 = time.perf_counter()
        gram = gram_parts(Hh, M) if gram is None else gram
        b = cond.target - (cur - base) + linear_change(dW_ship, ev.U, Hh)
        sol = solve_min_norm(ev.U, Hh, M, b, cond.eps, gram)
        U_used = ev.U
        t2 = time.perf_counter()
        raw, w_new = ship(w0 + sol.dW)
        new_ship = np.asarray(w_new, dtype=np.float64) - w0
        t3 = time.perf_counter()
        ev = evaluate(w_new)
        t4 = time.perf_counter()
        moved = float(np.max(np.abs(ev.logits - cur))) if cur.size else 0.0
        cur, dW_ship = ev.logits, new_ship
        err = np.abs((cur - base) - cond.target)
        dn = float(np.linalg.norm(sol.dW))
        its.append(Iteration(
            it=it + 1, conditions=cond.size, dw_rel=float(np.linalg.norm(dW_ship)) / w_norm,
            ship_rel=float(np.linalg.norm(dW_ship - sol.dW)) / dn if dn > 0 else 0.0,
            linear_residual=_by_kind(np.abs(sol.linear - b), cond.kind, np.max),
            exact_err=_by_kind(err, cond.kind, np.max), mean_change=_by_kind(cur - base, cond.kind, np.mean),
            moved=moved, seconds={"linearize": t_lin if it == 0 else 0.0, "solve": t2 - t1,
                                  "ship": t3 - t2, "rescore": t4 - t3}))
        if progress is not None:
            progress(it + 1, iters)
        score = float(np.sqrt(np.mean(err * err))) if err.size else 0.0
        if best is None or score <= best[0]:
            best = (score, w_new, raw, dW_ship, cur, sol, U_used)
        elif score > max(2.0 * best[0], best[0] + tol):
            break                        # diverging: the rounds after the best only moved away
        if moved < tol:
            break
    _, w_new, raw, dW_ship, cur, sol, U_used = best
    return GaussNewton(np.asarray(w_new, dtype=np.float32), raw, dW_ship, cur, base, tuple(its), sol, U_used)


def ftpo_targets(base_rej, base_alt, margins, delta_cho: float) -> tuple[np.ndarray, np.ndarray]:
    """Wanted logit changes at FTPO positions: (rejected [P], alternatives [P, k]).

    The rejected token should end `margin` below the best alternative, which itself rises by
    delta_cho with every alternative: d_rej = -max(0, gap + margin - delta_cho), gap = l_rej - max l_alt.
    NaN entries of base_alt (a position with fewer alternatives) are skipped; each row needs one.
    """
    base_rej = np.asarray(base_rej, dtype=np.float64)
    base_alt = np.asarray(base_alt, dtype=np.float64)
    if base_alt.size and np.any(np.all(np.isnan(base_alt), axis=1)):
        raise WfldError("wfld", "alternatives", "an FTPO position has no alternative")
    gap = base_rej - np.nanmax(base_alt, axis=1)
    d_rej = -np.maximum(0.0, gap + np.asarray(margins, dtype=np.float64) - delta_cho)
    return d_rej, np.full(base_alt.shape, float(delta_cho))


def condition_layout(tok) -> tuple[np.ndarray, np.ndarray]:
    """(slot, col) of every entry >= 0 of a token table tok [rows, width] (-1 pads), row-major."""
    slot, col = np.nonzero(np.asarray(tok) >= 0)
    return slot.astype(np.int64), col.astype(np.int64)


class Shipper:
    """The edited tensor as the engine will load it: `ship(w)` re-quantizes the rows of w [n, h]
    that differ from the original view (`quant.rounding.roundtrip.requantize_rows`: rows with no edit keep
    their original bytes, SPEC.md section 3) and returns (raw bytes, runtime view float32)."""

    def __init__(self, raw0: np.ndarray, type_name: str, cols: int, view: Callable):
        self.raw0 = np.array(raw0, dtype=np.uint8, copy=True)
        self.type_name, self.cols, self.view = type_name, int(cols), view
        self.w0 = np.asarray(view(self.raw0, type_name, cols), dtype=np.float32)

    def __call__(self, w) -> tuple[np.ndarray, np.ndarray]:
        from exactedit.quant.rounding.roundtrip import requantize_rows

        w32 = np.asarray(w, dtype=np.float32)
        if w32.shape != self.w0.shape:
            raise WfldError("ship", "w", f"expected {list(self.w0.shape)}, got {list(w32.shape)}")
        edited = np.flatnonzero(np.any(w32 != self.w0, axis=1))
        rt = requantize_rows(self.raw0, self.type_name, self.cols, edited, w32[edited])
        view = self.w0.copy()
        if edited.size:
            view[edited] = np.asarray(self.view(rt.raw[edited], self.type_name, self.cols), dtype=np.float32)
        return np.array(rt.raw), view
