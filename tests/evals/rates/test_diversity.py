"""evals.rates.diversity: the O(n) MATTR equals the definition (every window's distinct words,
counted with a set), the short-text and empty cases, and the word tokens (discover's)."""
from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from exactedit.evals.rates.diversity import DiversityError, diversity, mattr, words


def naive_mattr(ws: list[str], window: int) -> float:
    """The definition, written out: the mean of each window's distinct / window (exact fractions),
    the plain type-token ratio below one window, NaN for no words."""
    if not ws:
        return math.nan
    if len(ws) < window:
        return len(set(ws)) / len(ws)
    ratios = [Fraction(len(set(ws[s:s + window])), window) for s in range(len(ws) - window + 1)]
    return float(sum(ratios) / len(ratios))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), max_size=80), st.integers(1, 25))
@example(["a", "b", "a", "b"], 2)           # a word leaving as the same word enters
@example(["a", "a", "b"], 3)                # exactly one window
@example(["a"], 1)
@example([], 5)
def test_sliding_count_equals_the_definition(ws, window):
    got, want = mattr(ws, window), naive_mattr(ws, window)
    assert (math.isnan(got) and math.isnan(want)) or got == want   # both the exact mean, correctly rounded


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=3), min_size=1, max_size=200), st.integers(1, 60))
def test_any_strings(ws, window):
    assert mattr(ws, window) == naive_mattr(ws, window)


@pytest.mark.parametrize("ws, window, want", [
    (["a", "b", "a"], 5, 2 / 3),                        # fewer words than the window: plain TTR
    (["x", "y", "z"], 500, 1.0),
    ([f"w{i}" for i in range(40)], 7, 1.0),             # all distinct
    (["same"] * 30, 4, 1 / 4),                          # one repeated word: 1 / window
    (["same"] * 30, 1, 1.0),                            # a window of one word is always distinct
    (["a", "b", "a", "b"], 2, 1.0),                     # ab, ba, ab
    (["a", "b", "a", "b"], 3, 2 / 3),                   # aba, bab
    (["a", "a", "b", "c"], 2, (1 + 2 + 2) / 6),         # aa, ab, bc
])
def test_hand_examples(ws, window, want):
    assert mattr(ws, window) == pytest.approx(want, rel=1e-15)


def test_no_words_is_nan():
    assert math.isnan(mattr([], 3))


@pytest.mark.parametrize("window", [0, -1, True, 2.5, "500", None])
def test_bad_window_is_refused(window):
    with pytest.raises(DiversityError, match="window"):
        mattr(["a"], window)
    with pytest.raises(DiversityError, match="window"):
        diversity(["a"], window)


@pytest.mark.parametrize("text, want", [
    ("Don't stop—it's 3.14, OK?", ["don't", "stop", "it's", "3.14", "ok"]),
    ("Don\u2019t panic", ["don't", "panic"]),                      # curly apostrophe made straight
    ("end-to-end tests, e.g. these", ["end-to-end", "tests", "e.g.", "these"]),
    ("**Bold** _under_ \"quoted\" (aside)", ["bold", "under", "quoted", "aside"]),
    ("ship it 🚀✅ now!!!", ["ship", "it", "now"]),                 # emoji and punctuation dropped
    ("Run:\n\n```python\nx = 1\n```\n\nDone.", ["run", "done"]),   # fenced code is not prose
    ("see https://example.com/a_b or `code` here", ["see", "or", "here"]),
    ("Über 2 Straßen", ["über", "2", "straßen"]),
    ("", []),
    ("... — ; !", []),
])
def test_words(text, want):
    assert words(text) == want


def test_diversity_counts_words_and_types():
    d = diversity(["The cat sat.", "The cat ran!"], window=3)
    ws = ["the", "cat", "sat", "the", "cat", "ran"]
    assert d == {"words": 6, "types": 4, "mattr": mattr(ws, 3), "window": 3}


def test_reply_boundaries_do_not_reset_the_window():
    """Two replies "a b" / "a b": one stream a b a b, windows of 3 see aba and bab (2/3 each);
    restarting per reply would give each reply's plain TTR, 1.0."""
    assert diversity(["a b", "a b"], window=3)["mattr"] == pytest.approx(2 / 3)
    assert diversity(["a b a b"], window=3) == diversity(["a b", "a b"], window=3)


def test_diversity_of_nothing():
    assert diversity([]) == {"words": 0, "types": 0, "mattr": None, "window": 500}
    assert diversity(["", "!!!"], window=2) == {"words": 0, "types": 0, "mattr": None, "window": 2}
