"""Monroe et al.'s log-odds ratio: the vectorized statistic against its scalar definition
(hypothesis), the prior (floor, totals), the per-order normalization, the backgrounds, and the z of
every scored gram recomputed from plain counts and the formula."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from exactedit.evals.discover.logodds import (WORDFREQ_FLOOR, log_odds, normalized, prior,
                                              wordfreq_token_logp)
from exactedit.evals.discover.ngrams import count_grams, encode, gram_table
from exactedit.evals.discover.ranking import DiscoverConfig, _score_levels
from exactedit.evals.discover.tokens import is_punct


def scalar(y_m, y_h, n_m, n_h, a, a_tot):
    """The definition, one gram at a time (the rest n + a_tot - y - a summed as counts plus prior)."""
    delta = math.log((y_m + a) / ((n_m - y_m) + (a_tot - a))) - math.log((y_h + a) / ((n_h - y_h) + (a_tot - a)))
    var = 1 / (y_m + a) + 1 / (y_h + a)
    return delta, var, delta / math.sqrt(var)


@st.composite
def grams(draw):
    n_m, n_h = draw(st.integers(1, 10**7)), draw(st.integers(1, 10**7))
    k = draw(st.integers(1, 20))
    y_m = draw(st.lists(st.integers(0, n_m), min_size=k, max_size=k))
    y_h = draw(st.lists(st.integers(0, n_h), min_size=k, max_size=k))
    p = np.array(draw(st.lists(st.floats(1e-12, 1.0), min_size=k, max_size=k)))
    p = p / p.sum() if draw(st.booleans()) else p             # a distribution, or any shares up to 1
    alpha0 = draw(st.floats(1e-3, 1e7))
    alpha_min = draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    return np.array(y_m), np.array(y_h), n_m, n_h, p, alpha0, alpha_min


@given(grams())
@example((np.array([5]), np.array([0]), 100, 100, np.array([1.0]), 10.0, 1.0))
@example((np.array([0]), np.array([7]), 7, 50, np.array([1e-12]), 1e-3, 0.0))
@example((np.array([0]), np.array([1]), 1, 1, np.array([1.0]), 1.0, 0.0))       # p = 1: the rest keeps REST_MIN
@example((np.array([0, 0, 87, 0]), np.array([0, 0, 0, 0]), 196, 1,               # delta ~ 3e-7 from logs ~ 15
          np.array([2, 1.25, 4, 1.75]) / 9, 4364527.0, 0.0))
@settings(max_examples=300, deadline=None)
def test_vectorized_equals_the_scalar_definition(case):
    y_m, y_h, n_m, n_h, p, alpha0, alpha_min = case
    alpha, total = prior(p, alpha0, alpha_min)
    got = log_odds(y_m, y_h, n_m, n_h, alpha, total)
    for i in range(len(y_m)):
        a, a_tot = float(alpha[i]), float(total[i])
        want = scalar(int(y_m[i]), int(y_h[i]), n_m, n_h, a, a_tot)
        # delta is a difference of four logs: when it is near 0 the logs cancel, and both ways of
        # computing it can only agree to a few ulps of the largest log, not of delta itself
        logs = [y_m[i] + a, (n_m - y_m[i]) + (a_tot - a), y_h[i] + a, (n_h - y_h[i]) + (a_tot - a)]
        cancel = 64 * np.finfo(np.float64).eps * sum(abs(math.log(x)) + 1 for x in logs)
        assert math.isclose(got.delta[i], want[0], rel_tol=1e-9, abs_tol=cancel)
        assert math.isclose(got.var[i], want[1], rel_tol=1e-12)
        assert math.isclose(got.z[i], want[2], rel_tol=1e-9, abs_tol=cancel / math.sqrt(want[1]))


def test_log_odds_refuses_terms_it_cannot_take_the_log_of():
    with pytest.raises(ValueError):
        log_odds([1], [1], 10, 10, 0.0, 5.0)
    with pytest.raises(ValueError):
        log_odds([10], [1], 10, 10, 1.0, 1.0)


def test_prior_floor_and_totals():
    alpha, total = prior([0.5, 1e-9, 0.0], 1000.0, 1.0)
    assert alpha.tolist() == [500.0, 1.0, 1.0]
    assert np.allclose(total, [1000.0, 1.0 + 1000.0 * (1 - 1e-9), 1001.0])      # alpha0 where no floor is hit
    alpha, total = prior([0.25, 0.75], 8.0, 0.0)
    assert alpha.tolist() == [2.0, 6.0] and total.tolist() == [8.0, 8.0]
    alpha, total = prior([1.0], 8.0, 0.0)
    assert alpha.tolist() == [8.0] and total.tolist() == [8.0 + 8.0 * 1e-9]


def test_log_odds_signs_and_symmetry():
    lo = log_odds([30, 10, 10], [10, 30, 10], 1000, 1000, 1.0, 100.0)
    assert lo.z[0] > 0 > lo.z[1] and lo.z[2] == 0 and math.isclose(lo.z[0], -lo.z[1])


def test_normalized_sums_to_one_in_log_space():
    p = normalized(np.log([1e-300, 2e-300, 1e-300]))
    assert np.allclose(p, [0.25, 0.5, 0.25]) and math.isclose(p.sum(), 1.0)


def test_wordfreq_token_background():
    from wordfreq import word_frequency

    keys = ["the", ",", "—", "zzqxv", "delve"]
    counts = np.array([6, 3, 0, 1, 0])                     # the human corpus: 7 words, 3 punctuation tokens
    p = np.exp(wordfreq_token_logp(keys, counts))
    share = 7 / 10
    assert math.isclose(p[0], share * word_frequency("the", "en"))
    assert math.isclose(p[1], (3 + 1) / (10 + 2)) and math.isclose(p[2], (0 + 1) / (10 + 2))
    assert math.isclose(p[3], share * WORDFREQ_FLOOR) and math.isclose(p[4], share * word_frequency("delve", "en"))


MODEL = ["Here's an example: the end. Here's the thing — it works.", "So here's an example, and it's fine!",
         "It's worth noting that the end is near. It's worth noting — yes."]
HUMAN = ["the end is here, and it works.", "I think the thing works — fine."]


@pytest.mark.parametrize("background", ["wordfreq", "human"])
def test_every_scored_gram_matches_the_formula_from_plain_counts(background):
    """Counts from the table, the background built by hand (per order, over the grams seen), the
    prior and the scalar statistic: equal to what ranking computed for every gram of orders 1-3."""
    from wordfreq import word_frequency

    cfg = DiscoverConfig(background=background, alpha0=50.0, alpha_min=0.5, max_n=3, max_len=3)
    stream = encode(MODEL, HUMAN)
    levels = count_grams(stream, 3)
    scores = _score_levels(stream, levels, cfg)
    uni = gram_table(stream, levels, 1)
    human_tokens = sum(h for _, h in uni.values())
    human_punct = sum(h for (k,), (_, h) in uni.items() if is_punct(k))
    punct_keys = sum(is_punct(k) for k in stream.keys)

    def token_p(k):
        if is_punct(k):
            return (uni.get((k,), (0, 0))[1] + 1) / (human_tokens + punct_keys)
        return (human_tokens - human_punct) / human_tokens * word_frequency(k, "en", minimum=WORDFREQ_FLOOR)

    for n in (1, 2, 3):
        table = gram_table(stream, levels, n)
        n_m, n_h = sum(m for m, _ in table.values()), sum(h for _, h in table.values())
        if background == "human":
            p = {g: (m + h) / (n_m + n_h) for g, (m, h) in table.items()}
        else:
            raw = {g: math.prod(token_p(k) for k in g) for g in table}
            p = {g: v / sum(raw.values()) for g, v in raw.items()}
        for i, (g, (m, h)) in enumerate(table.items()):
            a = max(50.0 * p[g], 0.5)
            want = scalar(m, h, n_m, n_h, a, a + 50.0 * (1 - p[g]))
            got = (scores[n - 1].delta[i], scores[n - 1].z[i])
            assert np.allclose(got, (want[0], want[2]), rtol=1e-7), (n, g)
    user = scores[0].z >= 3
    assert not np.any(scores[0].candidate & user)                # nothing is used 3 times with z >= 3 here:
    assert {tuple(g) for g, c in zip(gram_table(stream, levels, 1), scores[0].candidate) if c} == {   # the words
        ("here's",), ("it's",)}                                  # are candidates on the language's evidence
