"""End to end on the real SmolLM2-135M-Instruct (llama architecture): a tied Q8_0 head and a Q4_1
last ffn_down. `exactedit logits --match-engine llamacpp` equals llama.cpp's logits bit for bit
(micro-batches 12, 12, 1: llamafile's Q8_0 sgemm and ggml's vec_dot for the head, Q4_1 x Q8_1
vec_dot for ffn_down at every micro-batch size); on the untied copy, a head-row edit (Q8_0) and a
last-layer ffn_down edit in its native Q4_1 verify live, bitwise, and the ffn_down edit written
one row off fails."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from tests import oracles

pytestmark = pytest.mark.live

PROMPT = ("<|im_start|>user\nName three long rivers and say where each one reaches the sea.<|im_end|>\n"
          "<|im_start|>assistant\nThe Nile reaches the Mediterranean, the Amazon")
TOKENS = 25             # with micro-batches of 12: 12, 12, 1
DOWN = "blk.29.ffn_down.weight"


@pytest.fixture(scope="module")
def smollm():
    return oracles.live_model("smollm")  # missing extra: a skip, or a failure in CI (tests/oracles.py)


@pytest.fixture(scope="module")
def tokens(smollm):
    from exactedit.native.llamacpp.engine import LlamaEngine

    with LlamaEngine(smollm) as engine:
        toks = engine.tokenize(PROMPT)
    assert toks.size >= TOKENS
    return toks[:TOKENS]


def _capture(model, tokens, where):
    from exactedit.native.llamacpp.capture import CaptureDoc, capture_dump
    from exactedit.native.llamacpp.engine import EngineSettings

    return capture_dump(model, [CaptureDoc("prompt", tokens)], where / "dump",
                        settings=EngineSettings(n_batch=12, n_ubatch=12))


def test_the_tail_is_the_documented_one(smollm):
    from exactedit.quant.model import arch
    from exactedit.quant import gguf

    with gguf.open(smollm) as g:
        tail = arch.detect_tail(g)
    assert tail.kind == "rmsnorm" and tail.tied and tail.layer == 29
    assert (tail.tensor("head").type_name, tail.tensor("ffn_down").type_name) == ("Q8_0", "Q4_1")


def test_logits_match_engine_is_bitwise_on_the_tied_model(smollm, tokens, tmp_path):
    from exactedit import cli

    res = _capture(smollm, tokens, tmp_path)
    assert res.meta["ubatch_sizes"] == [12, 12, 1]
    out = tmp_path / "l.npy"
    r = CliRunner().invoke(cli.main, ["logits", "--model", str(smollm), "--dump", str(res.path),
                                      "--out", str(out), "--match-engine", "llamacpp"])
    assert r.exit_code == 0, r.output
    got = np.load(out)
    assert np.array_equal(got, res.logits), f"max |diff| {np.abs(got - res.logits).max()}"


@pytest.fixture(scope="module")
def untied(smollm, tmp_path_factory):
    from exactedit.quant.model.untie import untie

    return untie(smollm, tmp_path_factory.mktemp("u") / "smollm-untied.gguf").dst


@pytest.fixture(scope="module")
def baseline(untied, tokens, tmp_path_factory):
    from exactedit.native.verify.live import baseline_from_dump

    res = _capture(untied, tokens, tmp_path_factory.mktemp("d"))
    return baseline_from_dump(untied, res.path, res.logits)


@pytest.fixture(scope="module")
def bundle(untied, baseline, tmp_path_factory):
    """The head row of the last position's top token nudged and re-quantized to Q8_0, and eight
    ffn_down rows nudged and re-quantized to Q4_1 (the edited-rows-only round trip)."""
    from exactedit.quant import gguf
    from exactedit.quant.rounding.roundtrip import requantize_rows
    from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

    row = int(baseline.logits[-1].argmax())
    rng = np.random.default_rng(11)
    with gguf.open(untied) as g:
        head, down = g.tensor("output.weight"), g.tensor(DOWN)
        w = g.read_rows(head.name, row, row + 1)
        w = w + np.float32(0.02) * rng.choice([-1, 1], size=w.shape).astype(np.float32)
        d = g.read_rows(down.name, 0, 8)
        d = d + np.float32(0.05) * rng.standard_normal(d.shape).astype(np.float32)
        rt_head = requantize_rows(g.read_raw(head.name), "Q8_0", head.shape[1], [row], w)
        rt_down = requantize_rows(g.read_raw(down.name), "Q4_1", down.shape[1], np.arange(8), d)
        assert rt_down.changed_rows.tolist() == list(range(8))
        edits = [TensorEdit(head.name, "rows", "Q8_0", head.shape, rt_head.raw[[row]], np.array([row])),
                 TensorEdit(down.name, "rows", "Q4_1", down.shape, rt_down.raw[:8], np.arange(8))]
    return write_bundle(tmp_path_factory.mktemp("b") / "bundle", solver="test-by-hand",
                        inputs=[InputRef("model", str(untied), gguf.file_sha256(untied))], config={},
                        edits=edits)


def test_untied_dump_predicts_engine_bitwise(baseline):
    assert baseline.match.ubatch_sizes == (12, 12, 1)
    assert np.array_equal(baseline.predicted, baseline.logits)


def test_edit_verifies_live_bitwise(baseline, bundle):
    from exactedit.native.verify.live import check_edit

    report = check_edit(baseline, bundle.path)
    assert report.passed, report.checks
    assert report.edit_effect.kl_max > 1e-4            # the edit really moved the engine's logits
    assert all(c.stats.bitwise for c in report.checks), report.checks


def test_ffn_down_edit_one_row_off_fails(untied, baseline, bundle, tmp_path):
    from exactedit.native.verify.live import check_edit
    from exactedit.quant import gguf
    from exactedit.quant.gguf.transplant import transplant

    head_edit, down_edit = bundle.edits
    with gguf.open(untied) as g:
        head = np.array(g.read_raw("output.weight"))
        down = np.array(g.read_raw(DOWN))
    head[head_edit.row_ids] = head_edit.raw
    down[down_edit.row_ids + 1] = down_edit.raw
    bad = tmp_path / "bad.gguf"
    transplant(untied, bad, replace={"output.weight": head, DOWN: down})
    report = check_edit(baseline, bundle.path, edited=bad)
    assert report.checks[0].passed and not report.checks[1].passed
