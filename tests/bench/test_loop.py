"""`exactedit bench loop` on the real SmolLM2-135M: a tiny run through the CLI, its JSON (file and
stdout) checked for every step, the same work on both sides and finite positive ratios (no timing
thresholds: the machine may be shared); and the config validated."""
from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from tests import oracles


@pytest.mark.live
def test_tiny_run_json_and_ratios(tmp_path):
    from exactedit import cli

    oracles.live_model("smollm")
    out = tmp_path / "loop.json"
    res = CliRunner().invoke(cli.main, ["bench", "loop", "--model", "smollm", "--phrases", "2", "--prompts", "2",
                                        "--samples", "2", "--max-new", "8", "--corpus-tokens", "160",
                                        "--head-rows", "16", "--threads", "1", "--gpu-layers", "0", "--out", str(out),
                                        "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert json.loads(out.read_text()) == got
    assert got["bench"] == "loop" and got["replies"] == 4 and got["windows"] >= 1
    assert got["config"]["settings"]["n_gpu_layers"] == 0 and got["config"]["settings"]["n_threads"] == 1
    steps = {s["step"]: s for s in got["steps"]}
    assert list(steps) == ["generate", "capture", "evaluate", "corpus", "vocab pass"]
    assert steps["generate"]["work"] == 4 * 8                   # no stop token: every reply runs to max_new
    assert steps["capture"]["work"] == steps["evaluate"]["work"] == steps["corpus"]["work"] > 0
    assert steps["vocab pass"]["work"] == 16 * got["n_vocab"]
    for s in steps.values():
        for key in ("seconds", "rate", "ceiling_seconds", "ceiling_rate", "ratio"):
            assert math.isfinite(s[key]) and s[key] > 0, (s["step"], key)
        assert s["ratio"] == pytest.approx(s["rate"] / s["ceiling_rate"])
        assert s["rate"] == pytest.approx(s["work"] / s["seconds"])
    assert got["ratios"] == {k: s["ratio"] for k, s in steps.items()}


def test_config_is_validated():
    from exactedit.bench.loop import LoopBenchConfig
    from exactedit.native.llamacpp.engine import EngineError

    with pytest.raises(EngineError, match="phrases"):
        LoopBenchConfig("m.gguf", phrases=9)
    with pytest.raises(EngineError, match="max_new"):
        LoopBenchConfig("m.gguf", max_new=0)
    with pytest.raises(EngineError, match="settings"):
        LoopBenchConfig("m.gguf", settings={"n_threads": 1})
