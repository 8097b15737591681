"""Error-feedback rounding: the codes of a row that keep a quadratic form of its error small.

Given a row's wanted float values w (length h), fixed block scales (a `quant.grid.Grid`) and a
positive definite H (h x h), choose integer codes q so that the shipped values x = step * q
make  f(x) = (x - w)^T H (x - w)  small, instead of rounding each value on its own. With the
upper Cholesky factor R (H = R^T R), f = sum_k (R_kk e_k + sum_{j>k} R_kj e_j)^2, e = x - w, so
walking k from the last column to the first and rounding the feedback-corrected target

    t_k = w_k - (sum_{j>k} R_kj e_j) / R_kk          (e_j of the columns already fixed)

to the nearest code of step_k zeroes row k's term up to one rounding (Babai's nearest plane;
GPTQ's update is the same recursion written with the Cholesky factor of H^-1). A directional
condition v^T e = 0 weighted into H (H = C + mu v v^T) is then met to the lattice's resolution
on the few columns processed last, instead of to the full rounding noise of every column.
Clamping at the code range breaks the recursion's guarantee, so a polish follows: single-code
moves of +-1 that lower f, in sweeps, with the gradient H e kept up to date.

`ship_rows` takes the candidates (ggml's own quantizer of w and the feedback rounding within its
scales, searched for w; for each given scale source, such as the tensor's original bytes, its
nearest-code rounding and its feedback rounding), scores each on f in float64 from the values
the bytes dequantize to, and keeps per row the best: never worse in f than ggml's quantizer or
than rounding within the same scales. Fast path: the recursion in column blocks, the blocks'
feedback onto earlier columns as one matrix product (BLAS), a numba kernel inside each block
(rows in parallel); reference: the recursion one row at a time in numpy. They sum in different
orders, so they agree code for code except where a corrected target lies within float64 noise
of a half step (tests/quant/test_feedback.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numba
import numpy as np
from numba import prange

from exactedit import quant
from exactedit.quant.errors import QuantError
from exactedit.quant.grid import Grid, grid_of, nearest, pack, values

BLOCK_COLS = 128
POLISH_SWEEPS = 2


class Metric:
    """H (float64 h x h, symmetric positive definite) and its upper Cholesky factor R, H = R^T R.
    Built once by the caller and reused for every row and round (the object is the cache)."""

    def __init__(self, H):
        H = np.asarray(H, dtype=np.float64)
        if H.ndim != 2 or H.shape[0] != H.shape[1] or H.shape[0] == 0:
            raise QuantError(f"H: expected a square [h, h] matrix, got shape {H.shape}")
        if not np.all(np.isfinite(H)):
            raise QuantError("H: has non-finite entries")
        scale = float(np.max(np.abs(H)))
        if not np.allclose(H, H.T, rtol=0, atol=1e-12 * scale):
            raise QuantError("H: not symmetric")
        H = (H + H.T) / 2
        try:
            L = np.linalg.cholesky(H)
        except np.linalg.LinAlgError:
            raise QuantError("H: not positive definite (add a ridge: the background metric has one)") from None
        self.H = H
        self.R = np.ascontiguousarray(L.T)
        self.diag = np.ascontiguousarray(np.diag(H))

    @property
    def h(self) -> int:
        return int(self.H.shape[0])

    def objective(self, err) -> np.ndarray:
        """f per row: e^T H e for err float64 [rows, h] (inf or NaN where err is not finite)."""
        err = np.asarray(err, dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            return np.einsum("rk,rk->r", err @ self.H, err)


# ---- numpy reference -----------------------------------------------------------------------------

def _value(step, code) -> float:
    """The dequantized value of one code: float32(step * code), 0 for a zero or non-finite step."""
    if not (np.isfinite(step) and step != 0):
        return 0.0
    return float(np.float32(step) * np.float32(code))


def feedback_ref(target, grid: Grid, metric: Metric) -> np.ndarray:
    """int16 codes [rows, h]: the feedback recursion of the module docstring, one row at a time."""
    target = np.asarray(target, dtype=np.float64)
    R = metric.R
    rows, h = target.shape
    codes = np.zeros((rows, h), np.int16)
    for r in range(rows):
        e = np.zeros(h)
        for k in range(h - 1, -1, -1):
            s = float(grid.steps[r, k])
            t = target[r, k] - float(R[k, k + 1:] @ e[k + 1:]) / R[k, k]
            c = 0
            if np.isfinite(s) and s != 0:
                c = int(min(max(np.rint(t / s), grid.lo), grid.hi))
            codes[r, k] = c
            e[k] = _value(s, c) - target[r, k]
    return codes


def polish_ref(target, grid: Grid, metric: Metric, codes, sweeps: int = POLISH_SWEEPS) -> np.ndarray:
    """Single-code moves of +-1 that lower f, column by column, for `sweeps` sweeps (or until a
    sweep moves nothing)."""
    target = np.asarray(target, dtype=np.float64)
    codes = np.array(codes, dtype=np.int16, copy=True)
    H = metric.H
    for r in range(codes.shape[0]):
        x = np.array([_value(s, c) for s, c in zip(grid.steps[r], codes[r])])
        g = H @ (x - target[r])
        for _ in range(sweeps):
            moved = False
            for k in range(codes.shape[1]):
                best, move = 0.0, 0
                for dc in (-1, 1):
                    c2 = int(codes[r, k]) + dc
                    if grid.lo <= c2 <= grid.hi and np.isfinite(grid.steps[r, k]) and grid.steps[r, k] != 0:
                        dx = _value(grid.steps[r, k], c2) - x[k]
                        delta = 2.0 * dx * g[k] + dx * dx * H[k, k]
                        if delta < best and delta < -1e-9 * dx * dx * H[k, k]:
                            best, move = delta, dc
                if move:
                    c2 = int(codes[r, k]) + move
                    dx = _value(grid.steps[r, k], c2) - x[k]
                    codes[r, k], x[k] = c2, x[k] + dx
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
def _feedback_block(target, steps, lo, hi, R, acc, codes, err, b0, b1):
    """Columns b1-1 .. b0 of every row; acc[r, k] already holds the feedback of columns >= b1."""
    for r in prange(target.shape[0]):
        for k in range(b1 - 1, b0 - 1, -1):
            a = acc[r, k]
            for j in range(k + 1, b1):
                a += R[k, j] * err[r, j]
            s = steps[r, k]
            c = 0
            if np.isfinite(s) and s != 0:
                t = target[r, k] - a / R[k, k]
                c = np.int64(min(max(np.rint(t / np.float64(s)), np.float64(lo)), np.float64(hi)))
            codes[r, k] = c
            err[r, k] = _code_value(s, c) - target[r, k]


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _polish_rows(codes, err, g, steps, lo, hi, H, sweeps):
    for r in prange(codes.shape[0]):
        for _ in range(sweeps):
            moved = False
            for k in range(codes.shape[1]):
                s = steps[r, k]
                if not (np.isfinite(s) and s != 0):
                    continue
                x = _code_value(s, codes[r, k])
                best, move, best_dx = 0.0, 0, 0.0
                for dc in (-1, 1):
                    c2 = codes[r, k] + dc
                    if c2 < lo or c2 > hi:
                        continue
                    dx = _code_value(s, c2) - x
                    delta = 2.0 * dx * g[r, k] + dx * dx * H[k, k]
                    if delta < best and delta < -1e-9 * dx * dx * H[k, k]:
                        best, move, best_dx = delta, dc, dx
                if move != 0:
                    codes[r, k] += move
                    err[r, k] += best_dx
                    for j in range(H.shape[0]):
                        g[r, j] += best_dx * H[k, j]
                    moved = True
            if not moved:
                break


def feedback(target, grid: Grid, metric: Metric, block: int = BLOCK_COLS) -> np.ndarray:
    """Fast path of `feedback_ref`: int16 codes [rows, h]."""
    target = np.ascontiguousarray(target, dtype=np.float64)
    rows, h = target.shape
    R = metric.R
    acc = np.zeros((rows, h))
    codes = np.zeros((rows, h), np.int64)
    err = np.zeros((rows, h))
    steps = np.ascontiguousarray(grid.steps, dtype=np.float32)
    for b1 in range(h, 0, -block):
        b0 = max(0, b1 - block)
        _feedback_block(target, steps, grid.lo, grid.hi, R, acc, codes, err, b0, b1)
        if b0:
            acc[:, :b0] += err[:, b0:b1] @ R[:b0, b0:b1].T
    return codes.astype(np.int16)


def polish(target, grid: Grid, metric: Metric, codes, sweeps: int = POLISH_SWEEPS) -> np.ndarray:
    """Fast path of `polish_ref`."""
    target = np.ascontiguousarray(target, dtype=np.float64)
    c = np.array(codes, dtype=np.int64, copy=True)
    live = np.isfinite(grid.steps) & (grid.steps != 0)
    err = np.where(live, values(grid, c), 0).astype(np.float64) - target
    g = err @ metric.H
    _polish_rows(c, err, g, np.ascontiguousarray(grid.steps), grid.lo, grid.hi, metric.H, sweeps)
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
              sweeps: int = POLISH_SWEEPS, block: int = BLOCK_COLS,
              progress: Callable[[int, int], None] | None = None) -> FeedbackShip:
    """Choose the shipped bytes of rows whose wanted values are `target` (float [rows, h]).

    `sources`: name -> uint8 [rows, row_bytes] bytes whose block scales are kept (e.g. the
    tensor's original bytes of those rows, whose grid holds the unedited weights exactly).
    Candidates: ggml's quantizer of float32(target), and per source its nearest-code and its
    feedback (+ polish) codes. f is computed from the dequantized values in float64; ties keep
    the earlier candidate (ggml's first)."""
    target = np.ascontiguousarray(target, dtype=np.float64)
    if target.ndim != 2 or target.shape[1] != metric.h:
        raise QuantError(f"target: expected [rows, {metric.h}] (the metric's size), got {target.shape}")
    if not np.all(np.isfinite(target)):
        raise QuantError("target: has non-finite values")
    cols = target.shape[1]
    ggml = quant.quantize(target.astype(np.float32), qtype)
    raws, names = [ggml], ["ggml"]
    total = 2 + 2 * len(sources)
    if "ggml" in sources:
        raise QuantError("sources: the name 'ggml' is taken by ggml's own quantizer of the target")
    # ggml's final codes are nearest rounding within its scales already: only its feedback is new
    for name, src, near in [("ggml", ggml, False)] + [(n, s, True) for n, s in sources.items()]:
        grid = grid_of(src, qtype, cols)
        if grid.steps.shape != target.shape:
            raise QuantError(f"sources[{name!r}]: {grid.steps.shape[0]} rows for {target.shape[0]} target rows")
        if near:
            raws.append(pack(grid, nearest(grid, target)))
            names.append(f"{name}:nearest")
        raws.append(pack(grid, polish(target, grid, metric, feedback(target, grid, metric, block), sweeps)))
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
