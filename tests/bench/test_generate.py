"""`exactedit bench generate` on the real Gemma 3 270M: a tiny run of both loops; up to 3 slots every
reply is the one-at-a-time loop's (so the ratio compares the same work), the ratio is the measured
tokens/s over the baseline's, and the config is validated."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests import oracles

pytestmark = pytest.mark.live


def test_tiny_run_same_replies_and_the_ratio():
    from exactedit.bench.generate import GenerateBenchConfig, render_generate_bench, run_generate_bench

    path = oracles.live_model("gemma")
    seen = []
    r = run_generate_bench(GenerateBenchConfig(str(path), prompts=3, max_new=6, slots=3),
                           progress=lambda d, t: seen.append((d, t)))
    assert r.replies == 3 and r.identical_replies == 3 and r.tokens == r.tokens_one_at_a_time > 0
    assert r.ratio == pytest.approx(r.batched_tps / r.one_at_a_time_tps)
    assert r.batched_tps == pytest.approx(r.tokens / r.batched_s)
    assert seen == [(1, 2), (2, 2)]
    assert "ratio (batched / one at a time" in render_generate_bench(r)


def test_cli_json():
    from exactedit import cli

    oracles.live_model("gemma")
    res = CliRunner().invoke(cli.main, ["bench", "generate", "--model", "gemma", "--prompts", "2", "--max-new", "4",
                                        "--slots", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["bench"] == "generate" and out["replies"] == 2 and out["identical_replies"] == 2


def test_config_is_validated():
    from exactedit.bench.generate import GenerateBenchConfig
    from exactedit.native.llamacpp.engine import EngineError

    with pytest.raises(EngineError, match="slots"):
        GenerateBenchConfig("m.gguf", slots=0)
    with pytest.raises(EngineError, match="prompts"):
        GenerateBenchConfig("m.gguf", prompts=13)
