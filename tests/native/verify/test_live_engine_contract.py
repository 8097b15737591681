"""`exactedit verify engine`: the production engine's command contract, exercised with
`exactedit engine run` (llama.cpp) as the engine, on the real Qwen model: the engine's logits on
base and edited files equal the offline `--match-engine llamacpp` prediction bit for bit, and an
exact-arithmetic prediction fails the default tolerance."""
from __future__ import annotations

import shlex
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from tests import oracles

pytestmark = pytest.mark.live

PROMPT = "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\nHello, and"
ROW = 835


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from exactedit import quant
    from exactedit.native.llamacpp.capture import CaptureDoc, capture_dump
    from exactedit.native.llamacpp.engine import LlamaEngine
    from exactedit.quant import gguf
    from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

    qwen = oracles.live_model("qwen")  # missing extra: a skip, or a failure in CI
    with LlamaEngine(qwen) as engine:
        tokens = engine.tokenize(PROMPT)
    tmp = tmp_path_factory.mktemp("contract")
    dump = capture_dump(qwen, [CaptureDoc("prompt", tokens)], tmp / "dump").path
    with gguf.open(qwen) as g:
        info = g.tensor("output.weight")
        row = g.read_rows(info.name, ROW, ROW + 1)
    bundles = {}
    for name, row_id, delta in (("good", ROW, 0.05),):
        new = row + np.float32(delta) * np.sign(np.arange(row.size) % 3 - 1).astype(np.float32)
        edit = TensorEdit(info.name, "rows", "Q6_K", info.shape, quant.quantize(new, "Q6_K"), np.array([row_id]))
        bundles[name] = write_bundle(tmp / name, solver="test-by-hand",
                                     inputs=[InputRef("model", str(qwen), gguf.file_sha256(qwen))], config={},
                                     edits=[edit]).path
    return qwen, dump, bundles


def _run(qwen, dump, bundle):
    from exactedit import cli

    template = (f"{shlex.quote(sys.executable)} -m cli engine run --metal-gguf {{gguf}} "
                f"--tokens-file {{tokens}} --logits-out {{logits}}")
    return CliRunner().invoke(cli.main, ["verify", "engine", "--command", template, "--model", str(qwen),
                                         "--bundle", str(bundle), "--dump", str(dump),
                                         "--match-engine", "llamacpp", "--json"])


def test_engine_contract_matches_the_offline_prediction_bitwise(world):
    import json

    qwen, dump, bundles = world
    r = _run(qwen, dump, bundles["good"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["passed"] and all(c["stats"]["bitwise"] for c in rep["checks"])
    assert rep["edit_effect"]["kl_max"] > 0          # the edit did move the engine's logits


def test_exact_arithmetic_fails_the_default_tolerance(world):
    """Without the engine-faithful arithmetic the prediction misses the engine's activation
    quantization: the default tolerance (mean KL <= 1e-8, max KL <= 1e-5) is tight enough to say so."""
    from exactedit import cli

    qwen, dump, bundles = world
    template = (f"{shlex.quote(sys.executable)} -m cli engine run --metal-gguf {{gguf}} "
                f"--tokens-file {{tokens}} --logits-out {{logits}}")
    r = CliRunner().invoke(cli.main, ["verify", "engine", "--command", template, "--model", str(qwen),
                                      "--bundle", str(bundles["good"]), "--dump", str(dump)])
    assert r.exit_code == 1, r.output
    assert "FAIL" in r.stdout
