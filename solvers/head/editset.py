"""The edit set S: which rows of output.weight a head solve may change.

Two rules, both pre-registered in the protocol's `edit_set` table:
- "explicit": the listed tokens (strings as the model's table decodes them, or ids);
- "top-train-style": the `count` most frequent style tokens (the protocol's `tokens.style`) among
  the next tokens of train reply rows; ties go to the lower id. Only train rows are counted, never
  dev or test.
Special tokens are never in S (their change then is exactly -(LSE' - LSE), which the guard bounds).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from exactedit.dumps.format import ROLE_REPLY
from exactedit.solvers.head.config import HeadSolveError


@dataclass(frozen=True)
class EditSet:
    """S as token ids, with the rule that chose it and, for the frequency rule, each id's count."""

    ids: tuple[int, ...]
    rule: str
    counts: tuple[int, ...] = ()

    def __post_init__(self):
        if not self.ids:
            raise HeadSolveError("edit set", "ids", "is empty; an edit needs at least one row")
        if len(set(self.ids)) != len(self.ids):
            raise HeadSolveError("edit set", "ids", f"repeats a token: {list(self.ids)}")

    def slot(self, tokens) -> np.ndarray:
        """Index in S of each token id (-1 for tokens outside S)."""
        lookup = {v: i for i, v in enumerate(self.ids)}
        return np.array([lookup.get(int(t), -1) for t in np.ravel(tokens)], dtype=np.int64)


def resolve_tokens(tokens: Sequence, vocab: Sequence[str], where: str) -> tuple[int, ...]:
    """Token strings (unique in the model's table) or ids (< V) as ids."""
    index: dict[str, list[int]] = {}
    out = []
    for tok in tokens:
        if isinstance(tok, (int, np.integer)) and not isinstance(tok, bool):
            if not 0 <= int(tok) < len(vocab):
                raise HeadSolveError(where, str(tok), f"token id outside the vocabulary [0, {len(vocab)})")
            out.append(int(tok))
            continue
        if not index:
            for i, text in enumerate(vocab):
                index.setdefault(text, []).append(i)
        ids = index.get(tok, [])
        if len(ids) != 1:
            what = "is not in" if not ids else f"is ambiguous ({len(ids)} ids) in"
            raise HeadSolveError(where, repr(tok), f"{what} the model's token table")
        out.append(ids[0])
    return tuple(dict.fromkeys(out))


def choose_edit_set(rule: str, count: int, explicit: Sequence[int], style: Sequence[int],
                    specials: Sequence[int], train_next: np.ndarray, train_roles: np.ndarray) -> EditSet:
    """S under the protocol's rule. `train_next` / `train_roles`: next token and role bits of the
    train rows only (a dump without roles counts every row as a reply row)."""
    specials = set(int(s) for s in specials)
    if rule == "explicit":
        bad = [int(t) for t in explicit if int(t) in specials]
        if bad:
            raise HeadSolveError("protocol", "edit_set.tokens", f"special tokens {bad} are never in the edit set")
        return EditSet(tuple(int(t) for t in explicit), rule)
    if rule != "top-train-style":
        raise HeadSolveError("protocol", "edit_set.rule", f"unknown rule {rule!r}")
    allowed = np.array(sorted(set(int(s) for s in style) - specials), dtype=np.int64)
    if allowed.size == 0:
        raise HeadSolveError("protocol", "tokens.style", "is empty; the top-train-style rule needs style tokens")
    nxt = np.asarray(train_next, dtype=np.int64)
    roles = np.asarray(train_roles)
    in_reply = ((roles & ROLE_REPLY) != 0) if roles.any() else np.ones(len(nxt), bool)
    hits = nxt[in_reply & np.isin(nxt, allowed)]
    ids, counts = np.unique(hits, return_counts=True)
    if ids.size == 0:
        raise HeadSolveError("train", "style tokens", "no train reply row predicts a style token; "
                             "the top-train-style rule has nothing to choose from")
    order = np.lexsort((ids, -counts))[:count]
    return EditSet(tuple(int(i) for i in ids[order]), rule, tuple(int(c) for c in counts[order]))
