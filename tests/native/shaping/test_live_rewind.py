"""The rules' rewind mode live on SmolLM2-135M-Instruct (native/llamacpp/rewind.py through the one
generation loop): SmolLM2's greedy reply to PROMPT writes "you can use" and "Here's a simple
example". The rules ban "you can use" at a small bias (1 nat, which its margin survives) and
"Here’s a simple example" as a user might type it, with a curly apostrophe (the penalty matches the
bytes it was given, so the model's straight "Here's" is a variant it cannot see). The penalty mode
lets both through; the rewind mode writes neither nor any variant, reproducibly with a seed, in
both engines alike; `shape rates --rules-mode rewind` reports the rollbacks. About 300 tokens."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tests import oracles

pytestmark = pytest.mark.live

PROMPT = "How do I read a CSV file in Python?"
PHRASES = ["you can use", "Here\u2019s a simple example"]
MAX = 28


@pytest.fixture(scope="module")
def smollm():
    return oracles.live_model("smollm")


@pytest.fixture(scope="module")
def rules(smollm, tmp_path_factory):
    from exactedit.native.shaping import compile_file

    out = tmp_path_factory.mktemp("rewind") / "rules.json"
    compile_file(None, smollm, out, phrases=PHRASES, bias=1.0)
    return out


def _cli(*args):
    from exactedit.cli import main

    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _caught(text: str) -> list[str]:
    from exactedit.native.llamacpp.rewind import RewindConfig, scan

    return [text[m.start:m.end] for m in scan(text, RewindConfig(tuple(PHRASES)))]


def test_penalty_lets_the_phrase_and_a_variant_through_rewind_writes_neither(smollm, rules):
    args = ["generate", "--model", smollm, "--rules", rules, "--prompt", PROMPT, "--max-new", MAX, "--top-k", 1,
            "--temperature", 1, "--json"]
    penalty, rewind = _cli(*args), _cli(*args, "--rules-mode", "rewind")
    assert _caught(penalty["text"]) == ["you can use", "Here's a simple example"]        # the variant: straight '
    assert penalty["rewinds"] is None and penalty["rules_mode"] == "penalty"
    assert _caught(rewind["text"]) == [], rewind["text"]
    assert rewind["rewinds"]["phrases"].get("you can use", 0) >= 1 and rewind["rewinds"]["kept"] == 0
    assert all(e["step"] < MAX for e in rewind["rewinds"]["events"])


def test_rewind_is_reproducible_with_a_seed_and_the_same_in_both_engines(smollm, rules):
    from exactedit.native.llamacpp import LlamaEngine, Sampling, sample_replies
    from exactedit.native.llamacpp.chat import prompt_tokens, render_prompt
    from exactedit.native.shaping.live import open_rules, rewind_for, shaper_for

    c, tpl = open_rules(smollm, rules)
    rw = rewind_for(c, "rewind")
    with LlamaEngine(smollm) as e:
        p = prompt_tokens(e, render_prompt(tpl, PROMPT), e.bos_if_added())
        jobs = [(p, Sampling(max_new=MAX, temperature=0.8, seed=s)) for s in (1, 2)]
        one = sample_replies(e, jobs, processor=shaper_for(c), stop_ids=c.vocab.turn_end, rewind=rw, sequential=True)
        again = sample_replies(e, jobs[:1], processor=shaper_for(c), stop_ids=c.vocab.turn_end, rewind=rw,
                               sequential=True)
        batched = sample_replies(e, jobs, shapers=lambda: shaper_for(c), stop_ids=c.vocab.turn_end, rewind=rw, slots=2)
        texts = [b"".join(e.piece(int(t)) for t in g.tokens).decode("utf-8", "replace") for g in one]
    assert sum(not x.kept for g in one for x in g.rewinds) >= 1          # the rollbacks are exercised
    assert np.array_equal(one[0].tokens, again[0].tokens) and one[0].rewinds == again[0].rewinds
    for a, b in zip(one, batched):
        assert np.array_equal(a.tokens, b.tokens) and a.rewinds == b.rewinds and a.fired.shape == b.fired.shape
    assert all(_caught(t) == [] for t in texts), texts


def test_shape_rates_reports_the_rollbacks_of_the_rules_arm(smollm, rules, tmp_path):
    (tmp_path / "prompts.txt").write_text(PROMPT + "\n")
    out = _cli("shape", "rates", "--model", smollm, "--rules", rules, "--prompts", tmp_path / "prompts.txt",
               "--max-new", MAX, "--top-k", 1, "--temperature", 1, "--n-boot", 0, "--rules-mode", "rewind", "--json")
    rw = out["arms"]["rules"]["rewinds"]
    assert out["config"]["rules_mode"] == "rewind" and "rewinds" not in out["arms"]["base"]
    assert rw["rewinds"] >= 1 and rw["replies_rewound"] == 1 and len(rw["per_reply"]) == 1
    assert {e["phrase"] for e in rw["per_reply"][0]} <= set(PHRASES)
