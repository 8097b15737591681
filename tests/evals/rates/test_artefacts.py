"""Variant artefacts: a phrase's last word as its own case or spacing variant after the prefix."""
from __future__ import annotations

from exactedit.evals.rates.artefacts import variant_artefacts

PHRASES = ["Here's an example", "you can use"]


def test_case_and_spacing_variants_are_found():
    texts = ["Here's an Example: x", "Here's anexample", "Here's an  example", "ok. You can USE it",
             "so you canuse it"]
    found = [(a.reply, a.found) for a in variant_artefacts(texts, PHRASES)]
    assert found == [(0, "Here's an Example"), (1, "Here's anexample"), (2, "Here's an  example"),
                     (3, "You can USE"), (4, "you canuse")]


def test_the_phrase_itself_and_other_words_are_not_artefacts():
    texts = ["Here's an example", "You can use it", "Here's an examples list", "Here's an explanation",
             "cyou can use", "here's an Example"]     # lowercase prefix: not a form of the phrase
    assert variant_artefacts(texts, PHRASES) == []


def test_capitalized_forms_follow_the_flag():
    assert [a.found for a in variant_artefacts(["You can Use"], PHRASES)] == ["You can Use"]
    assert variant_artefacts(["You can Use"], PHRASES, capitalized=False) == []
