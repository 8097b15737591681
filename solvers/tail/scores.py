"""`RowScores`: the per-row numbers every bar is a pure function of.

A solver or a shaping rule fills them for the base and the edited model: log p of the actual next
token, KL(base || edited), both argmaxes, the probabilities of the special tokens and the log
probabilities of a few selected tokens, plus each row's token, next token, role bits and document.
`rows_from_logits` is the numpy float64 reference that builds them from full-vocabulary logits
(one chunk of rows at a time); `concat` joins chunks or traces.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class DocMeta:
    """A document as the bars see it: its trace, its role in the split, and its tags."""

    name: str
    trace: str
    role: str
    source: str = ""
    character: str = ""
    tags: tuple[str, ...] = ()
    domain: str = ""


@dataclass(frozen=True)
class RowScores:
    """Per-row arrays, all of length T (rows), for one or more documents.

    tokens, next: int32 (next = -1 where unknown); roles: uint8 bitmask (dumps.format ROLE_*);
    doc: int32 index into `docs`; logp_base, logp_edit: float64 log p of `next` (NaN where
    next < 0); kl: float64 KL(base || edited) per row; argmax_base, argmax_edit: int32;
    p_special_base/edit: float64 [T, K] for `special_ids`; logp_sel_base/edit: float64 [T, M]
    for `selected_ids`."""

    tokens: np.ndarray
    next: np.ndarray
    roles: np.ndarray
    doc: np.ndarray
    logp_base: np.ndarray
    logp_edit: np.ndarray
    kl: np.ndarray
    argmax_base: np.ndarray
    argmax_edit: np.ndarray
    special_ids: tuple[int, ...]
    p_special_base: np.ndarray
    p_special_edit: np.ndarray
    selected_ids: tuple[int, ...] = ()
    logp_sel_base: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    logp_sel_edit: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    docs: tuple[DocMeta, ...] = ()

    def __post_init__(self):
        t = len(self.tokens)
        for name in ("next", "roles", "doc", "logp_base", "logp_edit", "kl", "argmax_base", "argmax_edit"):
            if np.shape(getattr(self, name)) != (t,):
                raise ValueError(f"RowScores.{name} must have shape ({t},), got {np.shape(getattr(self, name))}")
        k, m = len(self.special_ids), len(self.selected_ids)
        for name, width in (("p_special_base", k), ("p_special_edit", k)):
            if np.shape(getattr(self, name)) != (t, width):
                raise ValueError(f"RowScores.{name} must have shape ({t}, {width})")
        for name in ("logp_sel_base", "logp_sel_edit"):
            if m == 0 and np.size(getattr(self, name)) == 0:
                object.__setattr__(self, name, np.zeros((t, 0)))  # the default, sized to the rows
            elif np.shape(getattr(self, name)) != (t, m):
                raise ValueError(f"RowScores.{name} must have shape ({t}, {m})")
        if t and (self.doc.min() < 0 or self.doc.max() >= len(self.docs)):
            raise ValueError(f"RowScores.doc must index docs (0..{len(self.docs) - 1})")

    @property
    def rows(self) -> int:
        return len(self.tokens)

    @property
    def dlogp(self) -> np.ndarray:
        """log p'(next) - log p(next): the edit's change on the actual next token."""
        return self.logp_edit - self.logp_base

    def doc_roles(self) -> np.ndarray:
        """The split role of each row's document (object array of str)."""
        return np.array([d.role for d in self.docs], dtype=object)[self.doc]

    def with_docs(self, docs: Sequence[DocMeta]) -> "RowScores":
        return replace(self, docs=tuple(docs))

    def take(self, rows, doc, docs: Sequence[DocMeta]) -> "RowScores":
        """The rows `rows` (indices into these), their documents renumbered: `doc` indexes `docs`."""
        rows = np.asarray(rows, dtype=np.int64)
        pick = lambda name: np.asarray(getattr(self, name))[rows]  # noqa: E731
        return RowScores(
            tokens=pick("tokens"), next=pick("next"), roles=pick("roles"), doc=np.asarray(doc, np.int32),
            logp_base=pick("logp_base"), logp_edit=pick("logp_edit"), kl=pick("kl"), argmax_base=pick("argmax_base"),
            argmax_edit=pick("argmax_edit"), special_ids=self.special_ids, p_special_base=pick("p_special_base"),
            p_special_edit=pick("p_special_edit"), selected_ids=self.selected_ids, logp_sel_base=pick("logp_sel_base"),
            logp_sel_edit=pick("logp_sel_edit"), docs=tuple(docs))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def rows_from_logits(base: np.ndarray, edited: np.ndarray, tokens, next_tokens, roles, doc,
                     special_ids: Sequence[int], selected_ids: Sequence[int] = (),
                     docs: Sequence[DocMeta] = ()) -> RowScores:
    """Reference: RowScores of one chunk from full-vocabulary logits [rows, V] (float64 math)."""
    lb, le = log_softmax(base), log_softmax(edited)
    if lb.shape != le.shape or lb.ndim != 2:
        raise ValueError(f"base and edited logits must both be [rows, V], got {lb.shape} and {le.shape}")
    nxt = np.asarray(next_tokens, dtype=np.int32)
    idx = np.arange(len(nxt))
    safe = np.where(nxt >= 0, nxt, 0)
    nan = np.where(nxt >= 0, 0.0, np.nan)
    kl = np.sum(np.exp(lb) * (lb - le), axis=-1)
    sp, sel = list(special_ids), list(selected_ids)
    return RowScores(
        tokens=np.asarray(tokens, dtype=np.int32), next=nxt, roles=np.asarray(roles, dtype=np.uint8),
        doc=np.asarray(doc, dtype=np.int32), logp_base=lb[idx, safe] + nan, logp_edit=le[idx, safe] + nan,
        kl=np.maximum(kl, 0.0), argmax_base=lb.argmax(-1).astype(np.int32), argmax_edit=le.argmax(-1).astype(np.int32),
        special_ids=tuple(int(s) for s in sp), p_special_base=np.exp(lb[:, sp]), p_special_edit=np.exp(le[:, sp]),
        selected_ids=tuple(int(s) for s in sel), logp_sel_base=lb[:, sel], logp_sel_edit=le[:, sel],
        docs=tuple(docs))


def concat(parts: Sequence[RowScores], *, chunks: bool) -> RowScores:
    """Join RowScores. `chunks=True`: row chunks of the same documents (their `docs` must be equal);
    `chunks=False`: different traces, whose documents are appended and doc indices offset."""
    if not parts:
        raise ValueError("concat needs at least one RowScores")
    first = parts[0]
    if any(p.special_ids != first.special_ids or p.selected_ids != first.selected_ids for p in parts):
        raise ValueError("concat: every part must score the same special and selected tokens")
    if chunks:
        if any(p.docs != first.docs for p in parts):
            raise ValueError("concat(chunks=True): every chunk must carry the same documents")
        docs, offsets = list(first.docs), [0] * len(parts)
    else:
        docs, offsets = [], []
        for p in parts:
            offsets.append(len(docs))
            docs.extend(p.docs)
    cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
    return RowScores(
        tokens=cat("tokens"), next=cat("next"), roles=cat("roles"),
        doc=np.concatenate([p.doc + o for p, o in zip(parts, offsets)]).astype(np.int32),
        logp_base=cat("logp_base"), logp_edit=cat("logp_edit"), kl=cat("kl"),
        argmax_base=cat("argmax_base"), argmax_edit=cat("argmax_edit"), special_ids=first.special_ids,
        p_special_base=cat("p_special_base"), p_special_edit=cat("p_special_edit"),
        selected_ids=first.selected_ids, logp_sel_base=cat("logp_sel_base"), logp_sel_edit=cat("logp_sel_edit"),
        docs=tuple(docs))


def prefix_positions(tokens, doc, phrases: Sequence[Sequence[int]], nxt=None) -> np.ndarray:
    """Per row, the index of the phrase whose prefix (all its tokens but the last) the row's tokens
    end with, within the row's document (`doc`: a document index per row); with `nxt` (the next
    token per row) only where that is the phrase's final token. -1 elsewhere; where two phrases
    match, the longer prefix wins."""
    tokens = np.asarray(tokens, dtype=np.int64)
    doc = np.asarray(doc)
    rows = tokens.size
    out = np.full(rows, -1, dtype=np.int64)
    best = np.zeros(rows, dtype=np.int64)
    for pi, phrase in enumerate(phrases):
        prefix, final = list(phrase[:-1]), phrase[-1]
        k = len(prefix)
        hit = np.ones(rows, dtype=bool) if nxt is None else np.asarray(nxt) == final
        for j, tok in enumerate(reversed(prefix)):
            shifted = np.full(rows, -1, dtype=np.int64)
            same_doc = np.zeros(rows, dtype=bool)
            if j:
                shifted[j:] = tokens[:-j]
                same_doc[j:] = doc[j:] == doc[:-j]
            else:
                shifted[:] = tokens
                same_doc[:] = True
            hit &= (shifted == tok) & same_doc
        take = hit & (k > best)
        out[take], best[take] = pi, k
    return out


def slop_positions(scores: RowScores, phrases: Sequence[Sequence[int]]) -> np.ndarray:
    """Per row, the index of the banned phrase whose prefix the row's tokens end with (within its
    document) and whose final token is the actual next token; -1 elsewhere. Where two phrases
    match, the longer prefix wins."""
    return prefix_positions(scores.tokens, scores.doc, phrases, scores.next)


def word_positions(scores: RowScores, words: Sequence[int], slop: np.ndarray) -> np.ndarray:
    """Per row, the index of the collateral word that is the actual next token at a row that is not a
    slop position (a legitimate use); -1 elsewhere."""
    out = np.full(scores.rows, -1, dtype=np.int64)
    for wi, w in enumerate(words):
        out[(scores.next == w) & (slop < 0) & (out < 0)] = wi
    return out
