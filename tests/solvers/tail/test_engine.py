"""The tail's engine-faithful path: kernel choice per micro-batch, float32 norms (the live tests in
tests/native compare it with llama.cpp itself)."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.errors import QuantError
from exactedit.solvers.tail import engine_math as en


def test_kernel_choice_follows_micro_batches():
    m = en.MatchEngine("llamacpp", (12, 3, 8, 7))
    assert m.tiled_rows().tolist() == [True] * 12 + [False] * 3 + [True] * 8 + [False] * 7
    assert en.MatchEngine.from_meta("llamacpp", {"ubatch_sizes": [4, 4]}, 8).ubatch_sizes == (4, 4)
    with pytest.raises(QuantError):
        en.MatchEngine.from_meta("llamacpp", {"ubatch_sizes": [4]}, 8)
    with pytest.raises(QuantError):
        en.MatchEngine("vllm", (4,))
    with pytest.raises(QuantError):
        en.engine_matmul(np.zeros((1, 144), np.uint8), "Q4_K", 256, np.zeros((1, 256), np.float32), m)


def test_rms_norm_sums_in_index_order():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 1536)) * 50).astype(np.float32)
    w = rng.uniform(0.5, 2, 1536).astype(np.float32)
    y = en.rms_norm(x, w, 1e-6)
    total = np.zeros(4)
    for i in range(1536):      # ggml: sum += (double)(x*x), one element after another
        total += (x[:, i] * x[:, i]).astype(np.float64)
    scale = np.float32(1) / np.sqrt((total / 1536).astype(np.float32) + np.float32(1e-6))
    assert np.array_equal(y, (x * scale[:, None]) * w)
