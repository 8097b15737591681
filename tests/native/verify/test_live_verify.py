"""End to end on the real Qwen model: engine -> dump -> head-row and last-layer edits -> transplant
-> llama.cpp's logits equal the offline, engine-faithful prediction; a wrong-row file and a
mis-quantized file fail the same check."""
from __future__ import annotations

import numpy as np
import pytest

from tests import oracles

pytestmark = pytest.mark.live

PROMPT = ("<|im_start|>user\nWrite two sentences about rivers, rather than lakes.<|im_end|>\n"
          "<|im_start|>assistant\nRivers run to the sea, and in the end they")
HEAD_ROW = 835          # " end" in Qwen2.5's vocabulary; any row works
DOWN_ROWS = np.arange(8)


@pytest.fixture(scope="module")
def qwen():
    return oracles.live_model("qwen")  # missing extra: a skip, or a failure in CI (tests/oracles.py)


@pytest.fixture(scope="module")
def tokens(qwen):
    from exactedit.native.llamacpp.engine import LlamaEngine

    with LlamaEngine(qwen) as engine:
        return engine.tokenize(PROMPT)


def _edits(qwen):
    """A head-row edit and a last-layer ffn_down edit, each re-quantized to Q6_K."""
    from exactedit import quant
    from exactedit.quant import gguf
    from exactedit.solvers.bundle import TensorEdit

    rng = np.random.default_rng(7)
    with gguf.open(qwen) as g:
        head, down = g.tensor("output.weight"), g.tensor("blk.27.ffn_down.weight")
        row = g.read_rows("output.weight", HEAD_ROW, HEAD_ROW + 1)
        new_row = row + np.float32(0.03) * rng.choice([-1, 1], size=row.shape).astype(np.float32)
        rows = g.read_rows(down.name, 0, len(DOWN_ROWS))
        new_rows = rows + np.float32(0.02) * rng.standard_normal(rows.shape).astype(np.float32)
        return (TensorEdit(head.name, "rows", "Q6_K", head.shape, quant.quantize(new_row, "Q6_K"),
                           np.array([HEAD_ROW])),
                TensorEdit(down.name, "rows", "Q6_K", down.shape, quant.quantize(new_rows, "Q6_K"),
                           DOWN_ROWS), new_row)


@pytest.fixture(scope="module")
def bundle(qwen, tmp_path_factory):
    from exactedit.quant import gguf
    from exactedit.solvers.bundle import InputRef, write_bundle

    head_edit, down_edit, _ = _edits(qwen)
    sha = gguf.file_sha256(qwen)
    return write_bundle(tmp_path_factory.mktemp("b") / "bundle", solver="test-by-hand",
                        inputs=[InputRef("model", str(qwen), sha)], config={},
                        edits=[head_edit, down_edit])


@pytest.fixture(scope="module")
def baseline(qwen, tokens, tmp_path_factory):
    """One engine run, captured as a dump with micro-batches of 12 (so both of ggml-cpu's Q6_K
    kernels run: tiled for 12 rows, vec_dot for the short last one), and its prediction."""
    from exactedit.native.llamacpp.capture import CaptureDoc, capture_dump
    from exactedit.native.llamacpp.engine import EngineSettings
    from exactedit.native.verify.live import baseline_from_dump

    settings = EngineSettings(n_batch=12, n_ubatch=12)
    res = capture_dump(qwen, [CaptureDoc("prompt", tokens)], tmp_path_factory.mktemp("d") / "dump",
                       settings=settings)
    return baseline_from_dump(qwen, res.path, res.logits)


def test_dump_predicts_engine_logits_bitwise(baseline, tokens):
    """The dump's R and hh reproduce the engine's own logits through the engine-faithful tail."""
    assert baseline.settings.n_ubatch == 12 and baseline.match.ubatch_sizes[-1] < 8
    assert baseline.match.tiled_rows().any() and not baseline.match.tiled_rows().all()
    assert np.array_equal(baseline.tokens, tokens)
    assert np.array_equal(baseline.predicted, baseline.logits)


def test_edit_verifies_live(baseline, bundle):
    from exactedit.native.verify.live import check_edit

    report = check_edit(baseline, bundle.path)
    assert report.passed, report.checks
    assert report.edit_effect.kl_max > 1e-4           # the edit really moved the engine's logits
    for check in report.checks:
        assert check.stats.bitwise, check               # the goal, met on the shipped build


def _write_file(qwen, tmp_path, head_raw, down_raw):
    """A file with the head rows `head_raw` ({row: bytes}) and the whole ffn_down `down_raw`."""
    from exactedit.quant import gguf
    from exactedit.quant.gguf.transplant import transplant

    with gguf.open(qwen) as g:
        full = np.array(g.read_raw("output.weight"))
        full[list(head_raw)] = np.stack(list(head_raw.values()))
    replace = {"output.weight": full, "blk.27.ffn_down.weight": down_raw}
    out = tmp_path / "bad.gguf"
    transplant(qwen, out, replace=replace)
    return out


def _edited_down(qwen, down_edit):
    from exactedit.quant import gguf

    with gguf.open(qwen) as g:
        down = np.array(g.read_raw(down_edit.tensor))
    down[down_edit.row_ids] = down_edit.raw
    return down


def test_wrong_row_fails(qwen, baseline, bundle, tmp_path):
    """The head edit written one row off (the ffn_down edit right): the edited check fails."""
    from exactedit.native.verify.live import check_edit

    head_edit, down_edit = bundle.edits
    bad = _write_file(qwen, tmp_path, {HEAD_ROW + 1: head_edit.raw[0]}, _edited_down(qwen, down_edit))
    report = check_edit(baseline, bundle.path, edited=bad)
    assert report.checks[0].passed and not report.checks[1].passed


def test_misquantized_tensor_fails(qwen, baseline, bundle, tmp_path):
    """The edited head row with every super-block scale d one fp16 step off (a quantizer rounding
    d the wrong way): the check must see it. (Re-quantizing the rows from their own dequantized
    values is no test: Q6_K then often flips a sub-block's sign, bytes differ, values do not.)"""
    from exactedit.quant.kquants import q6_k
    from exactedit.native.verify.live import check_edit

    head_edit, down_edit = bundle.edits
    bad_row = head_edit.raw[0].copy()
    blocks = bad_row.view(q6_k.BLOCK)
    blocks["d"] = (blocks["d"].view(np.uint16) + 1).view(np.float16)
    bad = _write_file(qwen, tmp_path, {HEAD_ROW: bad_row}, _edited_down(qwen, down_edit))
    report = check_edit(baseline, bundle.path, edited=bad)
    assert report.checks[0].passed and not report.checks[1].passed
    assert report.checks[1].stats.max_abs < 1.0          # a small error, and still caught
