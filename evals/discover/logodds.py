"""The log-odds ratio with an informative Dirichlet prior (Monroe, Colaresi & Quinn 2008, "Fightin'
Words"), and the background distributions its prior comes from.

    log_odds(y_m, y_h, n_m, n_h, alpha, alpha_total) -> LogOdds(delta, var, z)
    prior(p, alpha0, alpha_min) -> (alpha, alpha_total)
    wordfreq_token_logp(keys, human_counts, lang) -> float64 [K]   log p of each key token (wordfreq)
    normalized(logp) -> float64 [T]                           per order: p summing to 1 over the grams

For a gram w with counts y_m (model) and y_h (human) out of n_m and n_h grams of its order, and a
prior alpha_w with total alpha_total:

    delta_w = log((y_m + a_w) / (n_m + a_tot - y_m - a_w)) - log((y_h + a_w) / (n_h + a_tot - y_h - a_w))
    var_w  ~= 1 / (y_m + a_w) + 1 / (y_h + a_w)          z_w = delta_w / sqrt(var_w)

The prior is alpha_w = alpha0 * p_background(w), p summing to 1 over the grams of the order, so
alpha_total = alpha0: the background is worth alpha0 grams. One guard is added (`prior`): no gram's
alpha is below `alpha_min` (one pseudo-occurrence by default). Without it a gram that the background
calls rare and the user never wrote has var ~ 1/alpha_w, huge, and a z near 0 however often the model
says it ("delve into": p ~ 1e-8, alpha ~ 1e-5). The floor raises that gram's own alpha only; its
alpha_total is alpha_w + alpha0 * (1 - p_w) (the gram against the rest of the vocabulary, the rest
keeping its background mass), equal to alpha0 where the floor is not reached. Adding every gram's
floor to one common total instead would make the total grow with the number of distinct grams (about
the corpus size) and shrink the smaller corpus toward the background: a bias towards the larger one.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from exactedit.evals.discover.language import FLOORS, word_freqs
from exactedit.evals.discover.tokens import is_punct

#: the least background share left to the rest of the vocabulary beside one gram
REST_MIN = 1e-9
#: wordfreq's smallest frequency in its large English list: unknown words get this much
WORDFREQ_FLOOR = FLOORS["large"]


class LogOdds(NamedTuple):
    delta: np.ndarray    # the posterior log-odds ratio, model over human
    var: np.ndarray      # its approximate variance
    z: np.ndarray        # delta / sqrt(var)


def log_odds(y_m, y_h, n_m, n_h, alpha, alpha_total) -> LogOdds:
    """Monroe et al.'s delta, variance and z, elementwise (arrays broadcast; float64)."""
    y_m, y_h, alpha = (np.asarray(x, np.float64) for x in (y_m, y_h, alpha))
    n_m, n_h, alpha_total = (np.asarray(x, np.float64) for x in (n_m, n_h, alpha_total))
    am, ah = y_m + alpha, y_h + alpha
    rest_m = (n_m - y_m) + (alpha_total - alpha)       # n + a_tot - y - a, grouped so that a rest
    rest_h = (n_h - y_h) + (alpha_total - alpha)       # much smaller than a_tot loses no digits
    if not (np.all(alpha > 0) and np.all(rest_m > 0) and np.all(rest_h > 0)):
        raise ValueError("log_odds needs alpha > 0 and n + alpha_total - y - alpha > 0 on both sides")
    delta = (np.log(am) - np.log(rest_m)) - (np.log(ah) - np.log(rest_h))
    var = 1.0 / am + 1.0 / ah
    return LogOdds(delta, var, delta / np.sqrt(var))


def prior(p, alpha0: float, alpha_min: float) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, alpha_total) per gram: alpha0 * p floored at alpha_min; the total is the gram's alpha
    plus the rest's background mass alpha0 * (1 - p), kept at least alpha0 * REST_MIN (a gram whose p
    rounds to 1 would leave the rest nothing, and a side made of that gram alone a log of 0)."""
    p = np.asarray(p, np.float64)
    alpha = np.maximum(alpha0 * p, alpha_min)
    return alpha, alpha + alpha0 * np.maximum(1.0 - p, REST_MIN)


def normalized(logp) -> np.ndarray:
    """exp(logp) scaled to sum to 1 (computed in log space: products of many small frequencies)."""
    logp = np.asarray(logp, np.float64)
    top = logp.max()
    return np.exp(logp - top - np.log(np.exp(logp - top).sum()))


def wordfreq_token_logp(keys: Sequence[str], human_counts, lang: str = "en", freqs=None) -> np.ndarray:
    """log p of each key token in written `lang`. Words (and emoji) from `wordfreq` (at least its
    list's smallest frequency: WORDFREQ_FLOOR for English), scaled by the share of words among the
    human corpus's tokens; punctuation, which wordfreq does not list, from the human corpus itself:
    its count there plus one, over the human tokens plus the number of punctuation keys. An n-gram's
    background is the product over its tokens, normalized per order (`normalized`). `freqs`: the
    words' frequencies already looked up (language.word_freqs), NaN at punctuation."""
    counts = np.asarray(human_counts, np.float64)
    punct = np.fromiter((is_punct(k) for k in keys), bool, len(keys))
    total = max(counts.sum(), 1.0)
    word_share = max(counts[~punct].sum(), 1.0) / total
    freqs = word_freqs(keys, lang) if freqs is None else np.asarray(freqs, np.float64)
    out = np.where(punct, (counts + 1.0) / (total + punct.sum()), word_share * np.nan_to_num(freqs, nan=1.0))
    return np.log(out)
