"""Q6_K: super-blocks of 256 values in 16 sub-blocks of 16, 210 bytes a block.

Block fields: `ql` (128 bytes, low 4 bits of each 6-bit code), `qh` (64 bytes, high 2 bits),
`scales` (16 int8 sub-block scales), `d` (fp16 super-block scale). Value k of a block is
d * scales[k // 16] * (code_k - 32).

The quantizer is a port of ggml's `quantize_row_q6_K_ref`, done in float32 exactly as the C does
it (same operation order, sums in index order, no fused multiply-add):
  * each sub-block searches its scale (ggml's `make_qx_quants` with nmax 32, weights x*x): codes
    round(-32/max * x) (max = the first value of largest magnitude), then 18 trial inverse scales
    -(32 + 0.1*s)/max, s = -9..9 without 0, keeping a trial when sumlx^2 > best * suml2;
    a sub-block of magnitude < 1e-15 gets codes 0 and scale 0;
  * the super-block keeps the sub-block scale of largest magnitude; if that is < 1e-15 the block
    is all zero bytes. Else iscale = -128/max_scale, d = fp16(1/iscale), scales[j] =
    min(127, round(iscale * scale_j)) stored as int8;
  * final codes: round(x / (fp16(d) * scales[j])) clamped to [-32, 31], a true division; a
    sub-block whose product is 0 keeps the codes of its scale search.
Rounding is ggml's `nearest_int`: add 1.5 * 2**23 in float32 and read the low mantissa bits
(to nearest, ties to even, for |v| < 2**22; the same bit arithmetic beyond that).
"""
from __future__ import annotations

import gguf
import numba
import numpy as np
from numba import prange

from exactedit.quant.formats.f16 import FP16_TO_FP32, fp16_bits_to_fp32, fp32_to_fp16_bits
from exactedit.quant.formats.f32 import f32_bits

NAME = "Q6_K"
QK_K, BLOCK_BYTES = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q6_K]
SUB = 16
N_SUB = QK_K // SUB
BLOCK = np.dtype([("ql", "u1", (QK_K // 2,)), ("qh", "u1", (QK_K // 4,)),
                  ("scales", "i1", (N_SUB,)), ("d", "<f2")])
assert BLOCK.itemsize == BLOCK_BYTES
OFF_QL, OFF_QH, OFF_SC, OFF_D = (BLOCK.fields[f][1] for f in ("ql", "qh", "scales", "d"))

NMAX = 32                          # codes -32..31 during the search and the final pass
_EPS = np.float32(1e-15)           # ggml's GROUP_MAX_EPS
_MAGIC = np.float32(12582912.0)    # 1.5 * 2**23, for nearest_int
_TENTH = np.float32(0.1)
_STEPS = tuple(s for s in range(-9, 10) if s != 0)
N_TRIALS = 1 + len(_STEPS)                          # the first guess, then the 18 trials
_TRIAL_STEP = np.array((0,) + _STEPS, dtype=np.int64)  # entry 0 (the first guess) is unused


# ---- numpy reference, over (n_blocks, ...) arrays ---------------------------------------------

def _nearest_int_ref(v: np.ndarray) -> np.ndarray:
    return ((v + _MAGIC).view(np.int32).astype(np.int64) & 0x7FFFFF) - 0x400000


def _weighted_sums_ref(xs: np.ndarray, l: np.ndarray):
    """sum_i w x l and sum_i w l l with w = x*x, in index order, in float32."""
    w = xs * xs
    fl = l.astype(np.float32)
    sumlx = np.zeros(len(xs), np.float32)
    suml2 = np.zeros(len(xs), np.float32)
    for i in range(SUB):
        sumlx = sumlx + (w[:, i] * xs[:, i]) * fl[:, i]
        suml2 = suml2 + (w[:, i] * fl[:, i]) * fl[:, i]
    return sumlx, suml2


def _search_scales_ref(xs: np.ndarray):
    """make_qx_quants(16, 32, x, L, rmse_type=1) per row of xs [S, 16] -> (scale [S], L [S, 16])."""
    rows = np.arange(len(xs))
    first = np.argmax(np.abs(xs), axis=1)  # first index of the largest |x|, as C's strict '>'
    amax, mx = np.abs(xs)[rows, first], xs[rows, first]
    zero = amax < _EPS

    def codes(iscale):
        return np.clip(_nearest_int_ref(iscale[:, None] * xs), -NMAX, NMAX - 1)

    l = codes(np.float32(-NMAX) / mx)
    L = l + NMAX
    sumlx, suml2 = _weighted_sums_ref(xs, l)
    scale = np.where(suml2 != 0, sumlx / suml2, np.float32(0)).astype(np.float32)
    best = scale * sumlx
    for step in _STEPS:
        l = codes(-(np.float32(NMAX) + _TENTH * np.float32(step)) / mx)
        sumlx, suml2 = _weighted_sums_ref(xs, l)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = np.where(better[:, None], l + NMAX, L)
        scale = np.where(better, sumlx / suml2, scale)
        best = np.where(better, scale * sumlx, best)
    L[zero] = 0
    scale[zero] = 0
    return scale, L


def _pack_ref(L: np.ndarray, blocks: np.ndarray) -> None:
    """Codes L [nb, 256] (0..63) -> the ql / qh fields of `blocks`."""
    q = L.reshape(-1, 2, 4, 32)
    lo, hi = q & 0xF, q >> 4
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    blocks["ql"] = ql.reshape(-1, QK_K // 2)
    blocks["qh"] = qh.reshape(-1, QK_K // 4)


def quantize_ref(x: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, cols / 256 * 210]; numpy over (n_blocks, 256)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    xb = x.reshape(-1, QK_K)
    nb = len(xb)
    blocks = np.zeros(nb, dtype=BLOCK)
    with np.errstate(all="ignore"):
        scales, L = _search_scales_ref(xb.reshape(-1, SUB))
        scales, L = scales.reshape(nb, N_SUB), L.reshape(nb, N_SUB, SUB)
        mags = np.abs(scales)
        first = np.argmax(np.where(np.isnan(mags), -1, mags), axis=1)  # NaN never wins in C
        max_abs, max_scale = mags[np.arange(nb), first], scales[np.arange(nb), first]
        live = max_abs >= _EPS
        iscale = np.float32(-128) / max_scale
        d16 = (np.float32(1) / iscale).astype(np.float16)
        sc = np.minimum(127, _nearest_int_ref(iscale[:, None] * scales))
        sc8 = ((sc & 0xFF) ^ 0x80) - 0x80
        dj = d16.astype(np.float32)[:, None] * sc8.astype(np.float32)
        final = np.clip(_nearest_int_ref(xb.reshape(nb, N_SUB, SUB) / dj[:, :, None]),
                        -NMAX, NMAX - 1) + NMAX
        L = np.where((dj != 0)[:, :, None], final, L).reshape(nb, QK_K)
    _pack_ref(L, blocks)
    blocks["scales"] = sc8
    blocks["d"] = d16
    blocks[~live] = np.zeros(1, dtype=BLOCK)
    return blocks.view(np.uint8).reshape(rows, cols // QK_K * BLOCK_BYTES)


def dequantize_ref(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, cols / 256 * 210] -> float32 [rows, cols]."""
    raw = np.ascontiguousarray(raw)
    b = raw.view(BLOCK).reshape(-1)
    ql = b["ql"].reshape(-1, 2, 2, 32).astype(np.int32)   # [block, half, ql half, l]
    qh = b["qh"].reshape(-1, 2, 32).astype(np.int32)
    lo = np.stack([ql[:, :, 0] & 0xF, ql[:, :, 1] & 0xF, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], 2)
    hi = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], 2)
    q = ((lo | (hi << 4)) - 32).reshape(-1, QK_K).astype(np.float32)
    with np.errstate(invalid="ignore"):  # an inf scale times a 0 is NaN, as in C
        ds = b["d"].astype(np.float32)[:, None] * b["scales"].astype(np.float32)
        return (np.repeat(ds, SUB, axis=1) * q).reshape(raw.shape[0], cols)


# ---- numba fast path -----------------------------------------------------------------------------

@numba.njit(error_model="numpy", cache=True)
def _nearest_int(v):
    return (np.int64(f32_bits(v + _MAGIC)) & 0x7FFFFF) - 0x400000


@numba.njit(error_model="numpy", cache=True)
def _clamped_code(v):
    return min(max(_nearest_int(v), -NMAX), NMAX - 1)


@numba.njit(error_model="numpy", cache=True)
def _search_scale(x, base, L, t):
    """make_qx_quants for x[base:base+16]; writes codes into L[base:base+16], returns the scale.

    The first guess -32/max and the 18 trials are independent until the selection, so their sums
    are computed side by side (trial = inner loop, which vectorizes), each still in index order
    and with C's operation order; the selection then walks the trials in C's order. `t` is the
    scratch: iscale, sumlx, suml2 per trial (rows 0..2) and w, w*x per value (rows 3..4)."""
    amax = np.float32(0)
    mx = np.float32(0)
    for i in range(SUB):
        ax = abs(x[base + i])
        if ax > amax:
            amax = ax
            mx = x[base + i]
    if amax < _EPS:
        for i in range(SUB):
            L[base + i] = 0
        return np.float32(0)
    iscale, sumlx, suml2, w, wx = t[0], t[1], t[2], t[3], t[4]
    iscale[0] = np.float32(-NMAX) / mx
    for k in range(1, N_TRIALS):
        iscale[k] = -(np.float32(NMAX) + _TENTH * np.float32(_TRIAL_STEP[k])) / mx
    for k in range(N_TRIALS):
        sumlx[k] = 0
        suml2[k] = 0
    for i in range(SUB):
        xi = x[base + i]
        w[i] = xi * xi
        wx[i] = w[i] * xi
    for i in range(SUB):
        xi, wi, wxi = x[base + i], w[i], wx[i]
        for k in range(iscale.shape[0]):  # = N_TRIALS; a runtime bound lets LLVM vectorize it
            fl = np.float32(_clamped_code(iscale[k] * xi))
            sumlx[k] += wxi * fl
            suml2[k] += wi * fl * fl
    chosen = 0
    scale = sumlx[0] / suml2[0] if suml2[0] != 0 else np.float32(0)
    best = scale * sumlx[0]
    for k in range(1, N_TRIALS):
        if suml2[k] > 0 and sumlx[k] * sumlx[k] > best * suml2[k]:
            chosen = k
            scale = sumlx[k] / suml2[k]
            best = scale * sumlx[k]
    for i in range(SUB):
        L[base + i] = _clamped_code(iscale[chosen] * x[base + i]) + NMAX
    return scale


@numba.njit(error_model="numpy", cache=True)
def _quantize_block(x, out, o, L, scales, t):
    """One super-block: x float32 [256] -> out[o:o+210]; L, scales, t are scratch."""
    max_scale = np.float32(0)
    max_abs = np.float32(0)
    for ib in range(N_SUB):
        s = _search_scale(x, SUB * ib, L, t)
        scales[ib] = s
        if abs(s) > max_abs:
            max_abs = abs(s)
            max_scale = s
    if max_abs < _EPS:
        for k in range(BLOCK_BYTES):
            out[o + k] = 0
        return
    iscale = np.float32(-128) / max_scale
    h = fp32_to_fp16_bits(np.float32(1) / iscale)
    out[o + OFF_D] = h & 0xFF
    out[o + OFF_D + 1] = h >> 8
    d = fp16_bits_to_fp32(h)
    for j in range(N_SUB):
        sc = min(127, _nearest_int(iscale * scales[j])) & 0xFF
        out[o + OFF_SC + j] = sc
        dj = d * np.float32((sc ^ 0x80) - 0x80)
        if dj == 0:
            continue  # keeps the codes of the scale search
        for i in range(SUB):
            L[SUB * j + i] = _clamped_code(x[SUB * j + i] / dj) + NMAX
    for half in range(2):
        c = 128 * half
        ql = o + OFF_QL + 64 * half
        qh = o + OFF_QH + 32 * half
        for l in range(32):
            q1, q2, q3, q4 = L[c + l], L[c + l + 32], L[c + l + 64], L[c + l + 96]
            out[ql + l] = (q1 & 0xF) | ((q3 & 0xF) << 4)
            out[ql + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4)
            out[qh + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)


@numba.njit(error_model="numpy", cache=True)
def _quantize_row(x, out):
    L = np.empty(QK_K, np.int64)
    scales = np.empty(N_SUB, np.float32)
    t = np.empty((5, N_TRIALS), np.float32)
    for b in range(x.shape[0] // QK_K):
        _quantize_block(x[b * QK_K:(b + 1) * QK_K], out, b * BLOCK_BYTES, L, scales, t)


@numba.njit(error_model="numpy", cache=True)
def _dequantize_row(raw, out, fp16):
    ds = np.empty(N_SUB, np.float32)
    for b in range(out.shape[0] // QK_K):
        o = b * BLOCK_BYTES
        d = fp16[np.int64(raw[o + OFF_D]) | (np.int64(raw[o + OFF_D + 1]) << 8)]
        for j in range(N_SUB):
            ds[j] = d * np.float32((np.int32(raw[o + OFF_SC + j]) ^ 0x80) - 0x80)
        for half in range(2):
            y = b * QK_K + 128 * half
            ql = o + OFF_QL + 64 * half
            qh = o + OFF_QH + 32 * half
            s = 8 * half
            for l in range(32):
                a, c, h = np.int32(raw[ql + l]), np.int32(raw[ql + l + 32]), np.int32(raw[qh + l])
                t = s + l // 16
                out[y + l] = ds[t] * np.float32(((a & 0xF) | ((h & 3) << 4)) - 32)
                out[y + l + 32] = ds[t + 2] * np.float32(((c & 0xF) | (((h >> 2) & 3) << 4)) - 32)
                out[y + l + 64] = ds[t + 4] * np.float32(((a >> 4) | (((h >> 4) & 3) << 4)) - 32)
                out[y + l + 96] = ds[t + 6] * np.float32(((c >> 4) | (((h >> 6) & 3) << 4)) - 32)


@numba.njit(parallel=True, error_model="numpy", cache=True)
def quantize_into(x, out):
    """Fast path: float32 [rows, cols] -> uint8 [rows, row_bytes], rows in parallel."""
    for r in prange(x.shape[0]):
        _quantize_row(x[r], out[r])


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _dequantize_rows(raw, out, fp16):
    for r in prange(out.shape[0]):
        _dequantize_row(raw[r], out[r], fp16)


def dequantize_into(raw: np.ndarray, out: np.ndarray) -> None:
    """Fast path: uint8 [rows, row_bytes] -> float32 [rows, cols], rows in parallel."""
    _dequantize_rows(raw, out, FP16_TO_FP32)
