"""`exactedit bench generate --against plain`: the rules' live cost (batched with the rules against
batched without them, same run). The config's checks, the rendering and JSON of a result without
a model, the CLI's refusals; live, a tiny run on SmolLM2-135M with 50 drawn phrases."""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from tests import oracles


def _result(**over):
    from exactedit.bench.generate import GenerateBenchConfig, RulesCostResult

    cfg = GenerateBenchConfig("m.gguf", prompts=8, seeds=2, against="plain", phrases=1000, repeats=2)
    fields = dict(config=cfg, replies=16, phrases=1000, pieces=9485, rules=("prefix-penalty",), compile_s=1.5,
                  tokens_plain=973, tokens_rules=970, plain_s=7.0, rules_s=7.2, plain_tps=139.0, rules_tps=134.7,
                  ratio=0.969, cost=0.031, target_cost=0.05, meets_target=True, fired_steps=13, fired_replies=8,
                  identical_replies=15, cpus=2, plain_runs_s=(7.0, 7.9), rules_runs_s=(7.2, 8.4),
                  paired_ratio=0.95)
    return RulesCostResult(**{**fields, **over})


def test_config_checks_the_mode_and_its_rules():
    from exactedit.bench.generate import GenerateBenchConfig
    from exactedit.native.llamacpp.engine import EngineError

    assert GenerateBenchConfig("m.gguf").against == "one-at-a-time"
    assert GenerateBenchConfig("m.gguf", against="plain", rules="r.json").phrases == 0
    assert GenerateBenchConfig("m.gguf", against="plain", phrases=10).rules is None
    with pytest.raises(EngineError, match="against: plain .* needs rules or phrases"):
        GenerateBenchConfig("m.gguf", against="plain")
    with pytest.raises(EngineError, match="against: expected one of one-at-a-time, plain"):
        GenerateBenchConfig("m.gguf", against="batched")
    with pytest.raises(EngineError, match="phrases: give compiled rules or a number of phrases, not both"):
        GenerateBenchConfig("m.gguf", rules="r.json", phrases=10)
    for bad in (-1, True, 2.0):
        with pytest.raises(EngineError, match="phrases: expected an integer >= 0"):
            GenerateBenchConfig("m.gguf", phrases=bad)


def test_render_and_json():
    from exactedit.bench.generate import render_generate_bench

    r = _result()
    text = render_generate_bench(r)
    assert "bench generate --against plain: m.gguf, 16 replies (8 prompts x 2 seeds)" in text
    assert "1000 drawn phrases compiled in 1.5 s, 9485 token pieces" in text
    assert "batched, no rules (baseline)" in text and "139.00 tok/s  (runs 7.00..7.90 s)" in text
    assert "134.70 tok/s  (runs 7.20..8.40 s)" in text
    assert "within each repeat (median of 2): ratio 0.950, cost 5.0%" in text
    assert "ratio (rules / no rules, tokens/s): 0.969; cost 3.1% (target <= 5%: ok)" in text
    assert "target <= 5%: ABOVE" in render_generate_bench(_result(cost=0.08, meets_target=False))
    d = json.loads(json.dumps(r.to_dict()))
    assert d["bench"] == "generate" and d["config"]["against"] == "plain" and d["config"]["phrases"] == 1000
    assert (d["plain_tps"], d["rules_tps"], d["cost"], d["pieces"]) == (139.0, 134.7, 0.031, 9485)


@pytest.mark.parametrize("args, match", [
    (["--against", "plain"], "plain .* needs rules or phrases"),
    (["--against", "batched"], "'batched' is not one of"),
    (["--phrases", "-1"], "-1 is not in the range"),
])
def test_cli_refuses(tmp_path, args, match):
    from exactedit import cli

    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    res = CliRunner().invoke(cli.main, ["bench", "generate", "--model", str(model), *args])
    assert res.exit_code != 0
    assert re.search(match, res.output), res.output


@pytest.mark.live
def test_tiny_cost_run_on_smollm():
    from exactedit.bench.generate import GenerateBenchConfig, RulesCostResult, run_generate_bench

    path = oracles.live_model("smollm")
    seen = []
    r = run_generate_bench(GenerateBenchConfig(str(path), prompts=2, max_new=8, slots=2, against="plain", phrases=50),
                           progress=lambda d, t: seen.append((d, t)))
    assert isinstance(r, RulesCostResult) and seen == [(1, 2), (2, 2)]
    assert r.replies == 2 and r.phrases == 50 and r.pieces > 0 and r.rules == ("prefix-penalty",)
    assert r.tokens_plain > 0 and r.tokens_rules > 0 and r.compile_s > 0
    assert r.plain_tps == pytest.approx(r.tokens_plain / r.plain_s)
    assert r.rules_tps == pytest.approx(r.tokens_rules / r.rules_s)
    assert r.ratio == pytest.approx(r.rules_tps / r.plain_tps) and r.cost == pytest.approx(1 - r.ratio)
    assert r.meets_target == (r.cost <= 0.05) and 0 <= r.identical_replies <= 2
    assert (r.plain_runs_s, r.rules_runs_s) == ((r.plain_s,), (r.rules_s,))
    assert r.paired_ratio == pytest.approx(r.ratio)
