"""The KL pass: KL(base || edited) per row over the full vocabulary, in one streaming pass over
the head, never holding a [T, V] logits array. Three implementations, side by side:

| implementation | module | heads | arithmetic |
|---|---|---|---|
| `kl_rows` (reference) | this module | base and edited head (any two RowSources) | numpy, float64 folds |
| `kl_rows_numba` | kl_pass_numba.py | one head, two activations | two sgemms of one shape per tile, numba fold |
| `kl_pass_jax` | kl_pass_jax.py | one head on a JAX device, two activations | device tiles, float64 host fold |

Per row t, with p = softmax(base logits) and q = softmax(edited logits), d = l - l':
    KL(p || q) = E_p[d] + LSE' - LSE = E_p[d] + log1p(E_p[expm1(-d)])
The second form is what all three accumulate: rows where nothing changed give exactly 0, and small
KLs keep their digits instead of cancelling two LSEs of size ~10. tests/solvers/tail/test_kl_pass.py
holds one table comparing them (tolerances and reasons in the table); evals.kl.stats turns the rows into
llama.cpp-style statistics.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from exactedit.solvers.tail.forward.head_fast import Matmul, Sgemm
from exactedit.solvers.tail.forward.head_ref import apply_softcap
from exactedit.solvers.tail.passes.vocab_pass import RowSource, lse_finish, lse_init, lse_update, tile_size

__all__ = ["KlRows", "kl_rows"]

Progress = Callable[[int, int], None]


class KlRows(NamedTuple):
    """Per-row results of one pass over base and edited heads (T rows)."""

    kl: np.ndarray            # float64 [T]  KL(base || edited)
    argmax_base: np.ndarray   # int64 [T]
    argmax_edited: np.ndarray
    lse_base: np.ndarray      # float64 [T]
    lse_edited: np.ndarray
    logp_next_base: np.ndarray    # float64 [T], nan where the next token is unknown
    logp_next_edited: np.ndarray


def _argmax_update(arg, best, tile, start):
    t_arg = tile.argmax(axis=1)
    t_max = tile[np.arange(tile.shape[0]), t_arg]
    better = t_max > best
    return np.where(better, t_arg + start, arg), np.where(better, t_max, best), t_max


def kl_rows(mix_base, head_base: RowSource, mix_edited, head_edited: RowSource, *,
            next_ids=None, softcap: float | None = None, tile_rows: int = 8192,
            matmul: Matmul | None = None, progress: Progress | None = None) -> KlRows:
    """KL(base || edited) and friends for activations mix_base / mix_edited [T, n] over two
    heads of the same shape. Tiles whose stored bytes and activations are identical in both
    models are computed once (their logits are then equal, so they add exactly 0)."""
    if (head_base.rows, head_base.cols) != (head_edited.rows, head_edited.cols):
        raise ValueError(f"heads differ in shape: {head_base.rows}x{head_base.cols} vs "
                         f"{head_edited.rows}x{head_edited.cols}")
    matmul = Sgemm() if matmul is None else matmul
    mb, me = np.asarray(mix_base), np.asarray(mix_edited)
    same_mix = mb.shape == me.shape and np.array_equal(mb, me)
    pb, pe = matmul.prepare(mb), (None if same_mix else matmul.prepare(me))
    T, V = mb.shape[0], head_base.rows
    nxt = np.full(T, -1, np.int64) if next_ids is None else np.asarray(next_ids, np.int64)
    sb, se = lse_init(T), lse_init(T)
    m = np.full(T, -np.inf)          # running max of base logits, scale of A and C
    A, C = np.zeros(T), np.zeros(T)  # sum e^(l - m) d,  sum e^(l - m) expm1(-d)
    arg_b = np.zeros(T, np.int64); best_b = np.full(T, -np.inf, np.float32)
    arg_e = np.zeros(T, np.int64); best_e = np.full(T, -np.inf, np.float32)
    sel_b, sel_e = np.full(T, np.nan, np.float32), np.full(T, np.nan, np.float32)
    step = tile_size(2 * T, tile_rows)  # two logits tiles and float64 temporaries per tile
    for start in range(0, V, step):
        stop = min(start + step, V)
        lb = apply_softcap(matmul.tile(pb, head_base, start, stop), softcap)
        same = same_mix and head_base.tile_key(start, stop) == head_edited.tile_key(start, stop)
        le = lb if same else apply_softcap(
            matmul.tile(pe if pe is not None else pb, head_edited, start, stop), softcap)
        arg_b, best_b, tb = _argmax_update(arg_b, best_b, lb, start)
        arg_e, best_e, te = _argmax_update(arg_e, best_e, le, start)
        sb = lse_update(sb, lb, tb)
        se = lse_update(se, le, te)
        tb64 = tb.astype(np.float64)
        m_new = np.maximum(m, tb64)
        safe = np.where(np.isfinite(m_new), m_new, 0.0)
        keep = np.where(np.isfinite(m), np.exp(m - safe), 0.0)
        A, C, m = A * keep, C * keep, m_new
        if not same:
            shift = np.where(np.isfinite(tb), tb, 0).astype(lb.dtype)
            w = np.exp(lb - shift[:, None]).astype(np.float64)
            le64 = le.astype(np.float64)
            d = lb.astype(np.float64) - le64
            big = -d > 1.0  # expm1 only where it cannot overflow; elsewhere e^(l'-t) - e^(l-t)
            up = np.where(big, le64 - shift[:, None], 0.0)
            cterm = np.where(big, np.exp(up) - w, w * np.expm1(-np.where(big, 0.0, d)))
            wd = np.where(w > 0, w * d, 0.0)
            scale = np.where(np.isfinite(tb64), np.exp(tb64 - safe), 0.0)
            A += scale * wd.sum(axis=1)
            C += scale * cterm.sum(axis=1)
        inside = (nxt >= start) & (nxt < stop)
        if inside.any():
            r = np.flatnonzero(inside)
            sel_b[r] = lb[r, nxt[r] - start]
            sel_e[r] = le[r, nxt[r] - start]
        if progress is not None:
            progress(stop, V)
    S = sb.s * np.exp(sb.m - np.where(np.isfinite(m), m, 0.0))  # base exp-sum on A's scale
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = A / S + np.log1p(C / S)
    lse_b, lse_e = lse_finish(sb), lse_finish(se)
    return KlRows(kl, arg_b, arg_e, lse_b, lse_e, sel_b - lse_b, sel_e - lse_e)
