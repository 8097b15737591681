"""The language's evidence: the Poisson lower bound (its defining equation, monotone in the count, the
exposure and the confidence, and its coverage checked exactly against the Poisson distribution), the
rarest-word bound of a gram's rate, wordfreq's languages and the refusal of one it lacks."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.stats import poisson

from exactedit.evals.discover.language import check_lang, floor, poisson_lower, rarest, word_freqs
from exactedit.evals.discover.ngrams import count_grams, encode, gram_table
from exactedit.evals.discover.ranking import DiscoverConfig, discover

counts = st.integers(0, 5000)
exposures = st.floats(1.0, 1e7, allow_nan=False)
confidences = st.floats(0.5, 0.999)


@settings(max_examples=200, deadline=None)
@given(counts, exposures, confidences)
@example(1, 1.0, 0.95)
@example(0, 10.0, 0.95)
def test_the_bound_solves_its_defining_equation(y, w, c):
    """P(Poisson(bound * exposure) >= y) = 1 - confidence (Garwood's exact one-sided bound); 0 at y = 0."""
    low = float(poisson_lower(y, w, c))
    if y == 0:
        assert low == 0.0
        return
    assert 0 < low < y / w
    assert math.isclose(poisson.sf(y - 1, low * w), 1 - c, rel_tol=1e-6)


@settings(max_examples=200, deadline=None)
@given(counts, exposures, confidences, st.floats(0.5, 0.999))
def test_the_bound_is_monotone(y, w, c1, c2):
    lo, hi = sorted((c1, c2))
    b = poisson_lower([y, y + 1], w, lo)
    assert b[0] <= b[1]                                                  # more uses, a higher bound
    assert poisson_lower(y, w, hi) <= poisson_lower(y, w, lo) + 1e-15    # more confidence, a lower bound
    assert poisson_lower(y, 2 * w, lo) <= poisson_lower(y, w, lo)        # the same uses in more words: lower


@pytest.mark.parametrize("rate", [0.01, 0.3, 1.0, 2.5, 7.0, 20.0, 55.0])
@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_the_bound_covers_the_true_rate(rate, confidence):
    """Exact coverage: summed over the Poisson distribution, the bound lies above the true rate with
    probability at most 1 - confidence (it holds at least `confidence` of the time)."""
    ys = np.arange(int(rate + 40 * math.sqrt(rate) + 60))
    above = poisson_lower(ys, 1.0, confidence) > rate
    miss = float(poisson.pmf(ys, rate)[above].sum())
    assert miss <= 1 - confidence + 1e-9


def test_the_table_of_whole_counts_agrees_with_the_quantile_per_count():
    whole = np.array([0.0, 3.0, 7.0, 3.0, 120.0])
    mixed = np.append(whole, 2.5)                      # a fractional count: the per-distinct-count path
    assert np.array_equal(poisson_lower(whole, 50.0, 0.9), poisson_lower(mixed, 50.0, 0.9)[:5])
    assert 0 < poisson_lower(2.5, 1.0, 0.9) < poisson_lower(3.0, 1.0, 0.9)


def test_the_bound_refuses_what_is_no_rate():
    for bad in (dict(count=-1, exposure=1.0, confidence=0.9), dict(count=1, exposure=0.0, confidence=0.9),
                dict(count=1, exposure=1.0, confidence=1.0), dict(count=math.nan, exposure=1.0, confidence=0.9)):
        with pytest.raises(ValueError):
            poisson_lower(**bad)


def test_a_grams_rate_is_bounded_by_its_rarest_word():
    from wordfreq import word_frequency

    stream = encode(["We delve into it, and then we delve into the rest — twice."], ["x"])
    levels = count_grams(stream, 3)
    freqs = word_freqs(stream.keys, "en")
    assert all(np.isnan(f) == (k in {",", "—", "."}) for k, f in zip(stream.keys, freqs))
    bound = rarest(levels, freqs)
    for n in (1, 2, 3):
        for g, b in zip(gram_table(stream, levels, n), bound[n - 1]):
            words = [w for w in g if w not in {",", "—", "."}]
            if not words:
                assert np.isnan(b), g
            else:
                assert b == min(word_frequency(w, "en", minimum=floor("en")) for w in words), g


def test_languages_wordfreq_has_and_one_it_lacks():
    assert check_lang("de") == "de" and floor("en") == 1e-8 and floor("bg") == 1e-6
    with pytest.raises(ValueError, match="wordfreq has no word list for language 'xx'; it has .*de, .*en"):
        check_lang("xx")
    with pytest.raises(ValueError, match="language 'klingon'"):
        DiscoverConfig(lang="klingon")


def test_german_background_lists_a_german_phrase():
    """--lang de: the language's evidence against German word frequencies: a German phrase the model
    repeats is listed with a few lines of the user's, its bound the German rate of its rarest word;
    with the English list the same words get English rates (or the floor)."""
    from wordfreq import top_n_list, word_frequency

    rng = np.random.default_rng(0)
    words = [w for w in top_n_list("de", 400) if w.isalpha()]
    planted = "es ist wichtig zu beachten"

    def filler(k):
        return " ".join(rng.choice(words, k))

    model = [f"{filler(12).capitalize()}. {planted.capitalize()}, {filler(8)}. {filler(10).capitalize()}."
             for _ in range(30)]
    human = [f"{filler(15).capitalize()}." for _ in range(4)]
    for lang in ("de", "en"):
        d = discover(model, human, lang=lang)
        hit = [p for p in d.phrases if "wichtig zu beachten" in p.phrase.lower()]
        assert hit and d.to_dict()["settings"]["lang"] == lang, [p.phrase for p in d.phrases]
        p = hit[0]
        rarest_word = min(word_frequency(w, lang, minimum=floor(lang)) for w in p.phrase.lower().strip(",").split())
        assert math.isclose(p.lang_per_1k, 1000 * rarest_word)
        assert p.evidence in ("language", "both") and p.lang_ratio_low >= 5
    assert word_frequency("beachten", "de") > 100 * word_frequency("beachten", "en", minimum=floor("en"))
