"""Decision rows and paragraph starts (solvers/tail/decision.py) on hand-made documents."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.dumps.format import ROLE_PROMPT, ROLE_REPLY, ROLE_REPLY_END, ROLE_STEP0
from exactedit.solvers.tail.decision import decision_rows, paragraph_starts, role_bits

P, R = ROLE_PROMPT, ROLE_REPLY
GREET, HAPPY, A, DOT, NN, N, END = range(7)
PIECES = {GREET: "Greetings", HAPPY: " Happy", A: " a", DOT: ".", NN: "\n\n", N: "\n", END: "<|im_end|>"}


def _doc():
    """One chat document: prompt rows, a reply "Greetings a.\\n\\n a.\\n\\n Happy" and its turn end.
    Row i predicts next[i]; roles are those of the next token."""
    tokens = [A, A, GREET, A, DOT, NN, A, DOT, N, N, HAPPY, END]
    nxt = tokens[1:] + [-1]
    roles = [P, R | ROLE_STEP0, R, R, R, R, R, R, R, R, R | ROLE_REPLY_END, 0]
    return np.array(tokens), np.array(nxt), np.array(roles, dtype=np.uint8)


def test_role_bits_reads_role_names():
    assert role_bits("") == 0 and role_bits("step0") == ROLE_STEP0
    assert role_bits("step0, reply_end") == ROLE_STEP0 | ROLE_REPLY_END
    with pytest.raises(ValueError, match="unknown row role 'start'"):
        role_bits("start")


def test_a_starters_decision_rows_are_the_reply_start_and_its_style_token():
    tokens, nxt, roles = _doc()
    dec = decision_rows(roles, nxt, [GREET], role_bits("step0"))
    assert np.flatnonzero(dec).tolist() == [1]                 # the step-0 row, which predicts "Greetings"
    assert np.flatnonzero(~dec).tolist() == [0, *range(2, 12)]  # everything else is off the decision


def test_a_sign_offs_decision_rows_are_the_reply_end_and_its_style_token():
    tokens, nxt, roles = _doc()
    dec = decision_rows(roles, nxt, [HAPPY], role_bits("reply_end"))
    assert np.flatnonzero(dec).tolist() == [9, 10]          # predicts " Happy"; predicts the real turn end
    no_roles = decision_rows(roles, nxt, [HAPPY], 0)
    assert np.flatnonzero(no_roles).tolist() == [9]         # without registered roles: the style token only


def test_a_style_token_outside_a_reply_is_no_decision():
    dec = decision_rows(np.array([P, 0], np.uint8), np.array([GREET, GREET]), [GREET], 0)
    assert not dec.any()


def test_paragraph_starts_are_rows_right_after_a_blank_line():
    tokens, nxt, _ = _doc()
    doc = np.zeros(len(tokens), np.int32)
    got = paragraph_starts(tokens, doc, nxt, PIECES.__getitem__)
    assert np.flatnonzero(got).tolist() == [5, 9]           # one "\n\n" token; "\n" after "\n" (two tokens)
    doc[9:] = 1                                             # a document starting at the second "\n": no blank line
    assert np.flatnonzero(paragraph_starts(tokens, doc, nxt, PIECES.__getitem__)).tolist() == [5]
    last = np.array(nxt)
    last[5] = -1                                            # next token unknown: nothing to hold
    assert np.flatnonzero(paragraph_starts(tokens, np.zeros(len(tokens)), last, PIECES.__getitem__)).tolist() == [9]
