"""ggml-cpu's Q4_K x Q8_K product through the CPU_REPACK buffer (q4_K_8x8_q8_K, the AVX2 build of
llama-cpp-python 0.3.36), bit for bit: what llama.cpp multiplies a Q4_K weight tensor with when the
tensor has a multiple of 8 rows (the default load). From solvers/tail/forward/ffn_hidden.py's study:

  Q4_K        loaded into the CPU_REPACK buffer when the tensor has a multiple of 8 rows
              (repack.cpp `ggml_repack_get_optimal_repack_type`: AVX2 -> q4_K_8x8_q8_K), which
              llama.cpp does by default (llama_model_params.use_extra_bufts). The extra buffer's
              compute runs before ggml's tiled and vec_dot paths, so neither runs. Its
              `forward_mul_mat` splits a micro-batch of n activation rows into the first
              n - n % 4 rows (when n > 3), quantized four at a time by `ggml_quantize_mat_q8_K_4x8`
              and multiplied by `ggml_gemm_q4_K_8x8_q8_K`, and the last n % 4 rows (all of them
              when n < 4), quantized by `quantize_row_q8_K` and multiplied by
              `ggml_gemv_q4_K_8x8_q8_K` (arch/x86/repack.cpp, AVX2 bodies). Both quantizers give the
              same codes and scales as quant/formats/q8_k.py (a block whose 127 / amax overflows
              aside). Per (weight row, activation row), with sc[s], m[s] the 6-bit sub-block scales
              and mins, u the 4-bit codes, q the Q8_K codes, bs the 16-wide code sums:
                  i_g  = sc[2g] sum u q (sub-block 2g) + sc[2g+1] sum u q (sub-block 2g+1)   (int32)
                  n_g  = m[2g] (bs[4g] + bs[4g+1]) + m[2g+1] (bs[4g+2] + bs[4g+3])           (int32)
                  d    = f32(d_W[b] * d_x[b]);   dm = f32(dmin_W[b] * d_x[b])
                gemm (one FMA per 64-value group g of every block, in order):
                  acc = fma(f32(i_g), d, acc);   accm = fma(f32(n_g), dm, accm)
                gemv (one FMA per block, integers summed over the 4 groups first):
                  acc = fma(f32(sum_g i_g), d, acc);   accm = fma(f32(sum_g n_g), dm, accm)
                result = acc - accm
              (f32() of an int32 rounds to nearest even; a block's sum can exceed 2**24). The
              weight rows' grouping by 8 only places results in lanes, so any subset of units
              gives the same floats. tests/solvers/tail/test_ffn_hidden.py holds both kernels
              equal to ggml's own exported gemm / gemv on random rows; measured live on
              Qwen2.5-Coder-1.5B's blk.27 ffn_gate/up, all 8960 units bit for bit with micro-batches
              of 203 + 6, 131, 64, 63 (60 gemm + 3 gemv), 4 x 32 + 22, and 1 row.
              A Q4_K tensor that is not repacked (rows % 8 != 0, or a model loaded without extra
              buffer types) goes to ggml's tiled kernel, which is not modelled here (measured: it
              differs from vec_dot); `q4_k_repacked=False` gives the vec_dot path, which is what the
              engine runs only with the tiled path off too (GGML_CPU_TILED_MM=0, measured bitwise).

`q4_k_repack_matmul_ref` is the numpy reference, `q4_k_repack_matmul` the numba kernel (no
fastmath), equal bit for bit and both equal to ggml's exported gemm / gemv
(tests/solvers/tail/test_ffn_hidden.py); `repack_gemm_rows` says which rows of a micro-batch
layout take the gemm.
"""
from __future__ import annotations

from typing import Sequence

import numba
import numpy as np
from numba import prange

from exactedit.errors import QuantError
from exactedit.quant.dots.fma32 import fma32 as _fma32, fma32_ref
from exactedit.quant.dots.q4_k_dot import q4_k_blocks, scales_mins_ref, unpack_scales_mins
from exactedit.quant.formats import q8_k
from exactedit.quant.formats.f16 import FP16_TO_FP32
from exactedit.quant.kquants import q4_k

__all__ = ["GEMM_ROWS", "REPACK_ROWS", "q4_k_repack_matmul", "q4_k_repack_matmul_ref", "repack_gemm_rows"]

REPACK_ROWS = 8     # q4_K_8x8: weight rows interleaved 8 at a time; a tensor is repacked iff rows % 8 == 0
GEMM_ROWS = 4       # activation rows per gemm tile (block_q8_Kx4)
GROUP = 64          # values per gemm FMA step: two 32-wide sub-blocks
QK_K = q4_k.QK_K


def repack_gemm_rows(ubatch_sizes: Sequence[int], rows: int | None = None) -> np.ndarray:
    """bool [T]: True where the row's micro-batch sends it to the repacked gemm (the first
    n - n % 4 rows of a micro-batch of n > 3 rows), False where to the gemv."""
    sizes = [int(s) for s in ubatch_sizes]
    if not sizes or min(sizes) < 1:
        raise QuantError(f"ubatch_sizes: expected positive integers, got {list(ubatch_sizes)!r}")
    if rows is not None and sum(sizes) != rows:
        raise QuantError(f"ubatch_sizes: they cover {sum(sizes)} rows, the activations have {rows}")
    parts = []
    for n in sizes:
        g = n - n % GEMM_ROWS if n > GEMM_ROWS - 1 else 0
        parts += [np.ones(g, bool), np.zeros(n - g, bool)]
    return np.concatenate(parts)


# ---- Q4_K through the CPU_REPACK q4_K_8x8 kernels --------------------------------------------
def _activations(x: np.ndarray, cols: int) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] != cols or cols % QK_K:
        raise QuantError(f"Q4_K repack matmul: expected float32 activations [T, {cols}] (a multiple "
                         f"of {QK_K}), got {list(x.shape)}")
    if not np.isfinite(x).all():
        raise QuantError("Q4_K repack matmul: non-finite activations (the engine's result is not modelled)")
    return x


def _gemm_flags(gemm, T: int) -> np.ndarray:
    flags = np.asarray(gemm, bool).reshape(-1)
    if flags.shape[0] != T:
        raise QuantError(f"gemm: {flags.shape[0]} kernel flags for {T} activation rows")
    return flags


def q4_k_repack_matmul_ref(raw_rows: np.ndarray, x: np.ndarray, gemm) -> np.ndarray:
    """Reference: float32 [T, rows] = W (Q4_K, raw rows) @ x[t] as the repacked q4_K_8x8 kernels
    compute it; gemm (bool [T]) picks the gemm (per-group FMA) or gemv (per-block FMA) order."""
    x = _activations(x, np.shape(x)[-1])
    blk = q4_k_blocks(raw_rows, x.shape[1])
    flags = _gemm_flags(gemm, x.shape[0])
    rows, nb = blk.shape
    ng = QK_K // GROUP
    xq = q8_k.quantize_ref(x)
    sc, m = scales_mins_ref(blk["scales"])                                        # [r, nb, 8]
    u = q4_k.codes_ref(blk.reshape(-1)).reshape(rows, nb, QK_K)
    w = (u * np.repeat(sc, 32, axis=-1)).astype(np.float64).reshape(rows, nb, ng, GROUP)
    q = xq["qs"].astype(np.float64).reshape(-1, nb, ng, GROUP)
    ints = np.einsum("rbge,tbge->rtbg", w, q)                                      # exact (< 2**53)
    bs = xq["bsums"].astype(np.float64).reshape(-1, nb, ng, 2, 2).sum(-1)          # [T, nb, g, 2]
    mins = np.einsum("rbgk,tbgk->rtbg", m.astype(np.float64).reshape(rows, nb, ng, 2), bs)
    dx = xq["d"].astype(np.float32)[None]                                          # [1, T, nb]
    d = (blk["d"].astype(np.float32)[:, None, :] * dx).astype(np.float32)          # [r, T, nb]
    dm = (blk["dmin"].astype(np.float32)[:, None, :] * dx).astype(np.float32)
    steps = {"gemm": (ints, mins), "gemv": (ints.sum(-1, keepdims=True), mins.sum(-1, keepdims=True))}
    result = {}
    for kernel, (i_, n_) in steps.items():          # [r, T, nb, steps per block]
        acc = np.zeros(ints.shape[:2], np.float32)
        accm = np.zeros_like(acc)
        with np.errstate(over="ignore", invalid="ignore"):
            for b in range(nb):
                for g in range(i_.shape[-1]):
                    acc = fma32_ref(i_[:, :, b, g].astype(np.float32), d[:, :, b], acc)
                    accm = fma32_ref(n_[:, :, b, g].astype(np.float32), dm[:, :, b], accm)
        result[kernel] = acc - accm
    return np.ascontiguousarray(np.where(flags[None], result["gemm"], result["gemv"]).T)


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _q4_k_repack_kernel(wqs, wsc, wd, wdm, qs, bsums, dx, gemm, out):
    """wqs [rows, nb, 128] packed nibbles, wsc [rows, nb, 12] scale bytes, wd / wdm [rows, nb]
    float32; qs [T, nb, 256] int8 Q8_K codes, bsums [T, nb, 16], dx [T, nb]; gemm [T] bool.
    out [T, rows] float32."""
    rows, nb = wd.shape
    T = qs.shape[0]
    for r in prange(rows):
        sc = np.empty((nb, 8), np.int32)
        mn = np.empty((nb, 8), np.int32)
        w = np.empty((nb, QK_K), np.int32)
        for b in range(nb):
            unpack_scales_mins(wsc[r, b], sc[b], mn[b])
            for g in range(4):
                for l in range(32):
                    c = np.int32(wqs[r, b, 32 * g + l])
                    w[b, 64 * g + l] = (c & 0xF) * sc[b, 2 * g]
                    w[b, 64 * g + 32 + l] = (c >> 4) * sc[b, 2 * g + 1]
        for t in range(T):
            acc = np.float32(0)
            accm = np.float32(0)
            for b in range(nb):
                d = wd[r, b] * dx[t, b]
                dm = wdm[r, b] * dx[t, b]
                isum = np.int32(0)
                nsum = np.int32(0)
                for g in range(4):
                    s = np.int32(0)
                    for e in range(GROUP * g, GROUP * g + GROUP):
                        s += w[b, e] * np.int32(qs[t, b, e])
                    n = (mn[b, 2 * g] * (np.int32(bsums[t, b, 4 * g]) + np.int32(bsums[t, b, 4 * g + 1]))
                         + mn[b, 2 * g + 1] * (np.int32(bsums[t, b, 4 * g + 2])
                                               + np.int32(bsums[t, b, 4 * g + 3])))
                    if gemm[t]:
                        acc = _fma32(np.float32(s), d, acc)
                        accm = _fma32(np.float32(n), dm, accm)
                    else:
                        isum += s
                        nsum += n
                if not gemm[t]:
                    acc = _fma32(np.float32(isum), d, acc)
                    accm = _fma32(np.float32(nsum), dm, accm)
            out[t, r] = acc - accm


def q4_k_repack_matmul(raw_rows: np.ndarray, x: np.ndarray, gemm) -> np.ndarray:
    """Fast path of `q4_k_repack_matmul_ref` (numba, weight rows in parallel); identical floats."""
    x = _activations(x, np.shape(x)[-1])
    blk = q4_k_blocks(raw_rows, x.shape[1])
    flags = _gemm_flags(gemm, x.shape[0])
    xq = q8_k.quantize(x)
    out = np.empty((x.shape[0], blk.shape[0]), np.float32)
    _q4_k_repack_kernel(np.ascontiguousarray(blk["qs"]), np.ascontiguousarray(blk["scales"]),
                        FP16_TO_FP32[blk["d"].view(np.uint16)], FP16_TO_FP32[blk["dmin"].view(np.uint16)],
                        np.ascontiguousarray(xq["qs"]), np.ascontiguousarray(xq["bsums"]),
                        np.ascontiguousarray(xq["d"]), np.ascontiguousarray(flags), out)
    return out


# ---- the FFN hidden --------------------------------------------------------------------------
