"""Tokens and sentences: words keep inner apostrophes and hyphens, punctuation is kept, markup and
quotes are dropped, sentence ends, blank lines, block lines, code and URLs are boundaries, and the
offsets point at the characters written."""
from __future__ import annotations

import pytest

from exactedit.evals.discover.tokens import is_final, is_punct, normalize, sentences


def toks(text: str) -> list[list[str]]:
    return [[t[0] for t in s] for s in sentences(text)]


@pytest.mark.parametrize("text, want", [
    ("Here's an example. It's fine!", [["Here's", "an", "example", "."], ["It's", "fine", "!"]]),
    ("end. To be", [["end", "."], ["To", "be"]]),
    ("don't stop, end-to-end: 3.14 — ok", [["don't", "stop", ",", "end-to-end", ":", "3.14", "—", "ok"]]),
    ("Wait... what?! yes", [["Wait", "…"], ["what", "?!"], ["yes"]]),
    ("a … b", [["a", "…"], ["b"]]),
    ("e.g. this, i.e. that. U.S. law vs. Dr. Who etc. end", [["e.g.", "this", ",", "i.e.", "that", "."],
                                                              ["U.S.", "law", "vs.", "Dr.", "Who", "etc.", "end"]]),
    ("(see above.) Then", [["(", "see", "above", ".", ")"], ["Then"]]),
    ("file.txt and x.y", [["file.txt", "and", "x.y"]]),
    ("snake_case __init__ *bold* **Note**: \"quoted\" 'single'", [["snake_case", "init", "bold", "Note", ":",
                                                                    "quoted", "single"]]),
    ("ship it 🚀✅ now", [["ship", "it", "🚀", "✅", "now"]]),
    ("a - b -- c", [["a", "-", "b", "--", "c"]]),
])
def test_tokens_and_sentence_ends(text, want):
    assert toks(text) == want


def test_curly_quotes_are_straight_and_offsets_stay_valid():
    text = "\u201cHere\u2019s\u201d the \u2018thing\u2019."
    assert normalize(text) == "\"Here's\" the 'thing'."
    (sent,) = sentences(text)
    assert [t[0] for t in sent] == ["Here's", "the", "thing", "."]
    assert [text[s:e] for _, s, e, _ in sent] == ["Here\u2019s", "the", "thing", "."]


def test_lines_paragraphs_lists_headings_quotes_and_tables():
    text = ("# A Heading\nA paragraph that\nwraps here and\n\nanother one\n- item one\n* item two\n"
            "1. numbered\n> quoted - [ ] text\n**Bold line**\nplain\n| a b | c |\n|---|---|\n---\nlast")
    assert toks(text) == [["A", "Heading"], ["A", "paragraph", "that", "wraps", "here", "and"], ["another", "one"],
                          ["item", "one"], ["item", "two"], ["numbered"], ["quoted", "-", "text"], ["Bold", "line"],
                          ["plain"], ["a", "b"], ["c"], ["last"]]


def test_code_urls_and_tags_are_boundaries():
    text = ("Before code\n```python\nprint('in code. Not counted')\n```\nafter it. Use `x.y()` to see "
            "https://example.com/a.b, then <br/> more.\n~~~\nunclosed fence runs to the end")
    assert toks(text) == [["Before", "code"], ["after", "it", "."], ["Use"], ["to", "see"], [",", "then"],
                          ["more", "."]]


def test_space_flags_say_how_the_phrase_was_written():
    (sent,) = sentences("end—to end — to (it) **so**")
    assert [(t[0], t[3]) for t in sent] == [("end", False), ("—", False), ("to", False), ("end", True), ("—", True),
                                            ("to", True), ("(", True), ("it", False), (")", False), ("so", True)]


def test_punctuation_alone_is_no_sentence():
    assert toks("see https://x.org. Then") == [["see"], ["Then"]]
    assert toks("...\n\n!!!") == []


def test_predicates():
    assert is_punct(",") and is_punct("?!") and is_punct("—") and is_punct("--") and not is_punct("a")
    assert is_final("?!") and is_final("…") and not is_final(",") and not is_final("")
