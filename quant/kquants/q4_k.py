"""Q4_K: super-blocks of 256 values in 8 sub-blocks of 32, 144 bytes a block.

Block fields: `d`, `dmin` (fp16), `scales` (12 bytes: 6-bit sub-block scales and mins, layout in
quant/kquants/k_scale_min.py) and `qs` (128 bytes of 4-bit codes). The values of group g (0..3, 64
values) sit in qs[32 g : 32 g + 32]: sub-block 2g in the low nibbles, sub-block 2g + 1 in the
high nibbles. Value k of sub-block j is (d * sc_j) * code_k - dmin * m_j.

The quantizer is ggml's `quantize_row_q4_K_ref` (nmax 15; make_qkx2_quants with rmin -1,
rdelta 0.1, nstep 20), described and implemented in quant/kquants/k_scale_min.py; this module packs
its codes.
"""
from __future__ import annotations

import gguf
import numba
import numpy as np
from numba import prange

from exactedit.quant.kquants import k_scale_min as ksm
from exactedit.quant.formats.f16 import FP16_TO_FP32

NAME = "Q4_K"
QK_K, BLOCK_BYTES = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_K]
BLOCK = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (ksm.SCALE_BYTES,)),
                  ("qs", "u1", (QK_K // 2,))])
assert BLOCK.itemsize == BLOCK_BYTES and QK_K == ksm.QK_K
OFF_QS = BLOCK.fields["qs"][1]
SEARCH = ksm.Search(nmax=15, rmin=-1.0, rdelta=0.1, nstep=20)


# ---- numpy reference, over (n_blocks, ...) arrays ---------------------------------------------

def quantize_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, cols / 256 * 144]; numpy over (n_blocks, 256)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    d16, dmin16, scales, L = ksm.block_codes_ref(x.reshape(-1, QK_K), SEARCH)
    blocks = np.zeros(len(d16), dtype=BLOCK)
    blocks["d"], blocks["dmin"], blocks["scales"] = d16, dmin16, scales
    q = L.reshape(-1, 4, 2, 32)                      # [block, group, sub-block of the group, l]
    blocks["qs"] = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, QK_K // 2)
    return blocks.view(np.uint8).reshape(rows, cols // QK_K * BLOCK_BYTES)


def codes_ref(blocks: np.ndarray) -> np.ndarray:
    """The 256 codes (0..15) of each block, in value order: [nb, 256] int64."""
    qs = blocks["qs"].reshape(-1, 4, 1, 32).astype(np.int64)
    return np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(-1, QK_K)


def dequantize_ref(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 256 * 144] -> float32 [rows, cols]."""
    raw = np.ascontiguousarray(raw)
    b = raw.view(BLOCK).reshape(-1)
    y = ksm.dequantize_ref(b["d"], b["dmin"], b["scales"], codes_ref(b))
    return y.reshape(raw.shape[0], cols)


# ---- numba fast path -----------------------------------------------------------------------------

@numba.njit(error_model="numpy", cache=True)
def _quantize_row(x, out, nmax, rmin, rdelta, nstep):
    L = np.empty(QK_K, np.int64)
    laux = np.empty(ksm.SUB, np.int64)
    w = np.empty(ksm.SUB, np.float32)
    scales = np.empty(ksm.N_SUB, np.float32)
    mins = np.empty(ksm.N_SUB, np.float32)
    sc = np.empty(ksm.N_SUB, np.int64)
    m = np.empty(ksm.N_SUB, np.int64)
    for b in range(x.shape[0] // QK_K):
        dh, mh = ksm.block_codes(x[b * QK_K:(b + 1) * QK_K], nmax, rmin, rdelta, nstep,
                                 L, laux, w, scales, mins, sc, m)
        o = b * BLOCK_BYTES
        ksm.write_header(out, o, dh, mh, sc, m)
        for g in range(4):
            q = o + OFF_QS + 32 * g
            for l in range(32):
                out[q + l] = L[64 * g + l] | (L[64 * g + 32 + l] << 4)


@numba.njit(error_model="numpy", cache=True)
def _dequantize_row(raw, out, fp16):
    nb = out.shape[0] // QK_K
    blocks = raw.reshape(nb, BLOCK_BYTES)
    y = out.reshape(nb, QK_K)
    n = y.shape[1] // 8  # = 32; runtime bounds and one store stream per loop vectorize
    d1 = np.empty(ksm.N_SUB, np.float32)
    m1 = np.empty(ksm.N_SUB, np.float32)
    for b in range(nb):
        ksm.read_header(blocks, b, fp16, d1, m1)
        for g in range(4):
            q = OFF_QS + 32 * g
            da, ma, db, mb = d1[2 * g], m1[2 * g], d1[2 * g + 1], m1[2 * g + 1]
            for l in range(n):
                y[b, 64 * g + l] = da * np.float32(np.int32(blocks[b, q + l]) & 0xF) - ma
            for l in range(n):
                y[b, 64 * g + 32 + l] = db * np.float32(np.int32(blocks[b, q + l]) >> 4) - mb


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _quantize_rows(x, out, nmax, rmin, rdelta, nstep):
    for r in prange(x.shape[0]):
        _quantize_row(x[r], out[r], nmax, rmin, rdelta, nstep)


def quantize_into(x: np.ndarray, out: np.ndarray) -> None:
    """Fast path: float32 [rows, cols] -> uint8 [rows, row_bytes], rows in parallel."""
    _quantize_rows(x, out, *SEARCH.args())


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _dequantize_rows(raw, out, fp16):
    for r in prange(out.shape[0]):
        _dequantize_row(raw[r], out[r], fp16)


def dequantize_into(raw: np.ndarray, out: np.ndarray) -> None:
    """Fast path: uint8 [rows, row_bytes] -> float32 [rows, cols], rows in parallel."""
    _dequantize_rows(raw, out, FP16_TO_FP32)
