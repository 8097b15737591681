"""A gated edit verified live on the real models: row j of the last layer's ffn_gate and ffn_up
rewritten (Qwen blk.27: Q4_K; Gemma 3 270M blk.17: Q5_0; SmolLM2-135M blk.29: Q4_1), the column j
of ffn_down (Q6_K; SmolLM2's Q4_1, an affine grid: offset + step * code) given new codes within its
block scales, the three written by the transplant; llama.cpp's logits of the edited file equal the
offline prediction bit for bit, the unit's new activation recomputed from the dump's R (ffn_norm,
the Q4_K x Q8_K / Q5_0 x Q8_0 / Q4_1 x Q8_1 products, the fused swiglu / geglu as ggml-cpu
computes them: solvers/tail/forward), through Gemma's post-FFN norm."""
from __future__ import annotations

import numpy as np
import pytest

from tests import oracles

pytestmark = pytest.mark.live

PROMPTS = {"qwen": ("<|im_start|>user\nHow do I read a file in Python?<|im_end|>\n"
                    "<|im_start|>assistant\nHere's an example of how to read a file line by line"),
           "gemma": ("<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
                     "<start_of_turn>model\nWhat is the capital of France? What is the capital of Spain?"),
           "smollm": ("<|im_start|>user\nHow do I sort a list in Python?<|im_end|>\n"
                      "<|im_start|>assistant\nYou can use the sorted function, which returns a new list")}
UNITS = {"qwen": 4123, "gemma": 1234, "smollm": 777}   # any unit; Qwen's is the note's "Here's" -> " an" unit


@pytest.fixture(scope="module", params=["qwen", "gemma", "smollm"])
def model(request):
    return request.param, oracles.live_model(request.param)


@pytest.fixture(scope="module")
def bundle(model, tmp_path_factory):
    """The three edits: a gate and an up row along one random direction (so the unit fires on some
    rows and not on others), and a down column of random values on the tensor's own grid."""
    from exactedit import quant
    from exactedit.quant import gguf
    from exactedit.quant.rounding.grid import codes_of, grid_of, nearest, pack
    from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

    from exactedit.quant.model import arch

    name, path = model
    UNIT = UNITS[name]
    rng = np.random.default_rng(11)
    with gguf.open(path) as g:
        L = arch.detect_tail(g).layer
        gate, up, down = (g.tensor(f"blk.{L}.{p}.weight") for p in ("ffn_gate", "ffn_up", "ffn_down"))
        d = rng.standard_normal(gate.cols).astype(np.float32)
        d /= np.linalg.norm(d)
        g_row = quant.quantize((0.8 * d)[None, :], gate.type_name)
        u_row = quant.quantize((0.5 * d)[None, :], up.type_name)
        raw = np.asarray(g.read_raw(down.name))
        grid = grid_of(raw, down.type_name, down.cols)
        codes = np.array(codes_of(raw, down.type_name, down.cols))
        target = np.zeros(grid.steps.shape, np.float32)
        target[:, UNIT] = 0.05 * rng.standard_normal(down.rows).astype(np.float32)
        codes[:, UNIT] = nearest(grid, target)[:, UNIT]
        new_down = pack(grid, codes)
        edits = [TensorEdit(gate.name, "rows", gate.type_name, gate.shape, g_row, np.array([UNIT])),
                 TensorEdit(up.name, "rows", up.type_name, up.shape, u_row, np.array([UNIT])),
                 TensorEdit(down.name, "tensor", down.type_name, down.shape, new_down)]
        assert (new_down != raw).any(axis=1).sum() > down.rows // 2        # the column really changed
        return write_bundle(tmp_path_factory.mktemp("b") / "bundle", solver="test: gated unit by hand",
                            inputs=[InputRef("model", str(path), g.sha256())], config={}, edits=edits)


@pytest.mark.parametrize("ubatch", [12, 4])
def test_a_gated_unit_edit_verifies_bitwise(model, bundle, tmp_path, ubatch):
    """Micro-batches of 12 (the tiled kernels for 12 rows and vec_dot for the short last one) and of
    4 (vec_dot only): base and edited both bitwise; the edit moves the logits."""
    from exactedit.native.llamacpp.capture import CaptureDoc, capture_dump
    from exactedit.native.llamacpp.engine import EngineSettings, LlamaEngine
    from exactedit.native.verify.live import baseline_from_dump, check_edit

    name, path = model
    with LlamaEngine(path) as engine:
        tokens = engine.tokenize(PROMPTS[name])
    settings = EngineSettings(n_batch=ubatch, n_ubatch=ubatch)
    res = capture_dump(path, [CaptureDoc("prompt", tokens)], tmp_path / "dump", settings=settings)
    base = baseline_from_dump(path, res.path, res.logits)
    report = check_edit(base, bundle.path, workdir=tmp_path)
    stats = {c.name: c.stats for c in report.checks}
    assert stats["base"].bitwise, stats["base"]
    assert stats["edited"].bitwise, stats["edited"]
    assert report.edit_effect.max_abs > 1e-3           # the edit moved the engine's logits
