"""Exact re-scoring of a tail edit on whole traces: `solvers.tail.scores.RowScores` for base vs edited.

Both models are recomputed from the same dump rows (tail forward, then one KL pass over the head:
`solvers.tail.passes.kl_pass_numba.kl_rows_numba` on the host, `kl_pass_jax` on a device), so the numbers
are those of the edit as shipped. Special-token probabilities come from their logits (direct dot
products with their head rows) and the LSEs.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

from exactedit.solvers.tail.scores import DocMeta, RowScores
from exactedit.solvers.tail.forward.head_ref import apply_softcap
from exactedit.solvers.l47.jacobian import token_rows
from exactedit.solvers.tail.passes.kl_pass_numba import kl_rows_numba
from exactedit.solvers.tail.logits import tail_mix

Progress = Callable[[int, int], None]


class ScoredTrace(NamedTuple):
    """A trace to score: its dump, a name, and each document's split role (by document index);
    `edited`: the dump as the edited model sees it, where an edit rewrites the hidden state itself
    (the gated edit's unit: solvers.l47.gated.edit.GatedDump), else None (the same dump)."""

    name: str
    dump: object
    roles: tuple[str, ...]
    domain: str = ""
    edited: object = None


def _docs(t: ScoredTrace) -> tuple[DocMeta, ...]:
    return tuple(DocMeta(d.name, t.name, role, d.source or "", d.character or "", tuple(d.tags), t.domain)
                 for d, role in zip(t.dump.docs, t.roles))


def special_probs(tail, mix_b, mix_e, r, special_ids) -> tuple[np.ndarray, np.ndarray]:
    """p(special) [T, s] on both sides of a KL pass `r` over `tail.head` (its LSEs), float64."""
    w_sp = token_rows(tail.head, [int(x) for x in special_ids])              # [s, n] float64
    l_b = apply_softcap(np.asarray(mix_b, np.float64) @ w_sp.T, tail.softcap)
    l_e = apply_softcap(np.asarray(mix_e, np.float64) @ w_sp.T, tail.softcap)
    return np.exp(l_b - r.lse_base[:, None]), np.exp(l_e - r.lse_edited[:, None])


def rescore_parts(tail, tail_edit, traces: Sequence[ScoredTrace], specials: Sequence[int], *,
                  tile_rows: int = 8192, device_head=None, progress: Progress | None = None) -> list[RowScores]:
    """RowScores of each trace's every row, one per trace in order. With `device_head` (the head on
    a JAX device, `device_pass.to_device`) the pass is `kl_pass_jax` in exact mode there (same
    fields as `kl_rows_numba`); without, the host `kl_rows_numba`. `concat(parts, chunks=False)`
    joins them (documents appended in order)."""
    mix_b = np.concatenate([tail_mix(tail, t.dump) for t in traces], axis=0)
    mix_e = np.concatenate([tail_mix(tail_edit, t.dump if t.edited is None else t.edited) for t in traces], axis=0)
    nxt = np.concatenate([np.asarray(t.dump.next, dtype=np.int64) for t in traces])
    if device_head is None:
        r = kl_rows_numba(mix_b, mix_e, tail.head, next_ids=nxt, softcap=tail.softcap, tile_rows=tile_rows,
                      progress=progress)
    else:
        from exactedit.solvers.tail.passes.kl_pass_jax import kl_pass_jax

        r = kl_pass_jax(mix_b, mix_e, device_head, next_ids=nxt, softcap=tail.softcap, tile_rows=tile_rows,
                        progress=progress)
    sp = list(int(s) for s in specials)
    p_b, p_e = special_probs(tail, mix_b, mix_e, r, sp)
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
    return parts
