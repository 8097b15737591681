"""Exact re-scoring of a tail edit on whole traces: `evals.scoring.RowScores` for base vs edited.

Both models are recomputed from the same dump rows (tail forward, then one streaming pass over
the head), so the numbers are those of the edit as shipped. The pass multiplies both activations
with each dequantized head tile in one sgemm and folds the two logits tiles into per-row running
sums with a small numba kernel (`_fold_tile`, no fastmath), in the form of `evals.kld.kl_rows`
(the numpy reference it is tested against):
    S = sum_v e^(l_v - m),  A = sum_v e^(l_v - m) d_v,  Cc = sum_v e^(l_v - m) expm1(-d_v),  d = l - l'
    KL = A / S + log1p(Cc / S),  LSE = m + log S,  LSE' = m + log(S + Cc)
with m the running max of the base logits; expm1 keeps small KLs exact. Special-token
probabilities come from their logits (direct dot products with their head rows) and the LSEs.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

import numba
import numpy as np
from numba import prange

from exactedit.evals.kld import KlRows
from exactedit.evals.scoring import DocMeta, RowScores, concat
from exactedit.solvers.head.forward import apply_softcap
from exactedit.solvers.head.stream import tile_size
from exactedit.solvers.l47.jacobian import token_rows
from exactedit.solvers.logits import tail_mix

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


def pair_rows(mix_base, mix_edited, head, *, next_ids=None, softcap: float | None = None,
              tile_rows: int = 8192, progress: Progress | None = None) -> KlRows:
    """KL(base || edited), both LSEs, argmaxes and next-token log-probs for activations
    [T, n] (base and edited) over one head; one sgemm per tile for both."""
    mb = np.ascontiguousarray(mix_base, dtype=np.float32)
    me = np.ascontiguousarray(mix_edited, dtype=np.float32)
    T, V = mb.shape[0], head.rows
    both = np.concatenate([mb, me], axis=0)
    nxt = np.full(T, -1, np.int64) if next_ids is None else np.ascontiguousarray(next_ids, dtype=np.int64)
    m = np.full(T, -np.inf)
    S, A, Cc = np.zeros(T), np.zeros(T), np.zeros(T)
    arg_b, arg_e = np.zeros(T, np.int64), np.zeros(T, np.int64)
    best_b, best_e = np.full(T, -np.inf, np.float32), np.full(T, -np.inf, np.float32)
    sel_b, sel_e = np.full(T, np.nan, np.float32), np.full(T, np.nan, np.float32)
    step = tile_size(2 * T, tile_rows)
    for start in range(0, V, step):
        stop = min(start + step, V)
        tile = both @ head.read(start, stop).T
        if softcap is not None:
            tile = apply_softcap(tile, softcap).astype(np.float32)
        _fold_tile(tile[:T], tile[T:], start, nxt, m, S, A, Cc, arg_b, best_b, arg_e, best_e, sel_b, sel_e)
        if progress is not None:
            progress(stop, V)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse_b = m + np.log(S)
        lse_e = m + np.log(S + Cc)
        kl = A / S + np.log1p(Cc / S)
    return KlRows(kl, arg_b, arg_e, lse_b, lse_e, sel_b - lse_b, sel_e - lse_e)


class ScoredTrace(NamedTuple):
    """A trace to score: its dump, a name, and each document's split role (by document index)."""

    name: str
    dump: object
    roles: tuple[str, ...]
    domain: str = ""


def _docs(t: ScoredTrace) -> tuple[DocMeta, ...]:
    return tuple(DocMeta(d.name, t.name, role, d.source or "", d.character or "", tuple(d.tags), t.domain)
                 for d, role in zip(t.dump.docs, t.roles))


def score_traces(tail, tail_edit, traces: Sequence[ScoredTrace], specials: Sequence[int], *,
                 tile_rows: int = 8192, device_head=None, progress: Progress | None = None) -> RowScores:
    """RowScores of every row of every trace (documents appended in order, as `concat` does). With
    `device_head` (the head on a JAX device, `stream_jax.to_device`) the pass is `kl_pass_jax` in
    exact mode there (same fields as `pair_rows`); without, the host `pair_rows`."""
    mix_b = np.concatenate([tail_mix(tail, t.dump) for t in traces], axis=0)
    mix_e = np.concatenate([tail_mix(tail_edit, t.dump) for t in traces], axis=0)
    nxt = np.concatenate([np.asarray(t.dump.next, dtype=np.int64) for t in traces])
    if device_head is None:
        r = pair_rows(mix_b, mix_e, tail.head, next_ids=nxt, softcap=tail.softcap, tile_rows=tile_rows,
                      progress=progress)
    else:
        from exactedit.solvers.head.stream_jax import kl_pass_jax

        r = kl_pass_jax(mix_b, mix_e, device_head, next_ids=nxt, softcap=tail.softcap, tile_rows=tile_rows,
                        progress=progress)
    sp = list(int(s) for s in specials)
    w_sp = token_rows(tail.head, sp)                                         # [s, n] float64
    l_sp_b = apply_softcap(np.asarray(mix_b, np.float64) @ w_sp.T, tail.softcap)
    l_sp_e = apply_softcap(np.asarray(mix_e, np.float64) @ w_sp.T, tail.softcap)
    p_b = np.exp(l_sp_b - r.lse_base[:, None])
    p_e = np.exp(l_sp_e - r.lse_edited[:, None])
    parts, a = [], 0
    for t in traces:
        d = t.dump
        b = a + d.rows
        roles = np.zeros(d.rows, np.uint8) if d.roles is None else np.asarray(d.roles, np.uint8)
        parts.append(RowScores(
            tokens=np.asarray(d.tokens, np.int32), next=np.asarray(d.next, np.int32), roles=roles,
            doc=np.asarray(d.doc_index(), np.int32), logp_base=r.logp_next_base[a:b].astype(np.float64),
            logp_edit=r.logp_next_edited[a:b].astype(np.float64), kl=np.maximum(r.kl[a:b], 0.0),
            argmax_base=r.argmax_base[a:b].astype(np.int32), argmax_edit=r.argmax_edited[a:b].astype(np.int32),
            special_ids=tuple(sp), p_special_base=p_b[a:b], p_special_edit=p_e[a:b], docs=_docs(t)))
        a = b
    return concat(parts, chunks=False)
