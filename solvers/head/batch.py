"""Which train rows each term of J reads: from the dump's row roles and document tags to a HeadBatch.

How a user marks rows (dump `roles` bits, see docs/dump-format.md; `dumps.roles.infer_roles`
derives them from ChatML):
- voice NLL: reply rows (ROLE_REPLY) outside <think> and <tool_call>, next token known;
- opener unlikelihood and margin: the step-0 row of each reply (ROLE_STEP0);
- closer unlikelihood: the row that predicts a reply's real <|im_end|> (ROLE_REPLY_END);
- margin: a document tagged `rejected0=<token id>` gives its step-0 rows a rejected opener (the
  first token of a rejected reply sharing the whole prefix); chosen is the actual next token;
- KL anchors: rows marked ROLE_ANCHOR (documents tagged `anchor`) and every prompt row
  (ROLE_PROMPT: system / user turns), i.e. text the edit is not meant to produce;
- special-token guard: every row whose next token is known and not special.
Only rows of train documents are ever given to this module.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from exactedit.dumps.format import ROLE_ANCHOR, ROLE_PROMPT, ROLE_REPLY, ROLE_REPLY_END, ROLE_STEP0, ROLE_THINK, ROLE_TOOL
from exactedit.solvers.head.config import HeadSolveError
from exactedit.solvers.head.objective import HeadBatch, MarginTerm, SetTerm, TargetTerm, logsumexp
from exactedit.solvers.head.rowdata import RowData

REJECTED_TAG = "rejected0="


def term_rows(rd: RowData, specials: Sequence[int]) -> dict[str, np.ndarray]:
    """Row ids (into rd) of each term."""
    r, known = rd.roles, rd.next >= 0
    return {
        "nll": np.flatnonzero(known & ((r & ROLE_REPLY) != 0) & ((r & (ROLE_THINK | ROLE_TOOL)) == 0)),
        "step0": np.flatnonzero(known & ((r & ROLE_STEP0) != 0)),
        "reply_end": np.flatnonzero(known & ((r & ROLE_REPLY_END) != 0)),
        "anchor": np.flatnonzero(known & ((r & (ROLE_ANCHOR | ROLE_PROMPT)) != 0)),
        "guard": np.flatnonzero(known & ~np.isin(rd.next, np.asarray(specials, dtype=np.int64))),
    }


def rejected_openers(docs, vocab: int) -> np.ndarray:
    """Per document: the rejected opener id from its `rejected0=<id>` tag, or -1."""
    out = np.full(len(docs), -1, dtype=np.int64)
    for i, d in enumerate(docs):
        for tag in d.tags:
            if tag.startswith(REJECTED_TAG):
                text = tag[len(REJECTED_TAG):]
                if not text.isdigit() or int(text) >= vocab:
                    raise HeadSolveError(f"document {d.name!r}", "tags", f"{tag!r}: expected "
                                         f"{REJECTED_TAG}<token id below {vocab}>")
                out[i] = int(text)
    return out


def _target(rd: RowData, rows: np.ndarray, tokens: np.ndarray, logits: np.ndarray, edit_ids) -> TargetTerm:
    slot_of = {int(v): i for i, v in enumerate(edit_ids)}
    slots = np.array([slot_of.get(int(t), -1) for t in tokens], dtype=np.int64)
    return TargetTerm(rows.astype(np.int64), np.asarray(logits, dtype=np.float64), slots)


def _set_term(rd: RowData, rows: np.ndarray, members: Sequence[int], edit_ids) -> SetTerm:
    """The set's members except each row's own next token; inside S as a mask, outside as a logsumexp."""
    ids = np.asarray(edit_ids, dtype=np.int64)
    members = np.asarray(list(dict.fromkeys(int(m) for m in members)), dtype=np.int64)
    nxt = rd.next[rows][:, None]
    mask = np.isin(ids, members)[None, :] & (ids[None, :] != nxt)
    out_ids = members[~np.isin(members, ids)]
    if out_ids.size:
        logits = np.where(out_ids[None, :] != nxt, rd.sel(out_ids)[rows], -np.inf)
        lse_out = logsumexp(logits)
    else:
        lse_out = np.full(len(rows), -np.inf)
    return SetTerm(rows.astype(np.int64), mask, lse_out)


def build_batch(rd: RowData, edit_ids: Sequence[int], specials: Sequence[int], openers: Sequence[int],
                closers: Sequence[int], vocab: int) -> tuple[HeadBatch, dict[str, int]]:
    """The HeadBatch of the train rows, and the row count of each term."""
    rows = term_rows(rd, specials)
    step0 = rows["step0"]
    nll = _target(rd, rows["nll"], rd.next[rows["nll"]], rd.next_logit[rows["nll"]], edit_ids)
    rejected = rejected_openers(rd.docs, vocab)[rd.doc[step0]]
    m_rows = step0[rejected >= 0]
    rej_ids = rejected[rejected >= 0]
    rej_logits = np.array([_logit(rd, r, t) for r, t in zip(m_rows, rej_ids)], dtype=np.float64)
    margin = MarginTerm(_target(rd, m_rows, rd.next[m_rows], rd.next_logit[m_rows], edit_ids),
                        _target(rd, m_rows, rej_ids, rej_logits, edit_ids))
    batch = HeadBatch(z=rd.z, base_s=rd.base_s, lse_rest=rd.lse_rest, lse=rd.lse, nll=nll, margin=margin,
                      opener=_set_term(rd, step0, openers, edit_ids),
                      closer=_set_term(rd, rows["reply_end"], closers, edit_ids),
                      anchor=rows["anchor"].astype(np.int64), guard=rows["guard"].astype(np.int64))
    counts = {"rows": rd.rows, "nll": len(nll.rows), "margin": len(m_rows), "opener": len(step0),
              "closer": len(rows["reply_end"]), "anchor": len(rows["anchor"]), "guard": len(rows["guard"])}
    return batch, counts


def _logit(rd: RowData, row: int, token: int) -> float:
    """Base logit of `token` at `row`: from S, the selected tokens, or the next token."""
    if token in rd.sel_ids:
        return float(rd.sel_logits[row, rd.sel_ids.index(token)])
    if rd.next[row] == token:
        return float(rd.next_logit[row])
    raise HeadSolveError("margin", "rejected0", f"token {token} was not in the full-vocab pass's selection")
