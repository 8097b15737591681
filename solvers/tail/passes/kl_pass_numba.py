"""The KL pass's numba path: both activations against one head tile, two sgemms of one shape per
tile (identical rows in identically shaped products round identically, so a row without an edit
gives KL exactly 0; one sgemm over the rows stacked did not under OpenBLAS 0.3.31, whose kernels
round a row by its position), the two logits tiles folded into per-row running sums by a small kernel (`_fold_tile`, no fastmath):
    S = sum_v e^(l_v - m),  A = sum_v e^(l_v - m) d_v,  Cc = sum_v e^(l_v - m) expm1(-d_v),  d = l - l'
    KL = A / S + log1p(Cc / S),  LSE = m + log S,  LSE' = m + log(S + Cc)
with m the running max of the base logits (expm1 keeps small KLs exact). Same fields as the numpy
reference `kl_pass.kl_rows`, compared with it in tests/solvers/tail/test_kl_pass.py.
"""
from __future__ import annotations

import math
from typing import Callable

import numba
import numpy as np
from numba import prange

from exactedit.solvers.tail.forward.head_ref import apply_softcap
from exactedit.solvers.tail.passes.kl_pass import KlRows
from exactedit.solvers.tail.passes.vocab_pass import tile_size

__all__ = ["kl_rows_numba", "kl_rows_rank1"]

Progress = Callable[[int, int], None]


@numba.njit(parallel=True, cache=True)
def _fold_tile(lb, le, start, nxt, m, S, A, Cc, arg_b, best_b, arg_e, best_e, sel_b, sel_e):
    T, k = lb.shape
    for t in prange(T):
        tmax, targ = -np.inf, 0
        emax, earg = -np.inf, 0
        for j in range(k):
            if lb[t, j] > tmax:
                tmax, targ = lb[t, j], j
            if le[t, j] > emax:
                emax, earg = le[t, j], j
        if tmax > best_b[t]:
            best_b[t], arg_b[t] = tmax, start + targ
        if emax > best_e[t]:
            best_e[t], arg_e[t] = emax, start + earg
        new_m = max(m[t], np.float64(tmax))
        if new_m > m[t]:
            scale = math.exp(m[t] - new_m) if m[t] > -np.inf else 0.0
            S[t] *= scale
            A[t] *= scale
            Cc[t] *= scale
            m[t] = new_m
        mm = m[t]
        s, a, c = 0.0, 0.0, 0.0
        for j in range(k):
            lv = np.float64(lb[t, j])
            lp = np.float64(le[t, j])
            w = math.exp(lv - mm)
            d = lv - lp
            s += w
            a += w * d
            if -d > 1.0:
                c += math.exp(lp - mm) - w
            else:
                c += w * math.expm1(-d)
        S[t] += s
        A[t] += a
        Cc[t] += c
        y = nxt[t]
        if start <= y < start + k:
            sel_b[t] = lb[t, y - start]
            sel_e[t] = le[t, y - start]


def kl_rows_numba(mix_base, mix_edited, head, *, next_ids=None, softcap: float | None = None,
              tile_rows: int = 8192, progress: Progress | None = None) -> KlRows:
    """KL(base || edited), both LSEs, argmaxes and next-token log-probs for activations
    [T, n] (base and edited) over one head; one head tile read per step, two sgemms of one shape."""
    mb = np.ascontiguousarray(mix_base, dtype=np.float32)
    me = np.ascontiguousarray(mix_edited, dtype=np.float32)
    T, V = mb.shape[0], head.rows
    nxt = np.full(T, -1, np.int64) if next_ids is None else np.ascontiguousarray(next_ids, dtype=np.int64)
    m = np.full(T, -np.inf)
    S, A, Cc = np.zeros(T), np.zeros(T), np.zeros(T)
    arg_b, arg_e = np.zeros(T, np.int64), np.zeros(T, np.int64)
    best_b, best_e = np.full(T, -np.inf, np.float32), np.full(T, -np.inf, np.float32)
    sel_b, sel_e = np.full(T, np.nan, np.float32), np.full(T, np.nan, np.float32)
    step = tile_size(2 * T, tile_rows)
    for start in range(0, V, step):
        stop = min(start + step, V)
        w = head.read(start, stop).T
        lb, le = mb @ w, me @ w
        if softcap is not None:
            lb, le = apply_softcap(lb, softcap).astype(np.float32), apply_softcap(le, softcap).astype(np.float32)
        _fold_tile(lb, le, start, nxt, m, S, A, Cc, arg_b, best_b, arg_e, best_e, sel_b, sel_e)
        if progress is not None:
            progress(stop, V)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse_b = m + np.log(S)
        lse_e = m + np.log(S + Cc)
        kl = A / S + np.log1p(Cc / S)
    return KlRows(kl, arg_b, arg_e, lse_b, lse_e, sel_b - lse_b, sel_e - lse_e)


def kl_rows_rank1(mix_base, head, a, b, V_dirs, *, softcap: float | None = None, tile_rows: int = 8192
                  ) -> np.ndarray:
    """KL(base || edited_c) [T, C] for C edits whose pre-softcap logits are an affine function of
    the base's: z_c = a[:, c] * (H mix_base) + b[:, c] * (H V_dirs[:, c]) (an rmsnorm tail's
    residual moved along one direction per edit: the norm rescales the row by a, the direction
    adds b times its own logits). One head tile read per step, one sgemm for the base logits and
    one for the C directions; each edit folded as `kl_rows_numba` folds one."""
    mb = np.ascontiguousarray(mix_base, dtype=np.float32)
    dirs = np.ascontiguousarray(V_dirs, dtype=np.float32)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    T, C, V = mb.shape[0], dirs.shape[1], head.rows
    nxt = np.full(T, -1, np.int64)
    state = [(np.full(T, -np.inf), np.zeros(T), np.zeros(T), np.zeros(T), np.zeros(T, np.int64),
              np.full(T, -np.inf, np.float32), np.zeros(T, np.int64), np.full(T, -np.inf, np.float32),
              np.full(T, np.nan, np.float32), np.full(T, np.nan, np.float32)) for _ in range(C)]
    step = tile_size(2 * T, tile_rows)
    for start in range(0, V, step):
        stop = min(start + step, V)
        w = head.read(start, stop).T
        lb_raw = (mb @ w).astype(np.float64)
        vt = (dirs.T @ w).astype(np.float64)
        lb = lb_raw if softcap is None else apply_softcap(lb_raw, softcap)
        lb32 = np.ascontiguousarray(lb, dtype=np.float32)
        for c in range(C):
            le = a[:, c:c + 1] * lb_raw + b[:, c:c + 1] * vt[c][None, :]
            le = np.ascontiguousarray(le if softcap is None else apply_softcap(le, softcap), dtype=np.float32)
            m, S, A, Cc, arg_b, best_b, arg_e, best_e, sel_b, sel_e = state[c]
            _fold_tile(lb32, le, start, nxt, m, S, A, Cc, arg_b, best_b, arg_e, best_e, sel_b, sel_e)
    out = np.zeros((T, C))
    with np.errstate(divide="ignore", invalid="ignore"):
        for c, (m, S, A, Cc, *_) in enumerate(state):
            out[:, c] = A / S + np.log1p(Cc / S)
    return out
