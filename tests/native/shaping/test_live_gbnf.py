"""The exported grammar live on llama.cpp (llama-cpp-python's `Llama` and `LlamaGrammar`) with
SmolLM2-135M: rules compiled for the model, exported as GBNF by the command line, read by llama.cpp's
own GBNF parser; greedy and sampled replies to prompts where the model writes the phrases without
the grammar, and none of them with it; greedy replies drawn as llama.cpp's common sampler draws
them (the token checked alone first) are the same. About 1,300 generated tokens. The grammar's cost in tokens/s
is measured by `exactedit bench gbnf` (docs/rules-where.md)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from exactedit.solvers.phrases import text_occurrences
from tests import oracles
from tests.gbnf_check import naive_accepts

pytestmark = pytest.mark.live

PHRASES = ["you can use", "Here's a simple example", "a data structure"]
PROMPTS = ["How do I read a CSV file in Python?", "Explain what a hash map is in two sentences.",
           "Give me an example of a Python list comprehension."]
SETTINGS = [(0.0, 0), (0.7, 1), (0.7, 2)]       # greedy, then sampled (temperature, seed)


def _cli(*args):
    from exactedit.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("gbnf")
    model = oracles.live_model("smollm")
    (d / "rules.toml").write_text("[prefix-penalty]\nbias = 6.0\nphrases = " + json.dumps(PHRASES) + "\n")
    res = _cli("shape", "compile", d / "rules.toml", "--model", model, "--out", d / "rules.json")
    assert res.exit_code == 0, res.output
    res = _cli("shape", "export", "--rules", d / "rules.json", "--format", "gbnf", "--out", d / "ban.gbnf", "--json")
    assert res.exit_code == 0, res.output
    return model, (d / "ban.gbnf").read_text(), json.loads(res.stdout)


def test_llama_cpp_parses_the_grammar(exported):
    from exactedit.native.shaping.grammar import grammar_parses

    model, grammar, report = exported
    assert report["states"] > 10
    assert grammar_parses(model, grammar)
    assert not grammar_parses(model, grammar.replace("root ::= s0", "root ::= s0 ["))    # the check can fail


def _found(text: str) -> int:
    """Occurrences by the grammar's definition (a phrase form after an ASCII word boundary) and by
    the phrase matcher's (whole words)."""
    return int(not naive_accepts(text, PHRASES)) + sum(text_occurrences(text, PHRASES))


def test_no_banned_phrase_where_the_base_writes_them(exported):
    from exactedit.native.shaping.grammar import GrammarModel

    model, grammar, _ = exported
    with GrammarModel(model) as m:
        for temperature, seed in SETTINGS:
            base = m.replies(PROMPTS, None, temperature=temperature, seed=seed, max_new=64)
            banned = m.replies(PROMPTS, grammar, temperature=temperature, seed=seed, max_new=64)
            assert sum(_found(t) for t in base.texts) > 0, (temperature, seed, base.texts)   # the base writes them
            for t in banned.texts:
                assert _found(t) == 0, (temperature, seed, t)
                assert len(t.split()) >= 5, (temperature, seed, t)                        # a reply, not a stub
            assert banned.tokens > 0 and base.tokens > 0
            if temperature == 0:
                # llama.cpp's check-first sampling (the bench's llama-server model) draws the same tokens
                assert m.greedy_check_first(PROMPTS, grammar, max_new=64).texts == banned.texts
