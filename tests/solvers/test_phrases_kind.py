"""discover's JSON read as a ban list by kind: style entries by default (the prompts' subject is
never banned unasked), a comma list or any on request, entries of an older discover (no kind) always
taken, an unknown kind refused by name."""
from __future__ import annotations

import json

import pytest

from exactedit.solvers.phrases import PhraseError, kinds_of, load_phrases

ENTRIES = [{"phrase": "in Python", "kind": "topic"}, {"phrase": "Here's an example:", "kind": "style",
                                                       "ban_phrase": "Here's an"},
           {"phrase": "the function", "kind": "mixed"}, {"phrase": "you can use", "kind": "style"},
           {"phrase": "a list", "kind": "topic"}, {"phrase": "older entry"}]


@pytest.fixture
def found(tmp_path):
    p = tmp_path / "found.json"
    p.write_text(json.dumps({"phrases": ENTRIES}))
    return p


def test_style_by_default_and_other_kinds_on_request(found):
    assert load_phrases(found) == ("Here's an", "you can use", "older entry")
    assert load_phrases(found, top=1) == ("Here's an",)
    assert load_phrases(found, kind="topic") == ("in Python", "a list", "older entry")
    assert load_phrases(found, kind="style,mixed") == ("Here's an", "the function", "you can use", "older entry")
    assert load_phrases(found, 3, kind="any") == ("in Python", "Here's an", "the function")


def test_kinds_refused_by_name(found, tmp_path):
    with pytest.raises(PhraseError, match="kind: expected one of style, mixed, topic .* got 'slop'"):
        load_phrases(found, kind="slop")
    for bad in ("", "style,any", ","):
        with pytest.raises(ValueError):
            kinds_of(bad)
    only = tmp_path / "topic.json"
    only.write_text(json.dumps({"phrases": [{"phrase": "in Python", "kind": "topic"}]}))
    with pytest.raises(PhraseError, match="no usable phrase of kind style .*--kind any takes every kind"):
        load_phrases(only)
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"phrases": [{"phrase": "a b", "kind": ["style"]}]}))
    with pytest.raises(PhraseError, match=r"phrases\[0\]\.kind: expected a string"):
        load_phrases(odd)
    text = tmp_path / "p.txt"
    text.write_text("a b\nc d\n")
    assert load_phrases(text, kind="topic") == ("a b", "c d")           # a plain list has no kinds
