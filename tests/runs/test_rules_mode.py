"""`--rules-mode` wired from the commands to the one generation loop, no engine: the settings that
refuse a mode they cannot run (antislop's config, serve's config, a rewind without the rules'
phrases), and each command handing the mode on (`generate`, `shape rates`, `serve`, the antislop
rates stage). The rewind itself: tests/native/llamacpp/test_rewind.py; live:
tests/native/shaping/test_live_rewind.py, tests/runs/test_live_serve_rewind.py."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from exactedit.runs.antislop.config import FLAGS, AntislopConfig, AntislopError
from exactedit.runs.serve.config import ServeConfig, ServeError


class _Called(Exception):
    """Raised by a stand-in for the library call, carrying what the command gave it."""


def _capture(monkeypatch, module, name):
    def stand_in(*args, **kw):
        raise _Called(args, kw)

    monkeypatch.setattr(module, name, stand_in)


def test_antislop_takes_the_mode_and_refuses_another_by_its_flag():
    assert "rules_mode" in FLAGS and AntislopConfig(model="m.gguf").rules_mode == "penalty"
    assert AntislopConfig(model="m.gguf", rules_mode="rewind").rules_mode == "rewind"
    with pytest.raises(AntislopError, match=r"rules_mode \(--rules-mode\): expected one of penalty, rewind"):
        AntislopConfig(model="m.gguf", rules_mode="rollback")


def test_serve_refuses_a_rewind_without_rules_and_an_unknown_mode():
    assert ServeConfig(model="m.gguf", rules="r.json", rules_mode="rewind").rules_mode == "rewind"
    with pytest.raises(ServeError, match="give --rules"):
        ServeConfig(model="m.gguf", rules_mode="rewind")
    with pytest.raises(ServeError, match="expected one of"):
        ServeConfig(model="m.gguf", rules="r.json", rules_mode="both")


def test_a_rewind_needs_the_rules_prefix_penalty():
    from exactedit.native.shaping.live import rewind_for
    from exactedit.solvers.shaping.compiled import ShapingRulesError

    assert rewind_for(None, "penalty") is None
    with pytest.raises(ShapingRulesError, match="prefix penalty"):
        rewind_for(None, "rewind")

    class NoPenalty:
        def rule(self, kind):
            return None

    with pytest.raises(ShapingRulesError, match="prefix penalty"):
        rewind_for(NoPenalty(), "rewind")
    with pytest.raises(ShapingRulesError, match="expected one of"):
        rewind_for(NoPenalty(), "hard")


@pytest.mark.parametrize("args, module, name", [
    (["generate", "--prompt", "hi"], "exactedit.native.shaping.live", "generate_text"),
    (["shape", "rates", "--prompts", "P"], "exactedit.native.shaping.rates", "shape_rates"),
    (["serve"], "exactedit.runs.serve.server", "serve"),
])
def test_each_command_hands_the_mode_on(monkeypatch, tmp_path, args, module, name):
    import importlib

    from exactedit.cli import main

    for f in ("m.gguf", "r.json", "P"):
        (tmp_path / f).write_text("x\n")
    monkeypatch.chdir(tmp_path)
    _capture(monkeypatch, importlib.import_module(module), name)
    for mode in ("penalty", "rewind"):
        res = CliRunner().invoke(main, args + ["--model", "m.gguf", "--rules", "r.json", "--rules-mode", mode])
        assert isinstance(res.exception, _Called), res.output
        called, kw = res.exception.args
        assert (called[0].rules_mode if name == "serve" else kw["rules_mode"]) == mode
    res = CliRunner().invoke(main, args + ["--model", "m.gguf", "--rules", "r.json", "--rules-mode", "hard"])
    assert res.exit_code == 2 and "--rules-mode" in res.output


def test_antislop_hands_the_mode_to_its_config(monkeypatch, tmp_path):
    from exactedit.cli import main
    from exactedit.runs.antislop import pipeline

    for f in ("m.gguf", "P"):
        (tmp_path / f).write_text("x\n")
    monkeypatch.chdir(tmp_path)
    _capture(monkeypatch, pipeline, "run_antislop")
    for mode, want in ((None, "penalty"), ("rewind", "rewind")):
        res = CliRunner().invoke(main, ["antislop", "--model", "m.gguf", "--out", "o", "--prompts", "P", "--phrases", "P",
                                        "--rate-prompts", "P"] + (["--rules-mode", mode] if mode else []))
        assert isinstance(res.exception, _Called), res.output
        assert res.exception.args[0][0].rules_mode == want


def test_the_antislop_rates_stage_hands_the_mode_on(monkeypatch, tmp_path):
    from exactedit.native.shaping import rates
    from exactedit.runs.antislop.arms import rate_arms

    _capture(monkeypatch, rates, "shape_rates")
    with pytest.raises(_Called) as got:
        rate_arms("m.gguf", "r.json", "e.gguf", ["p"], ["you can use"], [0], max_new=8, n_boot=0, out=tmp_path,
                  rules_mode="rewind")
    assert got.value.args[1]["rules_mode"] == "rewind"
