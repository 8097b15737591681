"""discover on synthetic corpora with planted phrases: the planted ones rank first with their exact
counts, a phrase planted at the same rate on both sides is not listed, corpora differing by chance
list no phrase, and the listing rules (extension past max_n, redundancy, function words, one-text
phrases, attached punctuation) do what docs/discover.md says; the JSON shape; config checks."""
from __future__ import annotations

import json
import math

import pytest

from exactedit.evals.discover.ngrams import count_grams, encode, gram_table
from exactedit.evals.discover.ranking import DiscoverConfig, Discovery, _score_levels, discover, excess
from exactedit.evals.discover.sources import DiscoverError, Text
from tests.evals.discover.synth import corpus

SLOP = {"delve into": 0.05, "it's worth noting that": 0.04, "here's an example": 0.03}
SHARED = "quarterly report meeting"


@pytest.fixture(scope="module")
def planted():
    model, m_planted = corpus(1, 300, {**SLOP, SHARED: 0.04})
    human, h_planted = corpus(2, 150, {SHARED: 0.04})
    return model, human, m_planted, h_planted


@pytest.mark.parametrize("background", ["wordfreq", "human"])
def test_planted_phrases_rank_first_with_their_exact_counts(planted, background):
    model, human, m_planted, h_planted = planted
    d = discover(model, human, background=background, top=10)
    top = {p.phrase.lower(): p for p in d.phrases[:3]}
    assert set(top) == set(SLOP), [p.phrase for p in d.phrases]
    for phrase, p in top.items():
        assert (p.model_count, p.human_count, p.n) == (m_planted[phrase], 0, len(phrase.split()))
        assert math.isclose(p.model_per_1k, 1000 * p.model_count / d.model.words)
        assert p.z >= 3 and p.log_odds > 2 and p.sources == {"text": p.model_count}
        assert phrase in p.example.lower()
    assert SHARED not in {p.phrase.lower() for p in d.phrases}
    assert d.model.words > 2 * d.human.words > 0 and h_planted[SHARED] > 30      # the sizes differ


def test_the_wordfreq_prior_biases_toward_the_larger_corpus_by_alpha0_as_documented():
    """A phrase both sides use at one rate, rare in English, with 6x more model text: the wordfreq
    prior's delta is log((n_h + a0) / n_h) - log((n_m + a0) / n_m) (docs/discover.md), small at the
    default alpha0 and listed at 100,000; the pooled background has no such bias."""
    model, _ = corpus(31, 600, {"quarterly report": 0.2})
    human, _ = corpus(32, 100, {"quarterly report": 0.2})
    stream = encode(model, human)
    levels = count_grams(stream, 2)
    g = list(gram_table(stream, levels, 2)).index(("quarterly", "report"))
    n_m, n_h = levels[1].model.sum(), levels[1].human.sum()
    for a0 in (1000.0, 10_000.0, 100_000.0):
        wf = _score_levels(stream, levels, DiscoverConfig(alpha0=a0, max_n=2, max_len=2))[1]
        pooled = _score_levels(stream, levels, DiscoverConfig(alpha0=a0, max_n=2, max_len=2, background="human"))[1]
        assert abs(wf.delta[g] - (math.log((n_h + a0) / n_h) - math.log((n_m + a0) / n_m))) < 0.03
        assert abs(pooled.delta[g]) < 0.01
    assert wf.z[g] > 10 and "quarterly report" in {p.phrase for p in discover(model, human, alpha0=100_000.0).phrases}
    assert "quarterly report" not in {p.phrase for p in discover(model, human).phrases}


def test_corpora_differing_by_chance_list_no_phrase():
    d = discover(corpus(3, 300)[0], corpus(4, 150)[0], top=50)
    assert [p.phrase for p in d.phrases if p.n > 1] == []


def test_a_phrase_longer_than_max_n_grows_by_extension():
    long = "at the very end of the long day"
    model, planted = corpus(5, 250, {long: 0.05})
    human, _ = corpus(6, 150)
    d = discover(model, human, max_n=5, max_len=8)
    longest = max(d.phrases, key=lambda p: p.n)
    assert (longest.phrase.lower(), longest.n, longest.model_count) == (long, 8, planted[long])
    assert not [p for p in d.phrases if 2 < p.n < 8]              # its sub-grams: the same uses, dropped
    d = discover(model, human, max_n=5, max_len=6)
    longest = max(d.phrases, key=lambda p: p.n)
    assert longest.n == 6 and longest.phrase.lower() in long


def test_extension_needs_both_sub_grams_over_used():
    """"delve into the": "delve into" is over-used, "into the" is not (the human says it as often), so
    past max_n = 2 the trigram is no candidate; scored directly (max_n = 3) it is listed."""
    model, _ = corpus(14, 300, {"delve into the": 0.05, "into the": 0.02})
    human, _ = corpus(15, 150, {"into the": 0.2})
    assert "delve into the" in {p.phrase.lower() for p in discover(model, human, max_n=3).phrases}
    listed = {p.phrase.lower() for p in discover(model, human, max_n=2, max_len=3).phrases}
    assert "delve into" in listed and "delve into the" not in listed


def test_redundancy_keeps_the_longer_gram_when_it_holds_nearly_every_use():
    model, _ = corpus(7, 300, {"delve into the": 0.03, "delve into": 0.03, "it's worth noting that": 0.04})
    human, _ = corpus(8, 150)
    phrases = [p.phrase.lower() for p in discover(model, human).phrases]
    assert "it's worth noting that" in phrases
    assert not {"it's worth noting", "worth noting that", "worth noting", "noting that"} & set(phrases)
    assert "delve into" in phrases and "delve into the" in phrases             # half the uses are alone


def test_function_words_and_punctuation_must_be_really_over_used():
    model, _ = corpus(9, 300, {"—": 0.3, "of the": 0.1})
    human, _ = corpus(10, 150, {"of the": 0.07})
    d = discover(model, human)
    by = {p.phrase: p for p in d.phrases}
    assert "—" in by and by["—"].human_count == 0
    strict = discover(model, human, function_log_odds=50.0)
    assert "—" not in {p.phrase for p in strict.phrases} and "of the" not in {p.phrase for p in strict.phrases}


def test_a_phrase_of_one_text_and_one_after_attached_punctuation_are_not_listed():
    model, _ = corpus(11, 200, every_doc={"tapestry of dreams": 40})
    human, _ = corpus(12, 100)
    assert "tapestry of dreams" not in {p.phrase.lower() for p in discover(model, human).phrases}
    assert "so tapestry of dreams again." in {p.phrase.lower() for p in discover(model, human, min_docs=1).phrases}
    comma, _ = corpus(13, 300, {", delve into": 0.05})
    listed = discover(comma, human).phrases
    assert "delve into" in {p.phrase for p in listed}
    assert not [p.phrase for p in listed if p.n > 1 and p.phrase.startswith(",")]


def test_json_shape_and_sources(planted):
    model, human, _, _ = planted
    tagged = [Text(t, "qwen" if i % 3 else "gemma", f"m[{i}]") for i, t in enumerate(model)]
    d = discover(tagged, human, top=5)
    data = json.loads(d.to_json())
    assert set(data) == {"phrases", "model", "human", "settings", "listed", "prompts", "closest", "skipped", "notes"}
    assert set(data["phrases"][0]) == {
        "phrase", "n", "kind", "evidence", "score", "excess", "z", "log_odds", "user_ratio_low", "lang_per_1k",
        "lang_ratio",
        "lang_ratio_low", "cohesion", "model_count", "human_count", "model_per_1k", "human_per_1k", "model_docs",
        "human_docs", "prompts", "prompt_share", "dispersion", "spread", "echo", "word_spread", "word_echo", "unrelated_per_1k",
        "function_share",
        "sources", "example"}
    assert data["closest"] is None and data["skipped"] == [] and data["prompts"] == 300     # no prompts: 1 text each
    assert data["model"] == {"texts": 300, "tokens": d.model.tokens, "words": d.model.words,
                             "sources": {"qwen": 200, "gemma": 100}}
    assert data["settings"] == {**DiscoverConfig().__dict__, "top": 5}
    first = d.phrases[0]
    assert sum(first.sources.values()) == first.model_count and set(first.sources) <= {"qwen", "gemma"}
    order = [("style", "mixed", "topic").index(p.kind) for p in d.phrases]
    assert order == sorted(order) and sum(data["listed"].values()) >= len(d.phrases)
    for kind in set(p.kind for p in d.phrases):                 # by kind, then by excess uses
        ranked = [(p.excess, p.score) for p in d.phrases if p.kind == kind]
        assert ranked == sorted(ranked, reverse=True)
    for p in d.phrases:
        assert math.isclose(p.excess, p.model_count * (1 - 1 / p.score) if p.score > 1 else 0.0)
    assert isinstance(d, Discovery) and data == d.to_dict()


def test_excess_ranks_a_frequent_habit_above_a_rare_word_with_a_larger_ratio():
    """A phrase of common words used often outranks a word English almost never writes, used a few
    times: the ranking key is the uses the reference does not account for, not the ratio."""
    model, _ = corpus(3, 200, {"you can use the": 0.15, "iterates": 0.012})
    human, _ = corpus(4, 60, {})
    d = discover(model, human, top=50)
    by = {p.phrase.lower(): p for p in d.phrases}
    habit, rare = by["you can use the"], by["iterates"]
    assert rare.score > 10 * habit.score and habit.excess > rare.excess
    assert d.phrases.index(habit) < d.phrases.index(rare)
    assert excess([3, 30, 5], [1.0, 4.0, 0.5]).tolist() == [0.0, 22.5, 0.0]


def test_a_small_human_text_gets_a_note():
    d = discover(corpus(1, 30, SLOP)[0], corpus(2, 10)[0])
    assert d.notes and "small" in d.notes[0]


def test_inputs_with_nothing_to_count_are_refused():
    with pytest.raises(DiscoverError, match="human text: words: no words"):
        discover(["some text here"], ["```\ncode only\n```"])
    with pytest.raises(DiscoverError, match="model text: texts: none given"):
        discover([], ["x"])


@pytest.mark.parametrize("fields", [dict(top=0), dict(max_n=6, max_len=5), dict(background="web"), dict(alpha0=0.0),
                                    dict(alpha_min=-1.0), dict(redundancy=0.0), dict(min_z=math.nan)])
def test_config_checks(fields):
    with pytest.raises(ValueError):
        DiscoverConfig(**fields)


def test_an_empty_list_names_the_closest_phrase_and_the_settings_that_list_it():
    """Nothing passes (the language's bar set out of reach, z small on a small text of the user's):
    the result names the nearest gram, what it misses, and settings that do list it."""
    from exactedit.evals.discover.report import render_discovery

    model, human = corpus(1, 40, SLOP)[0], corpus(2, 12)[0]
    d = discover(model, human, min_ratio=1e9)
    assert d.phrases == () and d.closest is not None
    near = d.closest
    assert near["phrase"].lower() in SLOP and near["model_count"] >= 3 and near["z"] < 3
    assert any("under --min-z 3" in m and "under --min-ratio 1e+09" in m for m in near["misses"])
    assert near["summary"] in d.notes and "It would be listed with --min-z" in near["summary"]
    text = render_discovery(d)
    assert "no phrase is over-used" in text and f"closest: {near['phrase']!r}" in text and "listed with:" in text
    ways = dict(w.split(" ") for w in near["changes"][0].split(" or "))
    for flag, value in ways.items():
        field = {"--min-z": "min_z", "--min-ratio": "min_ratio"}[flag]
        listed = discover(model, human, **{"min_ratio": 1e9, field: float(value)}).phrases
        assert near["phrase"] in {p.phrase for p in listed}, (flag, value)
    assert set(ways) == {"--min-z", "--min-ratio"}
    d = discover(model, human, min_count=1000)
    assert "--min-count" in " ".join(d.closest["changes"]) and d.closest["model_count"] < 1000
