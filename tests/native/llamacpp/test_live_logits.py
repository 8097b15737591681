"""`exactedit logits --match-engine llamacpp` on a real engine dump equals the engine's own logits
bit for bit (both of ggml-cpu's Q6_K kernels exercised); the default exact mode stays within the
engine's activation-quantization error (KL ~1e-4 scale) but is not bitwise."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from tests import oracles

pytestmark = pytest.mark.live

PROMPT = "<|im_start|>user\nName three rivers.<|im_end|>\n<|im_start|>assistant\nThe Nile, the"


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    from exactedit.native.llamacpp.capture import CaptureDoc, capture_dump
    from exactedit.native.llamacpp.engine import EngineSettings, LlamaEngine

    qwen = oracles.live_model("qwen")  # missing extra: a skip, or a failure in CI
    with LlamaEngine(qwen) as engine:
        tokens = engine.tokenize(PROMPT)
    res = capture_dump(qwen, [CaptureDoc("prompt", tokens)], tmp_path_factory.mktemp("d") / "dump",
                       settings=EngineSettings(n_batch=10, n_ubatch=10))
    return qwen, res


def _kl(a, b):
    la = a - np.logaddexp.reduce(a.astype(np.float64), axis=1, keepdims=True)
    lb = b - np.logaddexp.reduce(b.astype(np.float64), axis=1, keepdims=True)
    return (np.exp(la) * (la - lb)).sum(1)


def test_logits_match_engine_is_bitwise(captured, tmp_path):
    from exactedit import cli

    qwen, res = captured
    out = tmp_path / "l.npy"
    r = CliRunner().invoke(cli.main, ["logits", "--model", str(qwen), "--dump", str(res.path),
                                      "--out", str(out), "--match-engine", "llamacpp"])
    assert r.exit_code == 0, r.output
    got = np.load(out)
    assert got.shape == res.logits.shape
    assert np.array_equal(got, res.logits), f"max |diff| {np.abs(got - res.logits).max()}"

    exact = tmp_path / "e.npy"
    r = CliRunner().invoke(cli.main, ["logits", "--model", str(qwen), "--dump", str(res.path), "--out", str(exact)])
    assert r.exit_code == 0, r.output
    e = np.load(exact)
    kl = _kl(res.logits, e)
    assert not np.array_equal(e, res.logits)       # the exact mode is not the engine's arithmetic
    assert kl.max() < 1e-2 and (e.argmax(1) == res.logits.argmax(1)).mean() >= 0.9
