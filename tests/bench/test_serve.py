"""`exactedit bench serve`: serve with the rules against serve without them, same requests over HTTP,
same run. The config's checks, the rendering and JSON of a result without a model, the CLI's
refusal; live, a tiny streamed run on SmolLM2-135M with 50 drawn phrases."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests import oracles


def _result(**over):
    from exactedit.bench.serve.throughput import ServeBenchConfig, ServeBenchResult

    cfg = ServeBenchConfig("m.gguf", phrases=1000, prompts=4, seeds=2, repeats=2)
    fields = dict(config=cfg, requests=8, rules=("prefix-penalty",), compile_s=1.6, tokens_plain=256,
                  tokens_rules=250, plain_s=5.0, rules_s=5.1, plain_tps=51.2, rules_tps=49.02, ratio=0.957,
                  target_ratio=0.95, meets_target=True, paired_ratio=0.97, plain_runs_s=(5.0, 6.0),
                  rules_runs_s=(5.1, 5.5), fired_steps=3, identical_replies=7, cpus=2)
    return ServeBenchResult(**{**fields, **over})


def test_config_needs_rules_or_phrases_and_checks_ranges():
    from exactedit.bench.serve.throughput import ServeBenchConfig
    from exactedit.errors import ExacteditError

    assert ServeBenchConfig("m.gguf", rules="r.json").stream
    for kw, match in [({}, "one of them"), ({"rules": "r.json", "phrases": 5}, "one of them"),
                      ({"phrases": 5, "prompts": 13}, "prompts: expected 1..12"),
                      ({"phrases": 5, "repeats": 0}, "repeats: expected a positive integer"),
                      ({"phrases": 5, "temperature": 3.0}, "temperature: expected 0..2"),
                      ({"phrases": True}, "phrases: expected an integer >= 0")]:
        with pytest.raises(ExacteditError, match=match):
            ServeBenchConfig("m.gguf", **kw)


def test_render_and_json():
    from exactedit.bench.serve.throughput import render_serve_bench

    r = _result()
    text = render_serve_bench(r)
    assert "bench serve: m.gguf, 8 chat requests (4 prompts x 2 seeds), max_tokens 64" in text and "streamed" in text
    assert "1000 drawn phrases compiled in 1.6 s" in text
    assert "serve, no rules (baseline)     256 tokens      5.00 s    51.20 tok/s  (runs 5.00..6.00 s)" in text
    assert "ratio (rules / no rules, tokens/s): 0.957 (target >= 0.95: ok); within each repeat (median of 2): 0.970" \
        in text
    assert "target >= 0.95: BELOW" in render_serve_bench(_result(ratio=0.9, meets_target=False))
    d = json.loads(json.dumps(r.to_dict()))
    assert d["bench"] == "serve" and d["config"]["phrases"] == 1000 and d["ratio"] == 0.957


def test_cli_refuses_without_rules_or_phrases(tmp_path):
    from exactedit import cli

    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    res = CliRunner().invoke(cli.main, ["bench", "serve", "--model", str(model)])
    assert res.exit_code != 0 and "give compiled rules (--rules) or a number of phrases" in res.output


@pytest.mark.live
def test_tiny_run_on_smollm():
    from exactedit.bench.serve.throughput import ServeBenchConfig, run_serve_bench

    path = oracles.live_model("smollm")
    seen = []
    r = run_serve_bench(ServeBenchConfig(str(path), phrases=50, prompts=2, max_new=6, repeats=1),
                        progress=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 2), (2, 2)] and r.requests == 2 and r.rules == ("prefix-penalty",) and r.compile_s > 0
    assert 0 < r.tokens_plain <= 12 and 0 < r.tokens_rules <= 12
    assert r.plain_tps == pytest.approx(r.tokens_plain / r.plain_s)
    assert r.ratio == pytest.approx(r.rules_tps / r.plain_tps) == pytest.approx(r.paired_ratio)
    assert r.meets_target == (r.ratio >= 0.95) and 0 <= r.identical_replies <= 2
