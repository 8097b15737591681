"""Where a style is decided, and the rows a head edit must leave alone: pure row selections.

A persona's style is one decision (evals/rates/style.py): a starter is decided at the reply's start,
a sign-off at its end. A head edit is *meant* to act on those rows, so a KL bar that averages over
them measures the intended change, not the damage. `decision_rows` picks them:
- rows carrying one of the registered role bits (`dumps.format.ROLE_*`: `step0` for a starter, the
  row predicting the first visible reply token; `reply_end` for a sign-off, the row predicting the
  reply's real turn end, where an unedited reply stops and an edited one signs off);
- rows inside a reply whose actual next token is a style token (where a reply of the persona does
  take the decision: its sign-off's first token, a starter's token).
Every other row is *off* the decision; the persona protocol's off-decision KL bar averages those.

`paragraph_starts` picks the rows that predict the first token after a blank line: the rows whose
hidden state most resembles a reply's start (measured on Qwen: every anchor row with KL > 0.1 off
the reply start was one), which a head edit of a starter may hold (HeadSolveConfig.hold).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from exactedit.dumps.format import ROLE_NAMES, ROLE_REPLY

BLANK_LINE = "\n\n"

__all__ = ["BLANK_LINE", "decision_rows", "paragraph_starts", "role_bits"]


def role_bits(names: str) -> int:
    """The role bits of a comma-separated list of role names (`dumps.format.ROLE_NAMES`: "step0",
    "reply_end", ...); "" is 0. ValueError naming the unknown name."""
    bits = 0
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if name not in ROLE_NAMES:
            raise ValueError(f"unknown row role {name!r} (known: {', '.join(ROLE_NAMES)})")
        bits |= ROLE_NAMES[name]
    return bits


def decision_rows(roles: np.ndarray, nxt: np.ndarray, style: Sequence[int], bits: int) -> np.ndarray:
    """bool [T]: rows carrying any of `bits`, and reply rows whose next token is a style token."""
    roles = np.asarray(roles)
    in_reply = (roles & ROLE_REPLY) != 0
    styled = np.isin(np.asarray(nxt), np.asarray(list(style), dtype=np.int64)) & in_reply
    return ((roles & bits) != 0) | styled


def paragraph_starts(tokens: np.ndarray, doc: np.ndarray, nxt: np.ndarray,
                     piece: Callable[[int], str]) -> np.ndarray:
    """bool [T]: rows whose document text up to and including the row's token ends with a blank
    line ("\\n\\n", possibly across two tokens) and whose next token is known: the rows that predict
    a paragraph's first token. `piece(id)` is a token's text."""
    tokens, doc, nxt = np.asarray(tokens), np.asarray(doc), np.asarray(nxt)
    texts: dict[int, str] = {}

    def text(t: int) -> str:
        if t not in texts:
            texts[t] = piece(t)
        return texts[t]

    out = np.zeros(len(tokens), dtype=bool)
    for r in range(len(tokens)):
        if nxt[r] < 0:
            continue
        own = text(int(tokens[r]))
        if not own.endswith("\n"):
            continue
        tail = own if len(own) >= 2 or r == 0 or doc[r - 1] != doc[r] else text(int(tokens[r - 1])) + own
        out[r] = tail.endswith(BLANK_LINE)
    return out
