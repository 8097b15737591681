"""Per-row data of a head solve, from one full-vocab pass, and the exact effect of an edit of S.

One `vocab_pass` per set of rows gives everything later steps need (SPEC.md section 2): the mix
vector z, LSE, LSE_rest (over V \\ S), the base logits of S, of the next token and of a few
selected tokens (specials, openers, closers), and the best token outside S (top-(|S|+1)). From
those, an edit dW_S is scored exactly in rows x |S| x n: log p of the next token before and after,
KL(p || p') per row, the edited argmax, and the specials' probabilities, i.e. `solvers.tail.scores
.RowScores` without any full-vocab recompute.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from exactedit.solvers.tail.scores import DocMeta, RowScores

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class RowData:
    """Rows of one or more dumps (float64 unless noted). `sel_ids` are extra tokens whose base
    logits are kept (specials, openers, closers)."""

    z: np.ndarray             # float32 [T, n] mix
    tokens: np.ndarray        # int32 [T]
    next: np.ndarray          # int32 [T] (-1 unknown)
    roles: np.ndarray         # uint8 [T]
    doc: np.ndarray           # int32 [T] index into docs
    docs: tuple[DocMeta, ...]
    lse: np.ndarray           # [T]
    lse_rest: np.ndarray      # [T] over V \ S
    base_s: np.ndarray        # [T, |S|]
    next_logit: np.ndarray    # [T] (nan where next < 0)
    best_out: np.ndarray      # int64 [T] argmax over V \ S
    best_out_logit: np.ndarray  # [T]
    argmax: np.ndarray        # int64 [T] base argmax over V
    sel_ids: tuple[int, ...]
    sel_logits: np.ndarray    # [T, len(sel_ids)]

    @property
    def rows(self) -> int:
        return len(self.tokens)

    def take(self, rows: np.ndarray) -> "RowData":
        """A subset of rows (docs kept)."""
        fields = {f: getattr(self, f)[rows] for f in ("z", "tokens", "next", "roles", "doc", "lse", "lse_rest",
                                                       "base_s", "next_logit", "best_out", "best_out_logit",
                                                       "argmax", "sel_logits")}
        return replace(self, **fields)

    def sel(self, ids: Sequence[int]) -> np.ndarray:
        """Base logits [T, len(ids)] of selected tokens."""
        cols = [self.sel_ids.index(int(i)) for i in ids]
        return self.sel_logits[:, cols]


def gather(tail, dump, spans: Sequence[tuple[int, int, int]], docs: Sequence[DocMeta], edit_ids: Sequence[int],
           sel_ids: Sequence[int], *, tile_rows: int = 8192, device_head=None,
           progress: Progress | None = None) -> RowData:
    """RowData for the row ranges `spans` = [(start, stop, doc index)] of `dump` (one pass). With
    `device_head` (the tail's head on a JAX device, `device_pass.to_device`) the pass is
    `vocab_pass_jax` in exact mode (float32 HIGHEST) there; without, the host `vocab_pass`."""
    from exactedit.solvers.tail.logits import head_pass, tail_mix

    if not spans:
        raise ValueError("gather needs at least one row range")
    z = np.concatenate([tail_mix(tail, dump, (a, b)) for a, b, _ in spans]).astype(np.float32)
    rows = np.concatenate([np.arange(a, b) for a, b, _ in spans])
    doc = np.concatenate([np.full(b - a, d, dtype=np.int32) for a, b, d in spans])
    nxt = np.asarray(dump.next[rows], dtype=np.int32)
    k, sel_ids = len(edit_ids), tuple(int(i) for i in sel_ids)
    wanted = np.concatenate([np.broadcast_to(np.asarray(edit_ids, np.int64), (len(rows), k)),
                             np.broadcast_to(np.asarray(sel_ids, np.int64), (len(rows), len(sel_ids))),
                             nxt.astype(np.int64)[:, None]], axis=1)
    if device_head is None:
        vp = head_pass(tail, z, token_sets=wanted, topk=k + 1, exclude=np.asarray(edit_ids), tile_rows=tile_rows,
                       progress=progress)
    else:
        from exactedit.solvers.tail.passes.device_pass import vocab_pass_jax

        vp = vocab_pass_jax(z, device_head, token_sets=wanted, topk=k + 1, exclude=np.asarray(edit_ids),
                            tile_rows=tile_rows, softcap=tail.softcap, progress=progress)
    roles = dump.roles
    return from_pass(z, vp, np.asarray(dump.tokens[rows], dtype=np.int32), nxt,
                     np.zeros(len(rows), np.uint8) if roles is None else np.asarray(roles[rows], dtype=np.uint8),
                     doc, docs, edit_ids, sel_ids)


def from_pass(z, vp, tokens, nxt, roles, doc, docs: Sequence[DocMeta], edit_ids: Sequence[int],
              sel_ids: Sequence[int]) -> RowData:
    """RowData from one vocab pass `vp` (a `VocabPass` with top-(|S|+1), LSE over V \\ S and, as its
    selected logits, those of S, then `sel_ids`, then each row's next token)."""
    k, sel_ids = len(edit_ids), tuple(int(i) for i in sel_ids)
    chosen = vp.selected.astype(np.float64)
    outside = ~np.isin(vp.topk_ids, np.asarray(edit_ids))
    first = np.argmax(outside, axis=1)
    r = np.arange(len(tokens))
    return RowData(
        z=z, tokens=tokens, next=nxt, roles=roles, doc=doc, docs=tuple(docs), lse=vp.lse.astype(np.float64),
        lse_rest=vp.lse_rest.astype(np.float64), base_s=chosen[:, :k], next_logit=chosen[:, -1],
        best_out=vp.topk_ids[r, first], best_out_logit=vp.topk_logits[r, first].astype(np.float64),
        argmax=vp.argmax.astype(np.int64), sel_ids=sel_ids, sel_logits=chosen[:, k:k + len(sel_ids)])


def concat(parts: Sequence[RowData]) -> RowData:
    """Join RowData of different dumps (doc indices are offset; every part has the same S and sel_ids)."""
    docs, offset, shifted = [], 0, []
    for p in parts:
        shifted.append(p.doc + offset)
        docs.extend(p.docs)
        offset += len(p.docs)
    cat = {f: np.concatenate([getattr(p, f) for p in parts]) for f in
           ("z", "tokens", "next", "roles", "lse", "lse_rest", "base_s", "next_logit", "best_out",
            "best_out_logit", "argmax", "sel_logits")}
    return replace(parts[0], doc=np.concatenate(shifted).astype(np.int32), docs=tuple(docs), **cat)


@dataclass(frozen=True)
class Effect:
    """The exact effect of an edit dW_S on each row (float64)."""

    delta: np.ndarray        # [T, |S|] change of the S logits
    dlse: np.ndarray         # [T] LSE' - LSE
    logp_base: np.ndarray    # [T] log p(next) (nan where unknown)
    logp_edit: np.ndarray    # [T]
    kl: np.ndarray           # [T] KL(p || p')
    argmax_edit: np.ndarray  # int64 [T]

    @property
    def dlogp(self) -> np.ndarray:
        return self.logp_edit - self.logp_base


def effect(rd: RowData, dw: np.ndarray, edit_ids: Sequence[int]) -> Effect:
    """Score dW_S (|S| x n, any float dtype) on every row, exactly, in float64."""
    ids = np.asarray(edit_ids, dtype=np.int64)
    delta = rd.z.astype(np.float64) @ np.asarray(dw, dtype=np.float64).T
    p = np.exp(rd.base_s - rd.lse[:, None])
    dlse = np.log1p(np.sum(p * np.expm1(delta), axis=1))
    slot = np.full(rd.rows, -1)
    for i, v in enumerate(ids):
        slot[rd.next == v] = i
    inside = slot >= 0
    next_delta = np.where(inside, delta[np.arange(rd.rows), np.maximum(slot, 0)], 0.0)
    known = rd.next >= 0
    logp_base = np.where(known, rd.next_logit - rd.lse, np.nan)
    logp_edit = np.where(known, rd.next_logit + next_delta - rd.lse - dlse, np.nan)
    kl = np.maximum(np.sum(-p * delta, axis=1) + dlse, 0.0)
    edited_s = rd.base_s + delta
    best_s = np.argmax(edited_s, axis=1)
    best_s_logit = edited_s[np.arange(rd.rows), best_s]
    # ties go to the lower id, as in the full-vocab argmax
    s_wins = (best_s_logit > rd.best_out_logit) | ((best_s_logit == rd.best_out_logit) & (ids[best_s] < rd.best_out))
    return Effect(delta, dlse, logp_base, logp_edit, kl, np.where(s_wins, ids[best_s], rd.best_out))


def row_scores(rd: RowData, eff: Effect, special_ids: Sequence[int]) -> RowScores:
    """`solvers.tail.scores.RowScores` of the rows under the edit (special ids must be among sel_ids)."""
    sp = rd.sel(special_ids)
    return RowScores(
        tokens=rd.tokens, next=rd.next, roles=rd.roles, doc=rd.doc, logp_base=eff.logp_base,
        logp_edit=eff.logp_edit, kl=eff.kl, argmax_base=rd.argmax.astype(np.int32),
        argmax_edit=eff.argmax_edit.astype(np.int32), special_ids=tuple(int(s) for s in special_ids),
        p_special_base=np.exp(sp - rd.lse[:, None]), p_special_edit=np.exp(sp - (rd.lse + eff.dlse)[:, None]),
        docs=rd.docs)
