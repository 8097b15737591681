"""Error-feedback rounding: the codes of a row that keep a quadratic form of its error small.

Given a row's wanted float values w (length h), fixed block scales (a `quant.rounding.grid.Grid`) and a
positive definite H (h x h), choose integer codes so that the shipped values x = step * code
make  f(x) = (x - w)^T H (x - w)  small, instead of rounding each value on its own. GPTQ's
recursion (optimal brain quantization in a fixed column order): walk q = 0 .. h-1, round the
current target t_q to the nearest code of step_q, and move the targets of the columns not yet
fixed to the continuous optimum of f given the fixed ones,

    t_j <- t_j - (t_q - x_q) S_qj / S_qq     (j > q),  S = (H restricted to columns >= q)^-1,

which is Babai's nearest-plane rounding. A direction v weighted into H (H = C + mu v v^T) is then
held to the lattice's resolution instead of to the rounding noise of every column. Clamping at
the code range breaks the recursion's guarantee, so a polish follows: single-code moves of +-1
that lower f, in sweeps.

H comes factored, H = diag(d) + F^T F (F: p x h, p << h: a ridge plus the background's and the
held directions' rows), which the fast path never multiplies out: by Woodbury S's entries are
    S_qj = -(z_q . f_j) / (d_q d_j)   (j > q),    S_qq = 1 / (d_q (1 + s_q)),
with f_j = F[:, j], z_q = P_q^-1 f_q / (1 + s_q), s_q = f_q . P_q^-1 f_q / d_q and
P_q = I + sum_{j > q} f_j f_j^T / d_j (p x p, built from the last column down by rank-1 Cholesky
updates, once per metric). A row's pending feedback is then one p-vector a (t_j = w_j + a.f_j/d_j,
a += beta_q z_q), so a row costs O(h p), and the p x p work is shared by every row and round.
The numpy reference multiplies H out and runs the textbook recursion with the Cholesky factor of
H^-1; the two agree code for code except where a corrected target lies within float64 noise of
a half step (tests/quant/test_feedback.py).

`ship_rows` scores candidates on f in float64 from the values their bytes dequantize to (ggml's
quantizer, the feedback rounding within ggml's scales, and per given scale source, such as the
tensor's original bytes, its nearest rounding and its feedback rounding) and keeps per row the
best: never worse in f than ggml's quantizer, nor than rounding within the same scales.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numba
import numpy as np
from numba import prange

from exactedit import quant
from exactedit.errors import QuantError
from exactedit.quant.rounding.grid import GRID_TYPES, Grid, grid_of, nearest, pack, values

POLISH_SWEEPS = 1
BLOCK = 128         # columns per block: across blocks the feedback is matrix products (BLAS)
TRI_BLOCK = 1024    # rows of a triangular factor per product in `times_ft`


@numba.njit(error_model="numpy", cache=True)
def _block_woodbury(T):
    """For T (B x B, symmetric positive definite): A with A[i+1:, i] = T_JJ^-1 T_Ji (J = i+1..),
    and W = R^-1 for the Cholesky factor R of T in reversed order (T^-1 = P W^T W P, P the
    reversal). Plain loops: B is small, and LAPACK's threads stall on tiny calls under load."""
    B = T.shape[0]
    R = np.zeros((B, B))           # Cholesky of T in reversed order: Tr = R R^T, Tr[a, b] = T[B-1-a, B-1-b]
    for j in range(B):
        acc = T[B - 1 - j, B - 1 - j]
        for k in range(j):
            acc -= R[j, k] * R[j, k]
        R[j, j] = np.sqrt(acc)
        for i in range(j + 1, B):
            acc = T[B - 1 - i, B - 1 - j]
            for k in range(j):
                acc -= R[i, k] * R[j, k]
            R[i, j] = acc / R[j, j]
    A = np.zeros((B, B))
    u = np.empty(B)
    for i in range(B - 1):
        m = B - 1 - i              # J = i+1 .. B-1 is the leading m of the reversed order
        for a in range(m):         # R_m u = T_Ji (reversed)
            acc = T[B - 1 - a, i]
            for k in range(a):
                acc -= R[a, k] * u[k]
            u[a] = acc / R[a, a]
        for a in range(m - 1, -1, -1):  # R_m^T v = u
            acc = u[a]
            for k in range(a + 1, m):
                acc -= R[k, a] * u[k]
            u[a] = acc / R[a, a]
        for a in range(m):
            A[B - 1 - a, i] = u[a]
    W = np.zeros((B, B))           # R^-1
    for j in range(B):
        W[j, j] = 1.0 / R[j, j]
        for i in range(j + 1, B):
            acc = 0.0
            for k in range(j, i):
                acc -= R[i, k] * W[k, j]
            W[i, j] = acc / R[i, i]
    return A, W


def upper(F) -> bool:
    """Whether F has no entry below its diagonal (F[r, j] = 0 for j < r; one row or more, at most
    as many as columns): a QR's R or a Cholesky factor, whose column j is zero below row j."""
    return 0 < F.shape[0] <= F.shape[1] and not np.any(np.tril(F, -1))


def times_ft(x, F, tri: bool) -> np.ndarray:
    """x @ F.T; with `tri` (F upper, `upper`) by row blocks of F that skip the zeros left of its
    diagonal: about half the flops of the full product, the same sums less exact zero terms."""
    if not tri:
        return x @ F.T
    p = F.shape[0]
    y = np.empty((x.shape[0], p))
    for r0 in range(0, p, TRI_BLOCK):
        r1 = min(p, r0 + TRI_BLOCK)
        y[:, r0:r1] = x[:, r0:] @ F[r0:r1, r0:].T
    return y


def _plan(F, d, block: int, tri: bool = False):
    """Z[q] = z_q and c[q] = S_qq of the module docstring, a block of columns at a time from the
    last one down. Q = P^-1 of the columns after the block is kept explicitly; inside the block
    (local columns i, their V = F[:, block] / sqrt(d), X = Q V, T = I + V^T X), Woodbury over the
    block's later columns J = i+1.. gives P_{q+1}^-1 f_q = sqrt(d_q) (X_i - X_J T_JJ^-1 T_Ji), the
    T_JJ being leading blocks of one Cholesky of T in reversed order. Then Q -= X T^-1 X^T
    (as N N^T, N = X P R^-T, so Q stays symmetric). With `tri` (F upper) the block's columns have
    no entries below row q1 (q1 <= p), and the products skip those rows; then only Q's first q0
    columns are read again, and only they are updated, in place (Q column-major: a p x p
    temporary per block was most of the plan's time)."""
    from scipy.linalg.blas import dgemm

    p, h = F.shape
    Z = np.zeros((h, p))
    c = np.zeros(h)
    Q = np.asfortranarray(np.eye(p)) if tri else np.eye(p)
    for q1 in range(h, 0, -block):
        q0 = max(0, q1 - block)
        B = q1 - q0
        k = min(p, q1) if tri else p               # F[k:, q0:q1] is zero
        sd = np.sqrt(d[q0:q1])
        V = F[:k, q0:q1] / sd
        X = Q[:, :k] @ V
        T = np.eye(B) + V.T @ X[:k]
        A, W = _block_woodbury(np.ascontiguousarray((T + T.T) / 2))
        Y = (X - X @ A) * sd                       # column i: P_{q+1}^-1 f_q
        s = np.einsum("pi,pi->i", F[:k, q0:q1], Y[:k]) / d[q0:q1]
        Z[q0:q1] = (Y / (1.0 + s)).T
        c[q0:q1] = 1.0 / (d[q0:q1] * (1.0 + s))
        N = X[:, ::-1] @ W.T                       # X T^-1 X^T = N N^T
        if not tri:
            Q -= N @ N.T
        elif q0:                                   # only the columns of Q a later block reads
            out = dgemm(-1.0, N, N[:q0], beta=1.0, c=Q[:, :q0], trans_b=True, overwrite_c=True)
            if not np.shares_memory(out, Q):
                Q[:, :q0] = out
    return Z, c


class Metric:
    """H = diag(d) + F^T F, with the shared part of the recursion planned once (the object is
    the cache: reuse it for every row and round). d float [h] > 0, F float [p, h]; a p larger
    than h is folded to an h x h factor first (F^T F = R^T R). An upper F (`upper`: R, or a
    Cholesky factor) is used as one: every product with it skips the zeros below its diagonal
    (`tri`, `top`); `general=True` uses it as a general factor all the same (the baseline
    `exactedit bench ship` measures against)."""

    def __init__(self, d, F, *, general: bool = False):
        d = np.asarray(d, dtype=np.float64)
        F = np.asarray(F, dtype=np.float64)
        if d.ndim != 1 or d.size == 0:
            raise QuantError(f"d: expected a non-empty 1-D diagonal, got shape {d.shape}")
        if F.ndim != 2 or F.shape[1] != d.size:
            raise QuantError(f"F: expected [p, {d.size}] factor rows, got shape {F.shape}")
        if not (np.all(np.isfinite(d)) and np.all(np.isfinite(F))):
            raise QuantError("H: d or F has non-finite entries")
        if not np.all(d > 0):
            raise QuantError("H: the diagonal d must be > 0 (a ridge: the background metric has one)")
        if F.shape[0] > F.shape[1]:
            F = np.linalg.qr(F, mode="r")
        self.d, self.F = d, np.ascontiguousarray(F)
        self.tri = not general and upper(self.F)
        self.hdiag = d + np.einsum("pk,pk->k", self.F, self.F)
        self.Z, self.c = _plan(self.F, self.d, BLOCK, self.tri)
        # per block: the rows of F that can be non-zero in its columns (`top`), the in-block
        # couplings K[l, i] = z_l . f_i / d_i (feedback) and G = F^T F (polish)
        p = self.F.shape[0]
        self.top = [min(p, q0 + BLOCK) if self.tri else p for q0 in range(0, d.size, BLOCK)]
        self.K = [(self.Z[q0:q0 + BLOCK, :k] @ self.F[:k, q0:q0 + BLOCK]) / self.d[q0:q0 + BLOCK]
                  for k, q0 in zip(self.top, range(0, d.size, BLOCK))]
        self.G = [self.F[:k, q0:q0 + BLOCK].T @ self.F[:k, q0:q0 + BLOCK]
                  for k, q0 in zip(self.top, range(0, d.size, BLOCK))]

    @classmethod
    def dense(cls, H) -> "Metric":
        """A metric from a dense symmetric positive definite H (its Cholesky factor as F)."""
        H = np.asarray(H, dtype=np.float64)
        if H.ndim != 2 or H.shape[0] != H.shape[1] or H.shape[0] == 0:
            raise QuantError(f"H: expected a square [h, h] matrix, got shape {H.shape}")
        if not np.all(np.isfinite(H)):
            raise QuantError("H: has non-finite entries")
        if not np.allclose(H, H.T, rtol=0, atol=1e-12 * float(np.max(np.abs(H)))):
            raise QuantError("H: not symmetric")
        eps = 1e-9 * float(np.mean(np.diag(H)))
        try:
            L = np.linalg.cholesky((H + H.T) / 2 - eps * np.eye(H.shape[0]))
        except np.linalg.LinAlgError:
            raise QuantError("H: not positive definite (add a ridge: the background metric has one)") from None
        return cls(np.full(H.shape[0], eps), L.T)

    @property
    def h(self) -> int:
        return int(self.d.size)

    @property
    def H(self) -> np.ndarray:
        """H multiplied out (h x h): for references and small h only."""
        return np.diag(self.d) + self.F.T @ self.F

    def objective(self, err) -> np.ndarray:
        """f per row: e^T H e for err float64 [rows, h] (inf or NaN where err is not finite)."""
        err = np.asarray(err, dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            y = times_ft(err, self.F, self.tri)
            return np.einsum("rk,rk->r", y, y) + (err * err) @ self.d


# ---- numpy reference -----------------------------------------------------------------------------

def _value(step, code) -> float:
    """The dequantized value of one code: float32(step * code), 0 for a zero or non-finite step."""
    if not (np.isfinite(step) and step != 0):
        return 0.0
    return float(np.float32(step) * np.float32(code))


def _code(t, step, lo, hi) -> int:
    if not (np.isfinite(step) and step != 0):
        return 0
    return int(min(max(np.rint(t / step), lo), hi))


def feedback_ref(target, grid: Grid, metric: Metric) -> np.ndarray:
    """int16 codes [rows, h]: the recursion of the module docstring with H multiplied out and the
    upper Cholesky factor U of H^-1 (t_j -= (t_q - x_q) U_qj / U_qq), one row at a time."""
    target = np.asarray(target, dtype=np.float64)
    U = np.linalg.cholesky(np.linalg.inv(metric.H)).T     # H^-1 = U^T U
    rows, h = target.shape
    codes = np.zeros((rows, h), np.int16)
    for r in range(rows):
        t = target[r].copy()
        for q in range(h):
            s = float(grid.steps[r, q])
            codes[r, q] = _code(t[q], s, grid.lo, grid.hi)
            t[q + 1:] -= (t[q] - _value(s, codes[r, q])) / U[q, q] * U[q, q + 1:]
    return codes


def polish_ref(target, grid: Grid, metric: Metric, codes, sweeps: int = POLISH_SWEEPS) -> np.ndarray:
    """Single-code moves of +-1 that lower f, column by column, for `sweeps` sweeps (or until a
    sweep moves nothing); of the two moves the one lowering f more."""
    target = np.asarray(target, dtype=np.float64)
    codes = np.array(codes, dtype=np.int16, copy=True)
    H = metric.H
    for r in range(codes.shape[0]):
        x = np.array([_value(s, c) for s, c in zip(grid.steps[r], codes[r])])
        g = H @ (x - target[r])
        for _ in range(sweeps):
            moved = False
            for k in range(codes.shape[1]):
                s = grid.steps[r, k]
                if not (np.isfinite(s) and s != 0):
                    continue
                best, move = 0.0, 0
                for dc in (-1, 1):
                    if grid.lo <= int(codes[r, k]) + dc <= grid.hi:
                        dx = _value(s, int(codes[r, k]) + dc) - x[k]
                        delta = 2.0 * dx * g[k] + dx * dx * H[k, k]
                        if delta < best and delta < -1e-9 * dx * dx * H[k, k]:
                            best, move = delta, dc
                if move:
                    dx = _value(s, int(codes[r, k]) + move) - x[k]
                    codes[r, k] += move
                    x[k] += dx
                    g += dx * H[k]
                    moved = True
            if not moved:
                break
    return codes


# ---- numba fast path -----------------------------------------------------------------------------

@numba.njit(error_model="numpy", cache=True)
def _code_value(s, c):
    if not (np.isfinite(s) and s != 0):
        return 0.0
    return np.float64(np.float32(s) * np.float32(c))


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _feedback_block(t0, steps, lo, hi, K, c, d, codes, beta):
    """One block of columns for every row: t0 [rows, B] the targets with the earlier blocks'
    feedback in; writes codes [rows, B] and beta [rows, B] (the feedback weights)."""
    for r in prange(t0.shape[0]):
        for i in range(t0.shape[1]):
            t = t0[r, i]
            for l in range(i):
                t += beta[r, l] * K[l, i]
            s = steps[r, i]
            code = 0
            if np.isfinite(s) and s != 0:
                code = np.int64(min(max(np.rint(t / np.float64(s)), np.float64(lo)), np.float64(hi)))
            codes[r, i] = code
            beta[r, i] = (t - _code_value(s, code)) / (c[i] * d[i])


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _polish_block(g0, codes, err, steps, lo, hi, G, hdiag, dx_out):
    """One block of a polish sweep: g0 [rows, B] the gradient (H e) at the block's start; moves
    inside the block correct it through G = F_b^T F_b and d. Returns the moves made."""
    moves = 0
    for r in prange(g0.shape[0]):
        for k in range(g0.shape[1]):
            dx_out[r, k] = 0.0
            s = steps[r, k]
            if not (np.isfinite(s) and s != 0):
                continue
            gk = g0[r, k]
            for m in range(k):
                gk += dx_out[r, m] * G[m, k]
            x = _code_value(s, codes[r, k])
            best, move, best_dx = 0.0, 0, 0.0
            for dc in (-1, 1):
                c2 = codes[r, k] + dc
                if c2 < lo or c2 > hi:
                    continue
                dx = _code_value(s, c2) - x
                delta = 2.0 * dx * gk + dx * dx * hdiag[k]
                if delta < best and delta < -1e-9 * dx * dx * hdiag[k]:
                    best, move, best_dx = delta, dc, dx
            if move != 0:
                codes[r, k] += move
                err[r, k] += best_dx
                dx_out[r, k] = best_dx
                moves += 1
    return moves


def feedback(target, grid: Grid, metric: Metric) -> np.ndarray:
    """Fast path of `feedback_ref`: int16 codes [rows, h]. Per block: the earlier blocks'
    feedback as one product (a [rows, p] pending per row), the block itself in numba."""
    target = np.ascontiguousarray(target, dtype=np.float64)
    rows, h = target.shape
    codes = np.zeros((rows, h), np.int64)
    a = np.zeros((rows, metric.F.shape[0]))
    steps = np.ascontiguousarray(grid.steps, dtype=np.float32)
    for b, q0 in enumerate(range(0, h, BLOCK)):
        q1 = min(h, q0 + BLOCK)
        k = metric.top[b]
        t0 = target[:, q0:q1] + (a[:, :k] @ metric.F[:k, q0:q1]) / metric.d[q0:q1]
        beta = np.zeros((rows, q1 - q0))
        blk = np.zeros((rows, q1 - q0), np.int64)
        _feedback_block(np.ascontiguousarray(t0), np.ascontiguousarray(steps[:, q0:q1]), grid.lo, grid.hi,
                        metric.K[b], metric.c[q0:q1], metric.d[q0:q1], blk, beta)
        codes[:, q0:q1] = blk
        a += beta @ metric.Z[q0:q1]
    return codes.astype(np.int16)


def polish(target, grid: Grid, metric: Metric, codes, sweeps: int = POLISH_SWEEPS) -> np.ndarray:
    """Fast path of `polish_ref` (the same moves: within a block the gradient is corrected for
    the block's earlier moves exactly; y = F e carries them to later blocks)."""
    target = np.ascontiguousarray(target, dtype=np.float64)
    rows, h = target.shape
    c = np.array(codes, dtype=np.int64, copy=True)
    steps = np.ascontiguousarray(grid.steps, dtype=np.float32)
    live = np.isfinite(steps) & (steps != 0)
    err = np.where(live, values(grid, c), 0).astype(np.float64) - target
    y = times_ft(err, metric.F, metric.tri)
    for _ in range(sweeps):
        moved = 0
        for b, q0 in enumerate(range(0, h, BLOCK)):
            q1, k = min(h, q0 + BLOCK), metric.top[b]
            g0 = metric.d[q0:q1] * err[:, q0:q1] + y[:, :k] @ metric.F[:k, q0:q1]
            cb, eb = np.ascontiguousarray(c[:, q0:q1]), np.ascontiguousarray(err[:, q0:q1])
            dx = np.zeros((rows, q1 - q0))
            moved += _polish_block(np.ascontiguousarray(g0), cb, eb, np.ascontiguousarray(steps[:, q0:q1]),
                                   grid.lo, grid.hi, metric.G[b], metric.hdiag[q0:q1], dx)
            c[:, q0:q1], err[:, q0:q1] = cb, eb
            y[:, :k] += dx @ metric.F[:k, q0:q1].T
        if not moved:
            break
    return c.astype(np.int16)


# ---- shipping: candidates, scored, best per row ----------------------------------------------------

@dataclass(frozen=True, eq=False)
class FeedbackShip:
    """Rows as shipped: per row the candidate with the least f. Arrays are read-only."""

    raw: np.ndarray                  # uint8 [rows, row_bytes]
    values: np.ndarray               # float32 [rows, h]: what the bytes dequantize to
    objective: np.ndarray            # float64 [rows]: f of the shipped rows
    candidates: tuple[str, ...]      # "ggml", "ggml:feedback", then "<source>:nearest", "<source>:feedback"
    candidate_objective: np.ndarray  # float64 [rows, len(candidates)] (inf: the source's scales are not finite)
    choice: np.ndarray               # int64 [rows]: index into candidates

    def chosen(self) -> dict[str, int]:
        """How many rows each candidate won."""
        return {name: int(np.sum(self.choice == i)) for i, name in enumerate(self.candidates)}


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def ship_rows(target, qtype: str, metric: Metric, sources: Mapping[str, np.ndarray], *,
              sweeps: int = POLISH_SWEEPS, progress: Callable[[int, int], None] | None = None) -> FeedbackShip:
    """Choose the shipped bytes of rows whose wanted values are `target` (float [rows, h]).

    `sources`: name -> uint8 [rows, row_bytes] bytes whose block scales are kept (e.g. the
    tensor's original bytes of those rows, whose grid holds the unedited weights exactly).
    Candidates: ggml's quantizer of float32(target) and the feedback (+ polish) codes within its
    scales; per source its nearest-code and its feedback (+ polish) codes. f is computed from the
    dequantized values in float64; ties keep the earlier candidate (ggml's first)."""
    if qtype not in GRID_TYPES:
        raise QuantError(f"qtype {qtype!r}: feedback shipping works on the symmetric grids {GRID_TYPES}")
    target = np.ascontiguousarray(target, dtype=np.float64)
    if target.ndim != 2 or target.shape[1] != metric.h:
        raise QuantError(f"target: expected [rows, {metric.h}] (the metric's size), got {target.shape}")
    if not np.all(np.isfinite(target)):
        raise QuantError("target: has non-finite values")
    if "ggml" in sources:
        raise QuantError("sources: the name 'ggml' is taken by ggml's own quantizer of the target")
    cols = target.shape[1]
    ggml = quant.quantize(target.astype(np.float32), qtype)
    raws, names = [ggml], ["ggml"]
    total = 2 + 2 * len(sources)
    # ggml's final codes are nearest rounding within its scales already: only its feedback is new
    for name, src, near in [("ggml", ggml, False)] + [(n, s, True) for n, s in sources.items()]:
        grid = grid_of(src, qtype, cols)
        if grid.steps.shape != target.shape:
            raise QuantError(f"sources[{name!r}]: {grid.steps.shape[0]} rows for {target.shape[0]} target rows")
        if near:
            raws.append(pack(grid, nearest(grid, target)))
            names.append(f"{name}:nearest")
        raws.append(pack(grid, polish(target, grid, metric, feedback(target, grid, metric), sweeps)))
        names.append(f"{name}:feedback")
        if progress is not None:
            progress(len(raws), total)
    objs = np.empty((target.shape[0], len(raws)))
    raw, shipped = None, None
    for i, cand in enumerate(raws):
        v = quant.dequantize(cand, qtype, cols)
        finite = np.all(np.isfinite(v), axis=1)
        objs[:, i] = metric.objective(np.where(finite[:, None], v, 0).astype(np.float64) - target)
        objs[~finite | ~np.isfinite(objs[:, i]), i] = np.inf
        if i == 0:
            raw, shipped = cand.copy(), v
            continue
        better = objs[:, i] < np.min(objs[:, :i], axis=1)
        raw[better], shipped[better] = cand[better], v[better]
    choice = np.argmin(objs, axis=1)  # the first of equal minima, as the selection above
    rows = np.arange(target.shape[0])
    return FeedbackShip(_readonly(raw), _readonly(shipped), _readonly(objs[rows, choice].copy()),
                        tuple(names), _readonly(objs), _readonly(choice.astype(np.int64)))
