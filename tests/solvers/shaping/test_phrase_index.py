"""The live prefix penalty walks back only from the forms the row's token can end (an index by
the prefixes' suffixes): it hits exactly what the shared matcher's `prefix_at` over every form
hits, on random pieces, phrases, token streams and spans; and `Shaper.hits` keeps one row's
answer (the live loop asks twice per step) until the next push, reset or persona change."""
from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings, strategies as st

from exactedit.solvers.shaping.rules import PhrasePenalty, Row, Shaper, TextPhrase
from exactedit.solvers.shaping.triggers import ShapeVocab

WORDS = ["ab", "a", "b", "ba", "Ab", "abb"]
PIECES = [b"a", b"b", b"ab", b" a", b" ab", b" b", b"(a", b"(Ab", b" ab a", b"b ab", b"\"A", b"A", b" ", b"ba b",
          b"\x00", b"abb ab"]


def _row(span: int) -> Row:
    return Row(True, False, False, False, False, False, False, False, span, False)


def _prefix_at(rule: PhrasePenalty, tokens, boundary, start: int, t: int, row: Row) -> tuple[int, ...]:
    """The penalty's hits as first written: the shared matcher's walk from every form."""
    first = max(start, t - row.span)
    m = rule._matcher
    m.tb.boundary = {int(tokens[i]): bool(boundary[i]) for i in range(max(first, t - rule.longest), t + 1)}
    return tuple(rule.phrases[i].final for i in sorted(m.prefix_at(tokens, t, first)))


@st.composite
def worlds(draw):
    n_tok = len(PIECES) + 4                     # the last 4 ids are no pieces: boundary or not
    phrases = draw(st.lists(st.lists(st.sampled_from(WORDS), min_size=2, max_size=3).map(" ".join),
                            min_size=1, max_size=6, unique=True))
    kept = draw(st.lists(st.booleans(), min_size=len(PIECES), max_size=len(PIECES)))
    pieces = {i: p for i, (p, k) in enumerate(zip(PIECES, kept)) if k}
    bound = draw(st.lists(st.booleans(), min_size=n_tok, max_size=n_tok))
    tokens = draw(st.lists(st.integers(0, n_tok - 1), min_size=1, max_size=12))
    start = draw(st.integers(0, len(tokens) - 1))
    return phrases, pieces, bound, tokens, start


@settings(max_examples=400, deadline=None)
@given(worlds(), st.integers(0, 12))
@example((["ab a b"], {8: b" ab a", 0: b"a"}, [True] * 20, [18, 8], 0), 5)      # merged, longer than the prefix
@example((["a b", "Ab ab"], {6: b"(a", 7: b"(Ab"}, [True] * 20, [19, 7], 0), 3)  # bracket and capital merged
@example((["a b"], {0: b"a"}, [True] * 20, [16, 0], 0), 0)                       # span 0: the walk stops short
@example((["ab ab a b"], {2: b"ab", 8: b" ab a"}, [True] * 20, [16, 2, 8], 0), 5)  # the widest piece ends the prefix
def test_index_hits_what_every_form_walked_hits(world, span):
    phrases, pieces, bound, tokens, start = world
    rule = PhrasePenalty(6.0, tuple(TextPhrase(p, 100 + k) for k, p in enumerate(phrases)), pieces)
    toks = np.array(tokens, np.int32)
    boundary = [bound[t] for t in tokens]
    for t in range(start, len(toks)):
        row = _row(span)
        assert rule.hits(toks, boundary, start, t, row) == _prefix_at(rule, toks, boundary, start, t, row), t


def test_shaper_keeps_one_rows_hits_until_the_next_push():
    texts = ["<|im_start|>", "<|im_end|>", "assistant", "\n", " you", " can", " use", "The", "the"]
    vocab = ShapeVocab.from_texts(texts, think=None, tool=None)
    pieces = {4: b" you", 5: b" can"}
    rule = PhrasePenalty(6.0, (TextPhrase("you can use", 6),), pieces)
    calls = []

    class Counting:
        name = "counting"

        def hits(self, tokens, boundary, start, t, row, active=True):
            calls.append((t, active))
            return rule.hits(tokens, boundary, start, t, row, active)

        apply_row = rule.apply_row

    sh = Shaper([Counting()], vocab)
    for tok in (0, 2, 3, 4, 5):
        sh.push(tok)
    assert sh.hits() == ((6,),) and sh.hits() == ((6,),) and calls == [(4, True)]
    sh.persona = False
    assert sh.hits() == ((6,),) and calls == [(4, True), (4, False)]
    sh.push(6)
    assert sh.hits() == ((),) and calls[-1] == (5, False)
    sh.reset()
    for tok in (0, 2, 3, 4, 5):
        sh.push(tok)
    assert sh.hits() == ((6,),) and len(calls) == 4
