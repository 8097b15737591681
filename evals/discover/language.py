"""The second reference of `discover`: written language at large, from wordfreq's word frequencies.

    check_lang(lang) -> str                                a language wordfreq has, else ValueError naming them
    word_freqs(keys, lang) -> float64 [K]                  each key token's frequency per word (NaN: punctuation)
    rarest(levels, freqs) -> list of float64 [T]           per order: the frequency of each gram's rarest word
    poisson_lower(count, exposure, confidence) -> float64  one-sided lower confidence bound of a Poisson rate

A phrase's rate in written language is bounded above by the rate of its rarest word: every use of
"delve into" is a use of "delve" (wordfreq: 1.4e-6 per word). The bound is what `discover` compares the
model's rate with, so the ratio it reports (model rate over the bound) is itself a lower bound of the
phrase's true over-use: "40 in 21,000 words" is 1.9e-3 per word, at least 1,380 times English. It is
loose for phrases of common words ("it's important to note that": the bound is "note", 1.1e-4), and
never wrong in the direction that matters: it cannot call a phrase over-used because the product of
its words' frequencies is small (independent words put far too little mass on real phrases).

Words are looked up with `wordfreq.word_frequency(word, lang)`, which lowercases and tokenizes as its
lists were built (a hyphenated or otherwise split word gets wordfreq's combined estimate, below its
rarest part); a word wordfreq does not list gets the smallest frequency of the language's list
(`floor`: 1e-8 for the large lists, 1e-6 for the small ones). Punctuation is not a word there: a
gram of punctuation alone has no rate in the language (NaN), and punctuation never is the rarest word.

The model's rate is a Poisson rate: `count` uses in `exposure` words. Its exact (Garwood) one-sided
lower bound at `confidence` is chi2.ppf(1 - confidence, 2 count) / 2 / exposure, the rate at which
count or more uses have probability 1 - confidence (0 for a count of 0): a bound that holds at least
`confidence` of the time whatever the true rate.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from exactedit.evals.discover.tokens import is_punct

#: per wordlist: the smallest frequency it lists, given to words it does not list
FLOORS = {"large": 1e-8, "small": 1e-6}
#: whole counts up to this get their chi-square quantiles from one table
TABLE_MAX = 10_000_000


def available() -> tuple[str, ...]:
    """The language codes wordfreq has a word list for."""
    from wordfreq import available_languages

    return tuple(sorted(available_languages("best")))


def check_lang(lang: str) -> str:
    """`lang` when wordfreq has its words, else a ValueError naming the languages it has."""
    codes = available()
    if not isinstance(lang, str) or lang not in codes:
        raise ValueError(f"wordfreq has no word list for language {lang!r}; it has {', '.join(codes)}")
    return lang


def floor(lang: str) -> float:
    """The frequency wordfreq's list for `lang` gives a word it does not list (its smallest)."""
    from wordfreq import available_languages

    return FLOORS["large" if lang in available_languages("large") else "small"]


def word_freqs(keys: Sequence[str], lang: str) -> np.ndarray:
    """Per key token, its frequency per word in written `lang` (at least `floor(lang)`); NaN for
    punctuation."""
    from wordfreq import word_frequency

    low = floor(check_lang(lang))
    out = np.full(len(keys), np.nan)
    for i, k in enumerate(keys):
        if not is_punct(k):
            out[i] = word_frequency(k, lang, minimum=low)
    return out


def rarest(levels, freqs: np.ndarray) -> list[np.ndarray]:
    """Per order (levels from ngrams.count_grams), each gram's rarest-word frequency: the upper bound
    of its rate in the language; NaN for a gram of punctuation only."""
    out: list[np.ndarray] = []
    for lv in levels:
        last = freqs[lv.last]
        if out:
            prev = out[-1][lv.prefix]
            last = np.fmin(prev, last)             # fmin: NaN (punctuation) never wins
        out.append(last)
    return out


def poisson_lower(count, exposure, confidence: float) -> np.ndarray:
    """The one-sided lower confidence bound at `confidence` of the rate of a Poisson count seen in
    `exposure` units (elementwise; 0 where the count is 0). Counts repeat: the chi-square quantile is
    taken once per count (a table over 0..max for whole counts, else per distinct count)."""
    from scipy.stats import chi2

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    count, exposure = np.broadcast_arrays(np.asarray(count, np.float64), np.asarray(exposure, np.float64))
    if np.any(count < 0) or np.any(exposure <= 0) or not np.all(np.isfinite(count)):
        raise ValueError("poisson_lower needs finite counts >= 0 and exposures > 0")
    top = float(count.max(initial=0.0))
    if top <= TABLE_MAX and np.all(count == np.floor(count)):
        table = np.concatenate(([0.0], chi2.ppf(1.0 - confidence, 2.0 * np.arange(1, int(top) + 1)) / 2.0))
        return table[count.astype(np.int64)] / exposure
    uniq, inv = np.unique(count, return_inverse=True)
    low = np.zeros(uniq.shape)
    pos = uniq > 0
    low[pos] = chi2.ppf(1.0 - confidence, 2.0 * uniq[pos]) / 2.0
    return low[inv.reshape(count.shape)] / exposure
