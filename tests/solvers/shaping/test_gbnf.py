"""The llama.cpp grammar that excludes phrases (solvers/shaping/gbnf.py): the automaton, and the GBNF
text read back by a small checker of our own (tests/gbnf_check.py), against the naive definition
(a form of a phrase starting after an ASCII word boundary, checked position by position) on random
strings; the matcher's
occurrences are all refused; the size cap refuses with our error. llama.cpp's own parser reads
the grammar in tests/native/shaping/test_live_gbnf.py."""
from __future__ import annotations

import pytest
from hypothesis import example, given, settings, strategies as st

from exactedit.solvers.phrases import text_occurrences
from exactedit.solvers.shaping.gbnf import GrammarError, char_class, exclusion, patterns, render_gbnf
from tests.gbnf_check import gbnf_accepts, naive_accepts, parse_gbnf

# ---- strategies -----------------------------------------------------------------------------------

_WORDS = ["you", "can", "use", "end", "to", "Here's", "an", "example", "é", "rather", "than", "A", "a", "I"]
PHRASES = st.lists(st.lists(st.sampled_from(_WORDS), min_size=2, max_size=4).map(" ".join), min_size=1, max_size=4,
                   unique=True)


@st.composite
def texts(draw, phrases):
    """Strings that hit the phrases' edges: pieces of the phrases, their case variants, word and
    boundary characters, non-ASCII letters and quotes around them."""
    pieces = [*phrases, *(p.upper() for p in phrases), *(p[:-1] for p in phrases), *(p[1:] for p in phrases),
              *_WORDS, " ", "  ", "\n", "x", "_", "9", ".", "’", "é", "Ω", "'", "(", "YOU", "You"]
    return "".join(draw(st.lists(st.sampled_from(pieces), max_size=12)))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), phrases=PHRASES, case=st.sampled_from(["rules", "fold"]))
@example(data=None, phrases=["you can use"], case="rules")
@example(data=None, phrases=["you é"], case="fold")          # "YOU É": a non-ASCII letter in either case
def test_automaton_and_grammar_accept_exactly_the_texts_without_a_phrase(data, phrases, case):
    dfa = exclusion(patterns(phrases, case))
    rules = parse_gbnf(render_gbnf(dfa, ["a header line"]))
    samples = ["you can use", "xyou can use", "You can user", "yOu can use", "éyou can use", "you can us",
               "(You can use it", "you  can use", "", "Here's an example", "here's an example", "YOU É"]
    if data is not None:
        samples += [data.draw(texts(phrases)) for _ in range(40)]
    for s in samples:
        want = naive_accepts(s, phrases, case)
        assert dfa.accepts(s) == want, (s, phrases, case)
        assert gbnf_accepts(rules, s) == want, (s, phrases, case)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), phrases=PHRASES)
def test_every_occurrence_the_matcher_counts_is_refused(data, phrases):
    """The grammar is stricter than solvers.phrases.text_occurrences (whole words, Unicode word
    characters), never looser."""
    dfa = exclusion(patterns(phrases))
    for _ in range(40):
        s = data.draw(texts(phrases))
        if sum(text_occurrences(s, phrases)):
            assert not dfa.accepts(s), (s, phrases)


def test_grammar_is_deterministic_and_every_state_accepts():
    """One alternative per character in every rule (a second path would accept what the first refuses)."""
    phrases = ["you can use", "Here's an example", "end to end", "rather than", "an example of this"]
    dfa = exclusion(patterns(phrases, "fold"))
    rules = parse_gbnf(render_gbnf(dfa))
    probe = sorted(set("".join(phrases) + "ÉéΩ’ _9\n\tzZ'"))
    assert rules.pop("root") == [(None, "s0")]
    for name, alts in rules.items():
        assert any(pred == "" for pred, _ in alts), name
        for ch in probe:
            assert sum(1 for pred, _ in alts if callable(pred) and pred(ch)) <= 1, (name, ch)


def test_case_modes():
    rules_case = exclusion(patterns(["you can use"]))
    fold = exclusion(patterns(["you can use"], "fold"))
    assert not rules_case.accepts("You can use")
    assert rules_case.accepts("You Can Use") and rules_case.accepts("YOU CAN USE")
    assert not fold.accepts("You Can Use") and not fold.accepts("YOU CAN USE")
    assert not exclusion(patterns(["Here's an example"])).accepts("Here's an example")


def test_state_cap_is_refused_with_our_error():
    with pytest.raises(GrammarError, match="more than 5 automaton states"):
        exclusion(patterns(["you can use", "end to end"]), max_states=5)
    with pytest.raises(ValueError):
        patterns([], "rules")
    with pytest.raises(ValueError):
        patterns(["a b"], "upper")


def test_char_class_escapes_everything_but_ascii_letters_and_digits():
    assert char_class([ord(c) for c in "abcz"], False) == "[a-cz]"
    assert char_class([ord("]"), ord("\\"), ord("^"), ord("-")], True) == "[^\\x2D\\x5C-\\x5E]"
    assert char_class([0x2019, 0x1F600], False) == "[\\u2019\\U0001F600]"


def test_a_thousand_phrases_stay_small_and_exact():
    """The size a long list makes (the numbers docs/rules-where.md gives) and the automaton still
    exact on the list's own phrases."""
    import random

    rng = random.Random(0)
    words = ["the", "a", "of", "to", "and", "in", "is", "you", "it", "that", "for", "on", "with", "as", "can", "be",
             "this", "are", "here", "example", "use", "data", "file", "let", "me", "we", "will", "your", "note"]
    phrases = sorted({" ".join(rng.choice(words) for _ in range(rng.randint(2, 4))) for _ in range(1000)})
    dfa = exclusion(patterns(phrases))
    assert dfa.states < 20_000
    for p in phrases[:60]:
        for s in (f"So {p} then", f"So {p[:-1]}", f"So{p}", f"So {p.upper()}"):
            assert dfa.accepts(s) == naive_accepts(s, phrases), s
        assert not dfa.accepts(f"So {p} then")


def test_patterns_naming_every_ascii_word_character():
    """No empty class: when the phrases name every ASCII word character, the other-word column holds
    none and its alternative is left out (GBNF has no empty class)."""
    import string

    words = [c + c for c in string.ascii_letters + string.digits + "_"]
    phrases = [f"{a} {b}" for a, b in zip(words, words[1:])]
    dfa = exclusion(patterns(phrases))
    text = render_gbnf(dfa, ["two\nlines"])
    assert "[]" not in text and "# two lines\n" in text
    rules = parse_gbnf(text)
    for s in ("aa bb", "xaa bb", "zz AA", "99 __", "__ aa", "aa  bb"):
        assert gbnf_accepts(rules, s) == dfa.accepts(s) == naive_accepts(s, phrases), s
