"""Phrase rates of free generation from token lists (no engine): counts per reply with known
answers, rates and their paired bootstrap over prompts, token shifts, the JSON schema, the table
and the PNG."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from exactedit.evals.rates.phrase_rates import Reply, count_reply, phrase_rates
from exactedit.evals.rates.report import plot_phrase_rates, render_phrase_rates
from exactedit.solvers.phrases import PhraseMatcher, TokenBytes
from exactedit.solvers.tail.model import TokenTable
from tests.solvers.l47 import synth

IDS = synth.Ids()
CTX = IDS("<|im_start|>") + IDS.text("assistant\n")
END = IDS("<|im_end|>")


@pytest.fixture(scope="module")
def matcher():
    tokens, types = synth.vocab()
    return PhraseMatcher(synth.PHRASES, TokenBytes(TokenTable(tuple(tokens), tuple(types), "bpe")))


def reply(prompt, seed, text, end=True):
    toks = IDS.text(text) + (END if end else [])
    return Reply(prompt, seed, np.array(CTX), np.array(toks), truncated=not end)


def test_counts_of_one_reply(matcher):
    c = count_reply(matcher, reply(0, 0, "End to end, rather than later. right now. we end to the day"))
    assert c.occurrences.tolist() == [1, 1, 0]
    assert c.contexts.tolist() == [1, 1, 0]
    assert c.prefixes.tolist() == [2, 1, 1] and c.continued.tolist() == [1, 1, 0]
    now, the = IDS(" now")[0], IDS(" the")[0]
    assert c.follow[2] == (now,) and c.follow[0] == (IDS(" end")[0], the)
    assert c.tokens == len(IDS.text("End to end, rather than later. right now. we end to the day")) + 1


def test_a_phrase_at_the_reply_start_uses_the_prompt_newline(matcher):
    c = count_reply(matcher, reply(0, 0, "Right away. far away"))
    assert c.contexts.tolist() == [0, 0, 1] and c.occurrences.tolist() == [0, 0, 1]
    assert c.prefixes.tolist() == [0, 0, 1] and c.continued.tolist() == [0, 0, 1]


BASE = [reply(0, 0, "right away. end to end."), reply(0, 1, "right away, right now", end=False),
        reply(1, 0, "rather than this"), reply(1, 1, "do it now")]
EDIT = [reply(0, 0, "right now. end to the day."), reply(0, 1, "right away, right now", end=False),
        reply(1, 0, "rather more"), reply(1, 1, "do it soon")]


def test_rates_base_and_edited(matcher):
    r = phrase_rates(matcher, BASE, EDIT, n_boot=200, seed=3)
    ra = {p.phrase: p for p in r.phrases}
    away = ra["right away"]
    assert (away.base.replies_with, away.base.replies, away.base.share) == (2, 4, 0.5)
    assert (away.base.prefixes, away.base.continued) == (3, 2)
    assert away.base.continuation == pytest.approx(2 / 3)
    assert (away.edited.replies_with, away.edited.prefixes, away.edited.continued) == (1, 3, 1)
    assert away.change["share"] == pytest.approx(-0.25) and away.change["continuation"] == pytest.approx(-1 / 3)
    assert away.base.per_1k_tokens == pytest.approx(1000 * 2 / r.tokens["base"])
    rather = ra["rather than"]
    assert (rather.base.continued, rather.edited.continued, rather.edited.prefixes) == (1, 0, 1)
    assert dict(rather.edited.top_continuations) == {" more": 1}
    assert r.truncated == {"base": 1, "edited": 1} and r.prompts == 2 and r.replies == 4
    lo, hi = away.base.ci["share"]
    assert 0.0 <= lo <= 0.5 <= hi <= 1.0
    assert math.isfinite(away.change_ci["share"][0])
    texts = {s.text for s in r.token_shifts}
    assert {" soon", " away"} <= texts


def test_bootstrap_is_over_prompts(matcher):
    one = [Reply(0, s, np.array(CTX), np.array(IDS.text("right away") + END)) for s in range(4)]
    r = phrase_rates(matcher, one, n_boot=100)
    assert r.prompts == 1 and all(math.isnan(x) for x in r.phrases[2].base.ci["share"])  # one prompt: no interval


def test_edited_must_match_prompts_and_seeds(matcher):
    with pytest.raises(ValueError, match="same prompts"):
        phrase_rates(matcher, BASE, EDIT[::-1])


def test_json_table_png(matcher, tmp_path):
    r = phrase_rates(matcher, BASE, EDIT, n_boot=50)
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    p = d["phrase_rates"][2]
    assert p["phrase"] == "right away" and {"replies_with", "per_1k_tokens", "continuation", "ci"} <= set(p["base"])
    assert p["edited"]["replies_with"] == 1 and set(p["change_ci"]) == {"share", "per_1k_tokens", "continuation"}
    text = render_phrase_rates(r)
    assert "right away" in text and "2/4" in text and "continuation" in text and "' more' 1" in text
    png = plot_phrase_rates(r, tmp_path / "rates.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    base_only = phrase_rates(matcher, BASE, n_boot=0)
    assert base_only.phrases[0].edited is None and "n/a" not in render_phrase_rates(base_only).split("\n")[2]
