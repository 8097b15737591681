"""Style or topic: Juilland's D and the chance spread against hand values, the kind rule's table, and
on synthetic chats a phrase kept to a few prompts (or naming the prompts' words) classed topic while
planted slop is style; the phrase lists read from discover's JSON take the style ones by default."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from exactedit.evals.discover.kinds import expected_groups, fold, juilland_d, kind_of
from exactedit.evals.discover.ranking import discover
from exactedit.evals.discover.sources import Text
from exactedit.solvers.phrases import load_phrases
from tests.evals.discover.synth import chats


@pytest.mark.parametrize("word, folded", [("Lists", "list"), ("dictionaries", "dictionary"), ("boxes", "box"),
                                          ("Python's", "python"), ("class", "class"), ("status", "status"),
                                          ("analysis", "analysis"), ("its", "its"), ("files", "file")])
def test_fold(word, folded):
    assert fold(word) == folded


def test_juilland_d_against_hand_values():
    eq = np.array([10.0, 10.0])
    assert juilland_d(np.array([2.0, 2.0]), eq) == 1.0                  # the same rate everywhere
    assert juilland_d(np.array([2.0, 0.0]), eq) == 0.0                  # V = 1 = sqrt(n - 1): all in one part
    assert math.isclose(juilland_d(np.array([3.0, 1.0]), eq), 0.5)      # rates .3, .1: V = .5
    assert math.isclose(juilland_d(np.array([1.0, 1.0, 0.0]), np.array([10.0, 20.0, 10.0])),
                        1 - (np.std([0.1, 0.05, 0]) / np.mean([0.1, 0.05, 0])) / math.sqrt(2))
    assert juilland_d(np.array([4.0]), np.array([10.0])) is None        # one part: no dispersion
    assert juilland_d(np.array([1.0, 1.0, 5.0]), np.array([10.0, 10.0, 0.0])) == 1.0   # empty parts left out


def test_expected_groups():
    assert math.isclose(expected_groups(1, np.full(8, 5.0)), 1.0)
    assert math.isclose(expected_groups(30, np.full(24, 5.0)), 24 * (1 - (23 / 24) ** 30))
    assert expected_groups(30, np.array([7.0])) == 1.0
    big = expected_groups(10, np.array([90.0, 10.0]))
    assert math.isclose(big, (1 - 0.1 ** 10) + (1 - 0.9 ** 10))


@pytest.mark.parametrize("share, echo, spread, kind", [
    (1.0, 0.9, 0.1, "style"),        # no content words: style whatever its spread
    (0.5, None, 1.1, "style"), (0.5, 0.1, 0.8, "style"),
    (0.5, 0.6, 1.0, "topic"), (0.5, None, 0.3, "topic"), (0.0, 0.0, 0.49, "topic"),
    (0.5, 0.3, 1.0, "mixed"), (0.5, None, 0.6, "mixed"), (0.5, 0.19, 0.74, "mixed")])
def test_the_kind_rule(share, echo, spread, kind):
    assert kind_of(share, echo, spread) == kind


TOPIC = "flux capacitor calibration"      # in the replies to three prompts only; no prompt names it
ECHO = "your sourdough"                   # in replies to prompts that name sourdough, nowhere else
SLOP = {"delve into": 40, "it's important to note that": 30, "I hope this helps": 26}


@pytest.fixture(scope="module")
def chat_texts():
    pairs, _ = chats(5, 40, 3, 18_000, SLOP)
    rng = np.random.default_rng(9)
    prompts = sorted({p for p, _ in pairs})
    few = set(prompts[:3])
    out = []
    for i, (prompt, text) in enumerate(pairs):
        if prompt in few:
            text += f" Then the {TOPIC} again. And {TOPIC}."
        if "sourdough" in prompt.lower() and rng.random() < 0.9:
            text += f" Feed {ECHO} daily."
        out.append(Text(text, "m", f"m[{i}]", prompt))
    assert sum("sourdough" in p.lower() for p in prompts) >= 2
    return out


def test_a_phrase_of_a_few_prompts_is_topic_and_slop_is_style(chat_texts, tmp_path):
    human = [" ".join(["the"] * 5 + ["one", "day", "we", "went", "to", "town", "and", "back", "again"] * 20)]
    d = discover(chat_texts, human, top=500)            # every phrase passing: the kinds, not the rank
    by = {p.phrase.lower(): p for p in d.phrases}
    topic = [p for k, p in by.items() if "flux capacitor" in k]
    assert topic and all(p.kind == "topic" and p.spread < 0.5 and p.prompts == 3 for p in topic)
    assert topic[0].dispersion < 0.5 and math.isclose(topic[0].prompt_share, 3 / 40)
    echo = [p for k, p in by.items() if ECHO in k]
    assert echo and all(p.kind == "topic" and p.echo == 1.0 for p in echo)
    assert echo[0].unrelated_per_1k == 0.0
    for phrase in ("delve into", "it's important to note that", "i hope this helps"):
        p = by[phrase]
        assert p.kind == "style" and p.spread > 0.75 and p.echo in (None, 0.0), p
    kinds = [p.kind for p in d.phrases]
    assert kinds == sorted(kinds, key=("style", "mixed", "topic").index)     # topic after, still listed
    f = tmp_path / "found.json"
    f.write_text(d.to_json())
    style = load_phrases(f)
    assert {"delve into", "it's important to note that", "I hope this helps"} <= set(style)
    assert not [p for p in style if "capacitor" in p or "sourdough" in p]
    every = load_phrases(f, kind="any")
    assert [p for p in every if "capacitor" in p] and [p for p in every if "sourdough" in p]
    assert all("capacitor" in p or "sourdough" in p or p not in style for p in load_phrases(f, kind="topic"))
    assert json.loads(f.read_text())["listed"]["topic"] >= 2
