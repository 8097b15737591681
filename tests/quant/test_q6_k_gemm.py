"""The tiled Q6_K x Q8_K product through float32 sgemm (quant/dots/q6_k_gemm.py) against the numpy
reference of ggml-cpu's tiled kernel (quant/q6_k_dot.q6_k_matmul_ref), bit for bit (tolerance 0),
with the sgemm entries proven exact by their bound and the rest recomputed as integer dots."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit import quant
from exactedit.bench.head import synthetic_q6k
from exactedit.quant.kquants import q6_k
from exactedit.quant.formats import q8_k
from exactedit.quant.dots.q6_k_dot import q6_k_blocks, q6_k_matmul, q6_k_matmul_ref
from exactedit.quant.dots.q6_k_gemm import EXACT_LIMIT, PART, ROW_CHUNK, tiled_matmul


def _bounds(raw: np.ndarray, cols: int, x: np.ndarray) -> np.ndarray:
    """wnorm * qnorm per (row, activation, part of a block), float64, as the fold compares them."""
    blocks = raw.reshape(raw.shape[0], -1, q6_k.BLOCK_BYTES).copy()
    blocks.view(q6_k.BLOCK)["d"] = 1                      # d = 1: the values are sc * (u - 32)
    w = quant.dequantize(blocks.reshape(raw.shape), "Q6_K", cols).astype(np.float64)
    w = w.reshape(raw.shape[0], -1, PART)                 # [rows, parts, PART]
    xq = q8_k.quantize(x)
    wn = np.sqrt((w ** 2).sum(axis=2))
    qn = np.sqrt((xq["qs"].astype(np.float64).reshape(x.shape[0], -1, PART) ** 2).sum(axis=2))
    return wn[:, None, :] * qn[None, :, :]


def _acts(T: int, cols: int, seed: int, spread: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, cols)).astype(np.float32)
    if spread:                                            # uniform rows: the largest code norms
        x[::2] = rng.uniform(-1, 1, (len(x[::2]), cols))
    else:
        x[:, ::7] *= 40                                   # a few large values per block: small norms
    return x


CASES = [  # (name, weights, spread activations, rows, cols, T, entries past the bound)
    ("quantized-weights", "gauss", False, 40, 512, 9, "none"),
    ("random-blocks", "random", True, 70, 768, 12, "some"),
    ("all-at-the-bound", "extreme", True, 9, 256, 8, "all"),
]


def _weights(kind: str, rows: int, cols: int) -> np.ndarray:
    if kind == "gauss":
        w = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32) * 0.05
        return quant.quantize(w, "Q6_K")
    raw = synthetic_q6k(rows, cols, 3)
    b = raw.reshape(rows, -1, q6_k.BLOCK_BYTES).view(q6_k.BLOCK)
    if kind == "random":        # random codes under the largest scales
        b["scales"] = np.where(b["scales"] < 0, -128, 127)
    if kind == "extreme":       # every w = -128 * (0 - 32) = 4096: the largest possible sums
        b["ql"], b["qh"], b["scales"] = 0, 0, -128
    return raw


@pytest.mark.parametrize("name,wk,spread,rows,cols,T,past", CASES, ids=[c[0] for c in CASES])
def test_tiled_sgemm_equals_the_reference(name, wk, spread, rows, cols, T, past):
    raw = _weights(wk, rows, cols)
    x = _acts(T, cols, 2, spread)
    if wk == "extreme":
        x = np.abs(x) + 1                                 # one-signed: sums of 128 * 4096 * ~127
    over = ~(_bounds(raw, cols, x) < EXACT_LIMIT)
    assert {"none": not over.any(), "some": 0 < over.mean() < 1, "all": over.all()}[past], over.mean()
    ref = q6_k_matmul_ref(raw, cols, x, np.ones(T, bool))
    got = tiled_matmul(q6_k_blocks(raw, cols), q8_k.quantize(x))
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    assert np.array_equal(q6_k_matmul(raw, cols, x, np.ones(T, bool)).view(np.uint32), ref.view(np.uint32))


def test_more_rows_than_one_chunk():
    rows = ROW_CHUNK + 5
    raw = _weights("gauss", rows, 256)
    x = _acts(8, 256, 4, True)
    ref = q6_k_matmul_ref(raw, 256, x, np.ones(8, bool))
    got = tiled_matmul(q6_k_blocks(raw, 256), q8_k.quantize(x))
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
