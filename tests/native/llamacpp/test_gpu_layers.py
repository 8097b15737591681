"""--gpu-layers (issue 41): the engine's n_gpu_layers, validated in EngineSettings, recorded only when
layers are offloaded (a CPU run's record, dumps and stage keys as before), defaulting to all layers
with a GPU build of llama-cpp-python and to 0 without one, on every command that opens the engine;
verify live says when its engine ran on a GPU backend."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit.native.llamacpp import engine as eng
from exactedit.native.llamacpp.engine import ALL_LAYERS, MAX_GPU_LAYERS, EngineError, EngineSettings

# every command that opens the llama.cpp engine to generate or evaluate (persona: issue 41's follow-up)
ENGINE_COMMANDS = (("generate",), ("mine",), ("serve",), ("dataset", "build"), ("dataset", "corpus"),
                   ("engine", "dump"), ("engine", "run"), ("shape", "rates"), ("verify", "live"),
                   ("verify", "shaping"), ("antislop",), ("demo",), ("discover",), ("bench", "loop"))


@pytest.mark.parametrize("bad", [-2, MAX_GPU_LAYERS + 1, 1.5, True, "all", None])
def test_bad_layers_are_refused(bad):
    with pytest.raises(EngineError, match="n_gpu_layers"):
        EngineSettings(n_gpu_layers=bad)


@pytest.mark.parametrize("layers", [ALL_LAYERS, 0, 1, 99, MAX_GPU_LAYERS])
def test_layers_round_trip_through_the_record(layers):
    s = EngineSettings(n_gpu_layers=layers)
    meta = s.as_meta()
    assert ("n_gpu_layers" in meta) == (layers != 0) == s.offloaded
    assert EngineSettings.from_meta(meta) == s


def test_a_cpu_record_is_the_one_before_the_setting():
    # what a dump (and so a stage's output hash, and a key holding it) recorded before issue 41
    old = {"n_ctx": 2048, "n_batch": 512, "n_ubatch": 512, "n_threads": 2, "flash_attn": "off"}
    assert EngineSettings().as_meta() == old
    assert EngineSettings.from_meta(old).n_gpu_layers == 0


@pytest.mark.parametrize("gpu, want", [(True, ALL_LAYERS), (False, 0)])
def test_the_default_follows_the_build(monkeypatch, gpu, want):
    monkeypatch.setattr(eng, "gpu_offload", lambda: gpu)
    assert eng.default_gpu_layers() == want
    from exactedit import cli

    assert cli._settings(2048, 512, 512, 2, "off").n_gpu_layers == want
    assert cli._settings(2048, 512, 512, 2, "off", 3).n_gpu_layers == 3


@pytest.mark.parametrize("path", ENGINE_COMMANDS, ids=" ".join)
def test_every_engine_command_has_the_flag(path):
    from exactedit import cli

    cmd = cli.main
    for name in path:
        cmd = cmd.commands[name]
    assert any("--gpu-layers" in p.opts for p in cmd.params), path


def test_the_flag_is_bounded_on_the_command_line():
    from exactedit import cli

    res = CliRunner().invoke(cli.main, ["engine", "run", "m.gguf", "t.bin", "o.npy", "--gpu-layers", "-2"])
    assert res.exit_code == 2 and "--gpu-layers" in res.output


def test_antislop_refuses_bad_layers_and_keeps_cpu_keys(monkeypatch):
    from exactedit.runs.antislop.config import AntislopConfig, AntislopError
    from exactedit.runs.antislop.pipeline import _offload

    with pytest.raises(AntislopError, match=r"gpu_layers \(--gpu-layers\)"):
        AntislopConfig(gpu_layers=-5)
    monkeypatch.setattr(eng, "gpu_offload", lambda: False)
    assert AntislopConfig().engine_settings() == EngineSettings()
    assert AntislopConfig(gpu_layers=7).engine_settings().n_gpu_layers == 7

    class Run:                                  # what _offload reads of a run
        settings = EngineSettings()

    assert _offload(Run()) == {}                # the data, corpus and rates keys of a CPU run: unchanged
    Run.settings = EngineSettings(n_gpu_layers=ALL_LAYERS)
    assert _offload(Run()) == {"gpu_layers": ALL_LAYERS}


def _report(settings: dict):
    from exactedit.native.verify.live import Check, Tolerance, VerifyReport, logit_stats

    a = np.zeros((2, 4), np.float32)
    s = logit_stats(a, a)
    return VerifyReport("m", "0" * 64, "e", "1" * 64, "2" * 64, 2, settings, (2,), (Check("base", s, ()),), s,
                        Tolerance())


def test_verify_says_when_its_engine_ran_on_a_gpu():
    from exactedit.native.verify.live import render_report

    cpu = _report(EngineSettings().as_meta())
    assert cpu.offload_note is None and "offload_note" not in cpu.to_json()
    assert "GPU" not in render_report(cpu)
    gpu = _report(EngineSettings(n_gpu_layers=ALL_LAYERS).as_meta())
    assert "CPU-faithful" in gpu.offload_note and gpu.to_json()["offload_note"] == gpu.offload_note
    assert "note: llama.cpp ran with all layers on a GPU backend" in render_report(gpu)


@pytest.mark.live
def test_a_cpu_build_refuses_offload_and_runs_with_none():
    from tests import oracles

    path = oracles.live_model("smollm")
    if eng.gpu_offload():
        pytest.skip("llama-cpp-python here has a GPU backend")
    with pytest.raises(EngineError, match="without a GPU backend"):
        eng.LlamaEngine(path, EngineSettings(n_gpu_layers=ALL_LAYERS))
    s = dataclasses.replace(EngineSettings(), n_ctx=64)
    with eng.LlamaEngine(path, s) as e:
        run = e.evaluate(e.tokenize("The cat sat on the mat."))
    assert run.meta()["engine_settings"] == s.as_meta() and "n_gpu_layers" not in run.meta()["engine_settings"]
