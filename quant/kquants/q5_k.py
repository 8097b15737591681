"""Q5_K: super-blocks of 256 values in 8 sub-blocks of 32, 176 bytes a block.

Block fields: `d`, `dmin` (fp16), `scales` (12 bytes: 6-bit sub-block scales and mins, layout in
quant/kquants/k_scale_min.py), `qh` (32 bytes of fifth bits) and `qs` (128 bytes of low nibbles). Group
g (0..3, 64 values) has its low nibbles in qs[32 g : 32 g + 32] (sub-block 2g low, 2g + 1 high)
and its fifth bits in bit 2g (sub-block 2g) and bit 2g + 1 (sub-block 2g + 1) of qh[l].
Value k of sub-block j is (d * sc_j) * code_k - dmin * m_j, code 0..31.

The quantizer is ggml's `quantize_row_q5_K_ref` (nmax 31; make_qkx2_quants with rmin -0.5,
rdelta 0.1, nstep 15), described and implemented in quant/kquants/k_scale_min.py; this module packs
its codes.
"""
from __future__ import annotations

import gguf
import numba
import numpy as np
from numba import prange

from exactedit.quant.kquants import k_scale_min as ksm
from exactedit.quant.formats.f16 import FP16_TO_FP32

NAME = "Q5_K"
QK_K, BLOCK_BYTES = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q5_K]
BLOCK = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (ksm.SCALE_BYTES,)),
                  ("qh", "u1", (QK_K // 8,)), ("qs", "u1", (QK_K // 2,))])
assert BLOCK.itemsize == BLOCK_BYTES and QK_K == ksm.QK_K
OFF_QH, OFF_QS = BLOCK.fields["qh"][1], BLOCK.fields["qs"][1]
SEARCH = ksm.Search(nmax=31, rmin=-0.5, rdelta=0.1, nstep=15)


# ---- numpy reference, over (n_blocks, ...) arrays ---------------------------------------------

def quantize_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, cols / 256 * 176]; numpy over (n_blocks, 256)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    d16, dmin16, scales, L = ksm.block_codes_ref(x.reshape(-1, QK_K), SEARCH)
    blocks = np.zeros(len(d16), dtype=BLOCK)
    blocks["d"], blocks["dmin"], blocks["scales"] = d16, dmin16, scales
    q = L.reshape(-1, 4, 2, 32)                      # [block, group, sub-block of the group, l]
    blocks["qs"] = ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(-1, QK_K // 2)
    bit = np.arange(8).reshape(4, 2, 1)              # qh bit of (group, sub-block of the group)
    blocks["qh"] = ((q >> 4) << bit).sum(axis=(1, 2))
    return blocks.view(np.uint8).reshape(rows, cols // QK_K * BLOCK_BYTES)


def codes_ref(blocks: np.ndarray) -> np.ndarray:
    """The 256 codes (0..31) of each block, in value order: [nb, 256] int64."""
    qs = blocks["qs"].reshape(-1, 4, 1, 32).astype(np.int64)
    qh = blocks["qh"].reshape(-1, 1, 1, 32).astype(np.int64)
    bit = np.arange(8).reshape(1, 4, 2, 1)
    low = np.concatenate([qs & 0xF, qs >> 4], axis=2)
    return (low | (((qh >> bit) & 1) << 4)).reshape(-1, QK_K)


def dequantize_ref(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 256 * 176] -> float32 [rows, cols]."""
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
        for l in range(32):
            out[o + OFF_QH + l] = 0
        for g in range(4):
            q = o + OFF_QS + 32 * g
            for l in range(32):
                a, c = L[64 * g + l], L[64 * g + 32 + l]
                out[q + l] = (a & 0xF) | ((c & 0xF) << 4)
                out[o + OFF_QH + l] |= ((a >> 4) << (2 * g)) | ((c >> 4) << (2 * g + 1))


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
                c = (np.int32(blocks[b, q + l]) & 0xF) | \
                    (((np.int32(blocks[b, OFF_QH + l]) >> (2 * g)) & 1) << 4)
                y[b, 64 * g + l] = da * np.float32(c) - ma
            for l in range(n):
                c = (np.int32(blocks[b, q + l]) >> 4) | \
                    (((np.int32(blocks[b, OFF_QH + l]) >> (2 * g + 1)) & 1) << 4)
                y[b, 64 * g + 32 + l] = db * np.float32(c) - mb


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
