"""The engine's runtime view: BF16 tensors are used as their Q8_0 copy; other types as stored."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit import quant
from exactedit.errors import QuantError
from tests import oracles


@pytest.fixture(scope="module")
def ggml():
    return oracles.load()


def _bf16_values(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    w = (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.05).astype(np.float32)
    return quant.dequantize(quant.quantize(w, "BF16"), "BF16", cols)


def test_runtime_q8_0_is_ggmls_q8_0_round_trip(ggml):
    x = _bf16_values(8, 1280)
    want = ggml.dequantize(ggml.quantize(x, "Q8_0"), "Q8_0", 1280)
    oracles.assert_bits_equal(quant.runtime_q8_0(x), want, "runtime_q8_0")
    assert not np.array_equal(quant.runtime_q8_0(x), x)  # the Q8_0 copy really differs


def test_runtime_view_of_bf16_is_its_q8_0_copy(ggml):
    x = _bf16_values(4, 640, seed=1)
    raw = ggml.quantize(x, "BF16")
    want = ggml.dequantize(ggml.quantize(ggml.dequantize(raw, "BF16", 640), "Q8_0"), "Q8_0", 640)
    oracles.assert_bits_equal(quant.runtime_view(raw, "BF16", 640), want, "runtime_view BF16")


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q6_K"])
def test_runtime_view_of_other_types_is_dequantized(ggml, qtype):
    w = (np.random.default_rng(2).standard_normal((3, 512)) * 0.02).astype(np.float32)
    raw = quant.quantize(w, qtype)
    oracles.assert_bits_equal(quant.runtime_view(raw, qtype, 512), ggml.dequantize(raw, qtype, 512))


def test_runtime_q8_0_refuses_values_that_are_not_bf16():
    x = _bf16_values(2, 64)
    x[1, 7] = np.float32(0.1)  # 0.1 is not a bf16 value
    with pytest.raises(QuantError, match=r"x\[1, 7\].*bf16"):
        quant.runtime_q8_0(x)
