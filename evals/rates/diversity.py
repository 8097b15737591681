"""Lexical diversity of generated replies: the moving-average type-token ratio (MATTR).

An anti-slop edit that bans phrases can push a model towards a smaller, more repetitive
vocabulary (the same safe substitute everywhere). The plain type-token ratio cannot show that
across runs, because it falls with the length of the text; MATTR (Covington & McFall, 2010) does
not: it is the mean, over every window of `window` consecutive words, of the window's distinct
words divided by `window`, so texts of different lengths compare on the same scale.

    words(text) -> list[str]                      the word tokens, lowercased
    mattr(words, window=500) -> float             NaN for no words
    diversity(texts, window=500) -> dict          {"words", "types", "mattr", "window"}

Words are those of `exactedit discover` (evals/discover/tokens.py), so the two count the same
units: letters and digits joined inside by an apostrophe, a hyphen, a dot or an underscore
("don't", "end-to-end", "3.14"), curly apostrophes made straight; punctuation, emoji and markup
are dropped, and so are fenced code blocks, inline code and URLs (code is not prose).
"""
from __future__ import annotations

import math
from typing import Sequence

from exactedit.evals.discover.tokens import is_punct, sentences
from exactedit.errors import FieldError

DEFAULT_WINDOW = 500


class DiversityError(FieldError):
    """A diversity measure was asked for with an impossible setting (names the field)."""


def words(text: str) -> list[str]:
    """The word tokens of `text`, lowercased, in order (see the module doc for what a word is).
    A token is a word when it starts with a letter or digit: punctuation tokens never do, and an
    emoji or dingbat is no letter."""
    return [t[0].lower() for s in sentences(text) for t in s if t[0][:1].isalnum() and not is_punct(t[0])]


def _check_window(window) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise DiversityError("mattr", "window", f"expected an integer >= 1, got {window!r}")
    return window


def mattr(words: Sequence[str], window: int = DEFAULT_WINDOW) -> float:
    """The moving-average type-token ratio of `words` over windows of `window` words.

    With at least `window` words: the mean over the n - window + 1 windows of (distinct words in
    the window) / window, computed in O(n) by sliding one count table along the words (each step
    adds the word entering and drops the one leaving). The distinct counts are summed as integers
    and divided once, so the value is the exact mean correctly rounded.
    With fewer words than `window` there is no full window: the plain type-token ratio of all of
    them (distinct / n), which is what the one window would give if the text were that long.
    With no words: NaN (a float, like every other value; there is nothing to measure).
    """
    window = _check_window(window)
    seq = list(words)
    n = len(seq)
    if n == 0:
        return math.nan
    if n <= window:
        return len(set(seq)) / n
    counts: dict[str, int] = {}
    for w in seq[:window]:
        counts[w] = counts.get(w, 0) + 1
    distinct = len(counts)
    total = distinct
    for i in range(window, n):
        new, old = seq[i], seq[i - window]
        if new != old:
            c = counts.get(new, 0)
            counts[new] = c + 1
            if c == 0:
                distinct += 1
            c = counts[old] - 1
            if c:
                counts[old] = c
            else:
                del counts[old]
                distinct -= 1
        total += distinct
    return total / ((n - window + 1) * window)


def diversity(texts: Sequence[str], window: int = DEFAULT_WINDOW) -> dict:
    """Lexical diversity of `texts` (e.g. the sampled replies of one model), taken as one text:
    their words concatenated in order, the window sliding across reply boundaries. A reply is
    usually far shorter than the window (a few hundred words against 500), so restarting the
    window at each reply would measure each reply's plain TTR, which depends on its length: the
    very bias MATTR exists to remove.

    Returns {"words": n, "types": distinct words, "mattr": value, "window": window}; "mattr" is
    None when there are no words (NaN has no JSON form, and reports are written without NaN)."""
    window = _check_window(window)
    ws = [w for t in texts for w in words(t)]
    value = mattr(ws, window)
    return {"words": len(ws), "types": len(set(ws)), "mattr": None if math.isnan(value) else value,
            "window": window}
