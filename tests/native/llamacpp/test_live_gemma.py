"""End to end on the real Gemma 3 270M: a tied Q8_0 head, a Q6_K last ffn_down and a post-FFN norm.
`exactedit logits --match-engine llamacpp` equals llama.cpp's logits bit for bit (micro-batches
12, 12, 1: llamafile's Q8_0 sgemm and ggml's vec_dot, the tiled and the vec_dot Q6_K kernels);
on the untied copy, a head-row edit and a last-layer edit verify live, bitwise, and an edit one
row off fails; an edit of the tied row itself is refused."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from tests import oracles

pytestmark = pytest.mark.live

PROMPT = ("<start_of_turn>user\nName three long rivers and say where each one reaches the sea."
          "<end_of_turn>\n<start_of_turn>model\nThe Nile reaches the Mediterranean, the Amazon")
TOKENS = 25             # with micro-batches of 12: 12, 12, 1
DOWN = "blk.17.ffn_down.weight"


@pytest.fixture(scope="module")
def gemma():
    return oracles.live_model("gemma")  # missing extra: a skip, or a failure in CI (tests/oracles.py)


@pytest.fixture(scope="module")
def tokens(gemma):
    from exactedit.native.llamacpp.engine import LlamaEngine

    with LlamaEngine(gemma) as engine:
        toks = engine.tokenize(PROMPT)
    assert toks.size >= TOKENS
    return toks[:TOKENS]


def _capture(model, tokens, where):
    from exactedit.native.llamacpp.capture import CaptureDoc, capture_dump
    from exactedit.native.llamacpp.engine import EngineSettings

    return capture_dump(model, [CaptureDoc("prompt", tokens)], where / "dump",
                        settings=EngineSettings(n_batch=12, n_ubatch=12))


def test_logits_match_engine_is_bitwise_on_the_tied_model(gemma, tokens, tmp_path):
    from exactedit import cli

    res = _capture(gemma, tokens, tmp_path)
    assert res.meta["ubatch_sizes"] == [12, 12, 1]
    out = tmp_path / "l.npy"
    r = CliRunner().invoke(cli.main, ["logits", "--model", str(gemma), "--dump", str(res.path),
                                      "--out", str(out), "--match-engine", "llamacpp"])
    assert r.exit_code == 0, r.output
    got = np.load(out)
    assert np.array_equal(got, res.logits), f"max |diff| {np.abs(got - res.logits).max()}"


@pytest.fixture(scope="module")
def untied(gemma, tmp_path_factory):
    from exactedit.quant.model.untie import untie

    return untie(gemma, tmp_path_factory.mktemp("u") / "gemma-untied.gguf").dst


@pytest.fixture(scope="module")
def baseline(untied, tokens, tmp_path_factory):
    from exactedit.native.verify.live import baseline_from_dump

    res = _capture(untied, tokens, tmp_path_factory.mktemp("d"))
    return baseline_from_dump(untied, res.path, res.logits)


@pytest.fixture(scope="module")
def bundle(untied, baseline, tmp_path_factory):
    """The head row of the last position's top token nudged and re-quantized to Q8_0, and eight
    ffn_down rows nudged and re-quantized to Q6_K."""
    from exactedit import quant
    from exactedit.quant import gguf
    from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

    row = int(baseline.logits[-1].argmax())
    rng = np.random.default_rng(11)
    with gguf.open(untied) as g:
        head, down = g.tensor("output.weight"), g.tensor(DOWN)
        w = g.read_rows(head.name, row, row + 1)
        w = w + np.float32(0.02) * rng.choice([-1, 1], size=w.shape).astype(np.float32)
        d = g.read_rows(down.name, 0, 8)
        d = d + np.float32(0.02) * rng.standard_normal(d.shape).astype(np.float32)
        edits = [TensorEdit(head.name, "rows", "Q8_0", head.shape, quant.quantize(w, "Q8_0"), np.array([row])),
                 TensorEdit(down.name, "rows", "Q6_K", down.shape, quant.quantize(d, "Q6_K"), np.arange(8))]
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


def test_head_edit_one_row_off_fails(untied, baseline, bundle, tmp_path):
    from exactedit.native.verify.live import check_edit
    from exactedit.quant import gguf
    from exactedit.quant.gguf.transplant import transplant

    head_edit, down_edit = bundle.edits
    with gguf.open(untied) as g:
        head = np.array(g.read_raw("output.weight"))
        down = np.array(g.read_raw(DOWN))
    head[head_edit.row_ids[0] + 1] = head_edit.raw[0]
    down[down_edit.row_ids] = down_edit.raw
    bad = tmp_path / "bad.gguf"
    transplant(untied, bad, replace={"output.weight": head, DOWN: down})
    report = check_edit(baseline, bundle.path, edited=bad)
    assert report.checks[0].passed and not report.checks[1].passed


def test_tied_row_edit_is_refused(gemma, baseline):
    from exactedit.native.llamacpp.engine import EngineError
    from exactedit.native.verify.live import predict_rmsnorm
    from exactedit.quant import gguf

    with gguf.open(gemma) as g:
        raw = {"token_embd.weight": np.array(g.read_raw("token_embd.weight"))}
        with pytest.raises(EngineError, match="tied"):
            predict_rmsnorm(g, baseline.R, baseline.hh, baseline.match, raw)
