"""Logit statistics and the pass tolerance of a live check."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.native.llamacpp.engine import EngineError, EngineSettings
from exactedit.native.verify.live import Tolerance, logit_stats


def test_identical_logits_are_bitwise_and_pass():
    a = np.random.default_rng(0).standard_normal((5, 50)).astype(np.float32) * 10
    s = logit_stats(a, a.copy())
    assert s.bitwise and s.kl_max == 0 and s.top1 == 1 and not Tolerance().failures(s)


def test_kl_matches_definition_and_a_small_edit_fails():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 30)) * 5
    b = a.copy()
    b[:, 3] += 0.01                                   # one row of a head, moved by 0.01
    s = logit_stats(a, b)
    p, q = np.exp(a - np.logaddexp.reduce(a, 1, keepdims=True)), np.exp(b - np.logaddexp.reduce(b, 1, keepdims=True))
    kl = (p * np.log(p / q)).sum(1)
    assert s.kl_max == pytest.approx(kl.max(), rel=1e-9) and s.max_abs == pytest.approx(0.01)
    assert not s.bitwise and Tolerance().failures(s)  # 0.01 > 1e-4 * max|logit|


def test_rounding_noise_passes():
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((6, 1000)) * 8).astype(np.float32)
    b = a + np.spacing(a) * rng.integers(-4, 5, a.shape)   # a different float summation order
    assert not Tolerance().failures(logit_stats(a, b))


def test_validation():
    with pytest.raises(EngineError):
        Tolerance(top1=1.5)
    with pytest.raises(EngineError):
        EngineSettings(n_batch=4, n_ubatch=8)
    with pytest.raises(EngineError):
        EngineSettings(flash_attn="auto")
    s = EngineSettings(n_batch=64, n_ubatch=16)
    assert EngineSettings.from_meta(s.as_meta()) == s
    with pytest.raises(EngineError):
        EngineSettings.from_meta({"n_batch": 4, "seed": 1})
    with pytest.raises(EngineError):
        logit_stats(np.zeros((2, 3)), np.zeros((2, 4)))
