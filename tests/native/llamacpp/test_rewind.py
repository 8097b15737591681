"""The rewind mode's pure parts (native/llamacpp/rewind.py), no engine: the matcher against a regex
reference on random texts (it finds every planted case / spacing / joined / curly-quote variant,
and nothing where the reference finds nothing), its folding against discover's normalization, and
the rollback bookkeeping driven by a scripted "model" (rollback points never behind what was handed
over, bans tied to their position, the bounds, then the phrase kept)."""
from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from exactedit.evals.discover.tokens import normalize
from exactedit.native.llamacpp.rewind import (SKIPPED, PhraseScan, RewindConfig, Rewinder, fold, phrase_key, scan,
                                              summarize_rewinds)

PHRASES = ("Here's an example", "you can use", "can use", "Great question!", "it's worth noting")
CFG = RewindConfig(PHRASES)
_SINGLE = "'\u2018\u2019\u201a\u201b"
_DOUBLE = '"\u201c\u201d\u201e\u201f'


def _reference(text: str, phrases=PHRASES) -> set[tuple[int, int]]:
    """(phrase, start) of every match, by regex: the phrase's characters in any case (straight or
    curly quotes), any whitespace between any two of them, word boundaries at word-character ends."""
    out = set()
    for i, p in enumerate(phrases):
        chars = [c for c in p if not c.isspace()]
        parts = [f"[{_SINGLE}]" if c in _SINGLE else f"[{_DOUBLE}]" if c in _DOUBLE else re.escape(c) for c in chars]
        pat = f"[\\s{re.escape(SKIPPED)}]*".join(parts)
        if re.match(r"\w", chars[0]):
            pat = r"(?<!\w)" + pat
        if re.match(r"\w", chars[-1]):
            pat += r"(?!\w)"
        out |= {(i, m.start()) for m in re.finditer(f"(?=({pat}))", text, re.IGNORECASE)}
    return out


def _found(text: str, cfg=CFG) -> set[tuple[int, int]]:
    return {(m.phrase, m.start) for m in scan(text, cfg)}


ALPHABET = "heraxmplyoucnsgtqiwhn'!.,_ \n\t\u2019\u201cHEYXUCé-*`\u2014"


def test_fold_is_discovers_normalization_lowercased_without_whitespace():
    for text in ("Here\u2019s an \u201cexample\u201d", "\u201aquoted\u201b", "A\tB\nC  d", "Élan", "end-to\u2014end **x**"):
        assert "".join(fold(c) for c in text) == re.sub(f"[\\s{re.escape(SKIPPED)}]", "", normalize(text).lower())
    assert phrase_key("Here\u2019s  an Example") == "here'sanexample"


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=ALPHABET + "\u2018\u201d", max_size=60))
def test_folding_a_text_is_discovers_normalize_then_lower_then_no_whitespace(text):
    assert "".join(fold(c) for c in text) == "".join(c for c in normalize(text).lower()
                                                     if not c.isspace() and c not in SKIPPED)


def test_variants_are_caught_and_near_misses_are_not():
    hits = {"Here\u2019s anExample.": {(0, 0)}, "so You  CAN use it": {(1, 3), (2, 8)}, "youcanuse": {(1, 0)},
            "Great  question!x": {(3, 0)}, "you\ncan\nuse": {(1, 0), (2, 4)}, "IT\u2019S WORTH NOTING": {(4, 0)},
            "you-can-use": {(1, 0), (2, 4)}, "**Here's** an *example*": {(0, 2)}, "`you can use`": {(1, 1), (2, 5)},
            "you can\u2014use": {(1, 0), (2, 4)}}
    misses = ("bayou can used", "you can user", "Here's an examples", "you_can_use", "Great question", "scan use")
    for text, want in hits.items():
        assert _found(text) == want == _reference(text), text
    for text in misses:
        assert _found(text) == set() == _reference(text), text


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=80))
@example("you can use")
@example("can use you can use")
@example("cyou can use")
@example("Great question!!")
def test_the_matcher_finds_exactly_the_references_matches(text):
    assert _found(text) == _reference(text)


@st.composite
def variant(draw, phrase: str) -> str:
    """The phrase with each character's case drawn, its spaces dropped or multiplied, whitespace put
    between letters, and its apostrophes curly."""
    out = []
    for k, c in enumerate(phrase):
        if c == " ":
            out.append(draw(st.sampled_from(["", " ", "  ", "\n", " \t"])))
            continue
        if c == "'":
            c = draw(st.sampled_from(list(_SINGLE)))
        elif c.isalpha():
            c = c.upper() if draw(st.booleans()) else c.lower()
        out.append(c)
        if 0 < k < len(phrase) - 1 and draw(st.integers(0, 9)) == 0:
            out.append(" ")
    return "".join(out)


FILLER = st.text(alphabet="bdfgkqz .,\n", max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_planted_variant_is_found_and_nothing_else(data):
    """Filler that spells no phrase, then variants separated by boundary characters: the matcher
    finds each planted variant where it starts, and no match the reference does not find."""
    text, want = data.draw(FILLER), set()
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(PHRASES) - 1))
        text += data.draw(st.sampled_from([" ", "\n", ", ", "("]))
        want.add((i, len(text)))
        text += data.draw(variant(PHRASES[i])) + data.draw(st.sampled_from([" ", ".", "\n", ","])) + data.draw(FILLER)
    found = _found(text)
    assert want <= found and found == _reference(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="bdfgkqzBDFG .,;\n\t\u2019\u201c-_", max_size=200))
def test_text_without_the_phrases_letters_never_matches(text):
    assert scan(text, CFG) == []


def test_config_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="no phrases"):
        RewindConfig(())
    with pytest.raises(ValueError, match="retries"):
        RewindConfig(PHRASES, retries=-1)
    with pytest.raises(ValueError, match="no text"):
        RewindConfig(("   ",))


def test_live_is_the_earliest_undecided_start():
    s = PhraseScan(CFG)
    for ch in "ok, you ca":
        s.push(ch)
    assert s.live == 4                      # "you ca" may still become "you can use"
    for ch in "n do":
        s.push(ch)
    assert s.live is None                   # "you can do": no phrase any more


# ---- the rollback bookkeeping, driven by a scripted model ---------------------------------------

VOCAB = {0: b"<eos>", 1: b"I", 2: b" think", 3: b" you", 4: b" can", 5: b" use", 6: b" it", 7: b".", 8: b" we",
         9: b" You", 10: b" YOU", 11: b"  you", 12: b" \xe2\x80", 13: b"\x99s", 14: b" Here", 15: b" an",
         16: b" example", 17: b" yo", 18: b"u", 19: b" ok", 20: b" yOu"}


def _drive(plan, alternatives, cfg, max_new=60):
    """A model that writes `plan` (token ids), taking at each position the first of [planned token,
    *alternatives.get(planned token, ())] not banned there. Returns (tokens, rewinder), checking on
    the way: the rewinder's tokens are the reply's, a rollback never reaches a token already handed
    over, and what was handed over is always a prefix of the final reply."""
    rw, out, handed, history = Rewinder(cfg, VOCAB.__getitem__), [], 0, []
    while True:
        want = plan[len(out)] if len(out) < len(plan) else 0
        tok = next(t for t in (want, *alternatives.get(want, ())) if t not in rw.banned())
        out.append(tok)
        back = rw.push(tok, True, ended=tok == 0 or len(out) >= max_new)
        if back is not None:
            assert back >= handed, (back, handed)
            del out[back:]
        else:
            assert rw.committed >= handed
            handed = rw.committed
            history.append(out[:handed])
            if tok == 0 or len(out) >= max_new:
                break
        assert rw.tokens == out
    assert all(out[:len(h)] == h for h in history)
    return out, rw


def _text(toks) -> str:
    return b"".join(VOCAB[t] for t in toks).decode("utf-8", "replace")


def test_a_phrase_is_rolled_back_to_its_first_token_and_that_token_banned_there():
    plan = [1, 2, 3, 4, 5, 6, 7]                       # "I think you can use it."
    out, rw = _drive(plan, {3: (8,)}, RewindConfig(("you can use",)))
    assert _text(out) == "I think we can use it.<eos>"
    assert [tuple(e) for e in rw.events] == [("you can use", 2, 3, False, 4)]      # " you can use it" taken back
    # "you can use" and "can use" complete together: the earlier start is rolled back to; then
    # "we can use" holds "can use", rolled back to " can"
    out, rw = _drive(plan, {3: (8,), 4: (19,)}, RewindConfig(("can use", "you can use")))
    assert [(e.phrase, e.step, e.token) for e in rw.events] == [("you can use", 2, 3), ("can use", 3, 4)]
    assert _text(out) == "I think we ok use it.<eos>"


def test_variants_rolled_back_until_the_retries_then_the_phrase_is_kept():
    plan = [1, 2, 3, 4, 5, 6, 7]
    alts = {3: (9, 10, 11, 20, 8)}                     # " You", " YOU", "  you", " yOu": variants; then " we"
    out, rw = _drive(plan, alts, RewindConfig(("you can use",), retries=5))
    assert [(e.token, e.kept) for e in rw.events] == [(3, False), (9, False), (10, False), (11, False), (20, False)]
    assert _text(out) == "I think we can use it.<eos>"
    out, rw = _drive(plan, alts, RewindConfig(("you can use",), retries=3))   # the 4th is kept: the penalty's reply
    assert [(e.token, e.kept) for e in rw.events] == [(3, False), (9, False), (10, False), (11, True)]
    assert _text(out) == "I think  you can use it.<eos>"


def test_the_total_bound_keeps_every_later_phrase():
    plan = [1, 3, 4, 5, 7] * 4                         # "I you can use." four times
    cfg = RewindConfig(("you can use",), retries=4, total=2)
    out, rw = _drive(plan, {3: (9, 8)}, cfg)
    assert summarize_rewinds([rw.events]) == {"rewinds": 2, "kept": 3, "replies_rewound": 1, "dropped_tokens": 8,
                                              "phrases": {"you can use": 2}, "kept_phrases": {"you can use": 3}}
    assert _text(out) == "I we can use." + "I you can use." * 3 + "<eos>"


def test_a_ban_is_tied_to_its_position():
    """The phrase twice: its first token banned at the first position only; the second occurrence
    is caught on its own, and rolling back before a position forgets the bans past it."""
    plan = [1, 3, 4, 5, 7, 1, 3, 4, 5, 7]
    out, rw = _drive(plan, {3: (8,)}, RewindConfig(("you can use",)))
    assert [(e.step, e.token) for e in rw.events] == [(1, 3), (6, 3)]
    assert rw.bans == {1: [3], 6: [3]}
    rw.push(3)                                          # a token at 11 ...
    rw._rollback(3)                                     # ... and a rollback to 3 forgets bans past it
    assert rw.bans == {1: [3], 3: [out[3]]}


def test_a_character_split_across_tokens_and_curly_quotes():
    """"Here’s an example" with the curly apostrophe split over two tokens: caught, rolled back to " Here"."""
    plan = [1, 14, 12, 13, 15, 16, 7]
    out, rw = _drive(plan, {14: (19,)}, CFG)
    assert rw.events[0].phrase == "Here's an example" and rw.events[0].step == 1
    assert _text(out) == "I ok \u2019s an example.<eos>"


def test_a_phrase_at_the_replys_end_is_caught_at_the_end():
    out, rw = _drive([1, 3, 4, 5], {3: (8,)}, RewindConfig(("you can use",)), max_new=4)
    assert [e.step for e in rw.events] == [1] and _text(out) == "I we can use"


def test_closed_text_is_never_rolled_back():
    rw = Rewinder(RewindConfig(("you can use",)), VOCAB.__getitem__)
    assert [rw.push(t, open_text=False) for t in (3, 4, 5, 7)] == [None] * 4 and rw.committed == 4


def test_undecodable_bytes_are_boundaries():
    rw = Rewinder(RewindConfig(("you can use",)), {1: b"\xff", 2: b"you", 3: b" can", 4: b" use", 5: b"\xfe"}.get)
    assert [rw.push(t) for t in (1, 2, 3, 4)] == [None] * 4 and rw.push(5) == 1
