"""The scale-and-min K-quant super-block (Q4_K, Q5_K): ggml's reference codes, before packing.

A super-block of 256 values has 8 sub-blocks of 32. Value k of sub-block j is
    fp16(d) * sc_j * code_k - fp16(dmin) * m_j        (sc_j, m_j 6-bit, code 0..nmax)
stored as fp16 `d`, fp16 `dmin`, the 12-byte `scales` field (below) and the packed codes (the
format modules: quant/kquants/q4_k.py, quant/kquants/q5_k.py). ggml's reference quantizers
(`quantize_row_q4_K_ref`, `quantize_row_q5_K_ref`), all in float32 with C's operation order and
no fused multiply-add:
  * weights per sub-block: w_i = sqrt(sum_i x_i^2 / 32) + |x_i| (the sum in index order);
  * `make_qkx2_quants` per sub-block (`search_ref` below): min = min(0, smallest x), codes
    round((x - min) * nmax / (max - min)) clamped to 0..nmax, scored by sum w (s*l + min - x)^2;
    then nstep + 1 trials of inverse scale (rmin + rdelta*is + nmax) / (max - min), each a
    weighted least-squares fit of (scale, min) to its codes (min forced <= 0), kept when its
    error is strictly smaller. A trial reads the `min` of the last trial kept, so the trials
    run in order. A sub-block with max == min gets codes 0, scale 0;
  * the 6-bit sub-scales: sc_j = MIN(63, (uint8_t) nearest_int(63 / max_scale * scale_j)), the
    same for the mins; d = fp16(max_scale / 63), dmin = fp16(max_min / 63) (max over the
    sub-blocks, from 0);
  * final codes: nearest_int((x + fp16(dmin) * m_j) / (fp16(d) * sc_j)) clamped to 0..nmax, a
    true division; a sub-block whose fp16(d) * sc_j is 0 keeps the codes of its search.
Q4_K uses nmax 15, trials rmin -1, rdelta 0.1, nstep 20; Q5_K nmax 31, -0.5, 0.1, 15.

The `scales` field: bytes 0..3 hold sc_0..3 (low 6 bits) and the top 2 bits of sc_4..7; bytes
4..7 hold m_0..3 and the top 2 bits of m_4..7; bytes 8..11 hold the low nibbles of sc_4..7 (low)
and m_4..7 (high) -- ggml's `get_scale_min_k4`.
"""
from __future__ import annotations

import numba
import numpy as np

from exactedit.quant.formats.c_int import nearest_int, nearest_int_ref
from exactedit.quant.formats.f16 import fp16_bits_to_fp32, fp32_to_fp16_bits

QK_K = 256
SUB = 32
N_SUB = QK_K // SUB
SCALE_BYTES = 12
_F0 = np.float32(0)
_SIXTY_THREE = np.float32(63)


class Search:
    """One format's make_qkx2_quants parameters."""

    def __init__(self, nmax: int, rmin: float, rdelta: float, nstep: int):
        self.nmax, self.nstep = nmax, nstep
        self.rmin, self.rdelta = np.float32(rmin), np.float32(rdelta)

    def args(self):
        return self.nmax, self.rmin, self.rdelta, self.nstep


# ---- numpy reference, over (n_sub_blocks, 32) and (n_blocks, 256) arrays ----------------------

def weights_ref(xs: np.ndarray) -> np.ndarray:
    """w = sqrt(sum x^2 / 32) + |x| per row of xs [S, 32], the sum in index order."""
    s = np.zeros(len(xs), np.float32)
    for i in range(SUB):
        s = s + xs[:, i] * xs[:, i]
    return np.sqrt(s / np.float32(SUB))[:, None] + np.abs(xs)


def _codes_ref(iscale, xs, mn, nmax):
    return np.clip(nearest_int_ref(iscale[:, None] * (xs - mn[:, None])), 0, nmax)


def _error_ref(scale, L, mn, xs, w):
    err = np.zeros(len(xs), np.float32)
    for i in range(xs.shape[1]):
        diff = scale * L[:, i].astype(np.float32) + mn - xs[:, i]
        err = err + w[:, i] * (diff * diff)
    return err


def search_ref(xs: np.ndarray, w: np.ndarray, search: Search):
    """make_qkx2_quants per row of xs [S, n] -> (scale [S], the_min [S], codes [S, n])."""
    nmax, rmin, rdelta, nstep = search.args()
    mn, mx, sum_w = xs[:, 0].copy(), xs[:, 0].copy(), w[:, 0].copy()
    sum_x = sum_w * xs[:, 0]
    for i in range(1, xs.shape[1]):
        mn = np.where(xs[:, i] < mn, xs[:, i], mn)
        mx = np.where(xs[:, i] > mx, xs[:, i], mx)
        sum_w = sum_w + w[:, i]
        sum_x = sum_x + w[:, i] * xs[:, i]
    mn = np.where(mn > 0, _F0, mn)
    flat = mx == mn
    fn = np.float32(nmax)
    iscale = fn / (mx - mn)
    scale = np.float32(1) / iscale
    L = _codes_ref(iscale, xs, mn, nmax)
    best = _error_ref(scale, L, mn, xs, w)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * np.float32(step) + fn) / (mx - mn)
        laux = _codes_ref(iscale, xs, mn, nmax)
        fl = laux.astype(np.float32)
        sl = np.zeros(len(xs), np.float32)
        sl2, sxl = sl.copy(), sl.copy()
        for i in range(xs.shape[1]):
            wl = w[:, i] * fl[:, i]
            sl, sl2, sxl = sl + wl, sl2 + wl * fl[:, i], sxl + wl * xs[:, i]
        D = sum_w * sl2 - sl * sl
        this_scale = (sum_w * sxl - sum_x * sl) / D
        this_min = (sl2 * sum_x - sl * sxl) / D
        pos = this_min > 0
        this_min = np.where(pos, _F0, this_min)
        this_scale = np.where(pos, sxl / sl2, this_scale)
        cur = _error_ref(this_scale, laux, this_min, xs, w)
        take = (D > 0) & (cur < best) & ~flat
        L = np.where(take[:, None], laux, L)
        best = np.where(take, cur, best)
        scale = np.where(take, this_scale, scale)
        mn = np.where(take, this_min, mn)
    L[flat] = 0
    scale = np.where(flat, _F0, scale)
    return scale, -mn, L


def _six_bit_ref(values, vmax):
    inv = np.where(vmax > 0, _SIXTY_THREE / np.where(vmax > 0, vmax, 1), _F0).astype(np.float32)
    return np.minimum(63, nearest_int_ref(inv[:, None] * values) & 0xFF)


def pack_scales_ref(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """6-bit sc, m [nb, 8] -> the 12-byte scales field [nb, 12]."""
    out = np.zeros((len(sc), SCALE_BYTES), np.int64)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return out.astype(np.uint8)


def unpack_scales_ref(q: np.ndarray):
    """The 12-byte scales field [nb, 12] -> 6-bit sc, m [nb, 8] (get_scale_min_k4)."""
    q = q.astype(np.int64)
    sc = np.concatenate([q[:, 0:4] & 63, (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)], axis=1)
    return sc, m


def block_codes_ref(xb: np.ndarray, search: Search):
    """float32 [nb, 256] -> (d fp16 [nb], dmin fp16 [nb], scales uint8 [nb, 12], codes [nb, 256])."""
    nb = len(xb)
    xs = xb.reshape(nb * N_SUB, SUB)
    with np.errstate(all="ignore"):
        scales, mins, L = search_ref(xs, weights_ref(xs), search)
        scales, mins = scales.reshape(nb, N_SUB), mins.reshape(nb, N_SUB)
        max_scale = np.zeros(nb, np.float32)
        max_min = np.zeros(nb, np.float32)
        for j in range(N_SUB):
            max_scale = np.where(scales[:, j] > max_scale, scales[:, j], max_scale)
            max_min = np.where(mins[:, j] > max_min, mins[:, j], max_min)
        sc, m = _six_bit_ref(scales, max_scale), _six_bit_ref(mins, max_min)
        d16 = (max_scale / _SIXTY_THREE).astype(np.float16)
        dmin16 = (max_min / _SIXTY_THREE).astype(np.float16)
        dj = d16.astype(np.float32)[:, None] * sc.astype(np.float32)
        mj = dmin16.astype(np.float32)[:, None] * m.astype(np.float32)
        xj = xb.reshape(nb, N_SUB, SUB)
        final = np.clip(nearest_int_ref((xj + mj[:, :, None]) / dj[:, :, None]), 0, search.nmax)
    L = np.where((dj != 0)[:, :, None], final, L.reshape(nb, N_SUB, SUB)).reshape(nb, QK_K)
    return d16, dmin16, pack_scales_ref(sc, m), L


def dequantize_ref(d16, dmin16, scales12, codes) -> np.ndarray:
    """(fp16 d [nb], fp16 dmin [nb], scales [nb, 12], codes [nb, 256]) -> float32 [nb, 256]:
    (d * sc_j) * code - (dmin * m_j), as ggml's dequantize_row_q4_K / _q5_K."""
    sc, m = unpack_scales_ref(scales12)
    q = codes.reshape(len(codes), N_SUB, SUB).astype(np.float32)
    with np.errstate(invalid="ignore"):  # inf * 0 and inf - inf are NaN, as in C
        d1 = d16.astype(np.float32)[:, None] * sc.astype(np.float32)
        m1 = dmin16.astype(np.float32)[:, None] * m.astype(np.float32)
        return (d1[:, :, None] * q - m1[:, :, None]).reshape(len(codes), QK_K)


# ---- numba fast path -----------------------------------------------------------------------------

@numba.njit(error_model="numpy", cache=True)
def _clamped(v, nmax):
    return min(max(nearest_int(v), 0), nmax)


@numba.njit(error_model="numpy", cache=True)
def search(x, w, nmax, rmin, rdelta, nstep, L, laux):
    """make_qkx2_quants on x [n] with weights w [n]: writes codes into L, returns (scale, the_min).
    A transcription of the C loop by loop (laux: scratch [n])."""
    n = x.shape[0]
    mn = x[0]
    mx = x[0]
    sum_w = w[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        sum_w += w[i]
        sum_x += w[i] * x[i]
    if mn > 0:
        mn = _F0
    if mx == mn:
        for i in range(n):
            L[i] = 0
        return _F0, -mn
    fn = np.float32(nmax)
    iscale = fn / (mx - mn)
    scale = np.float32(1) / iscale
    best = _F0
    for i in range(n):
        l = _clamped(iscale * (x[i] - mn), nmax)
        L[i] = l
        diff = scale * np.float32(l) + mn - x[i]
        best += w[i] * (diff * diff)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * np.float32(step) + fn) / (mx - mn)
        sl = _F0
        sl2 = _F0
        sxl = _F0
        for i in range(n):
            l = _clamped(iscale * (x[i] - mn), nmax)
            laux[i] = l
            wl = w[i] * np.float32(l)
            sl += wl
            sl2 += wl * np.float32(l)
            sxl += wl * x[i]
        D = sum_w * sl2 - sl * sl
        if D > 0:
            this_scale = (sum_w * sxl - sum_x * sl) / D
            this_min = (sl2 * sum_x - sl * sxl) / D
            if this_min > 0:
                this_min = _F0
                this_scale = sxl / sl2
            cur = _F0
            for i in range(n):
                diff = this_scale * np.float32(laux[i]) + this_min - x[i]
                cur += w[i] * (diff * diff)
            if cur < best:
                for i in range(n):
                    L[i] = laux[i]
                best = cur
                scale = this_scale
                mn = this_min
    return scale, -mn


@numba.njit(error_model="numpy", cache=True)
def block_codes(x, nmax, rmin, rdelta, nstep, L, laux, w, scales, mins, sc, m):
    """One super-block x [256] -> codes L [256], 6-bit sc, m [8]; returns the fp16 bits of
    (d, dmin). laux, w, scales, mins are scratch."""
    max_scale = _F0
    max_min = _F0
    for j in range(N_SUB):
        xs = x[SUB * j:SUB * (j + 1)]
        s2 = _F0
        for i in range(SUB):
            s2 += xs[i] * xs[i]
        av = np.sqrt(s2 / np.float32(SUB))
        for i in range(SUB):
            w[i] = av + abs(xs[i])
        s, mn = search(xs, w, nmax, rmin, rdelta, nstep, L[SUB * j:SUB * (j + 1)], laux)
        scales[j] = s
        mins[j] = mn
        if s > max_scale:
            max_scale = s
        if mn > max_min:
            max_min = mn
    inv_scale = _SIXTY_THREE / max_scale if max_scale > 0 else _F0
    inv_min = _SIXTY_THREE / max_min if max_min > 0 else _F0
    for j in range(N_SUB):
        sc[j] = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
        m[j] = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
    dh = fp32_to_fp16_bits(max_scale / _SIXTY_THREE)
    mh = fp32_to_fp16_bits(max_min / _SIXTY_THREE)
    d = fp16_bits_to_fp32(dh)
    dmin = fp16_bits_to_fp32(mh)
    for j in range(N_SUB):
        dj = d * np.float32(sc[j])
        if dj == 0:
            continue  # keeps the codes of the search
        mj = dmin * np.float32(m[j])
        for i in range(SUB):
            L[SUB * j + i] = _clamped((x[SUB * j + i] + mj) / dj, nmax)
    return dh, mh


@numba.njit(error_model="numpy", cache=True)
def write_header(out, o, dh, mh, sc, m):
    """fp16 d, fp16 dmin and the 12-byte scales field at out[o:o+16]."""
    out[o] = dh & 0xFF
    out[o + 1] = dh >> 8
    out[o + 2] = mh & 0xFF
    out[o + 3] = mh >> 8
    for j in range(4):
        out[o + 4 + j] = sc[j] | ((sc[j + 4] >> 4) << 6)
        out[o + 8 + j] = m[j] | ((m[j + 4] >> 4) << 6)
        out[o + 12 + j] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4)


@numba.njit(error_model="numpy", cache=True, inline="always")
def read_header(blocks, b, fp16, d1, m1):
    """d * sc_j and dmin * m_j (float32 [8] each) of block b of blocks [nb, block_bytes]
    (inlined into the dequantize kernels: a call per block costs more than the block)."""
    d = fp16[np.int64(blocks[b, 0]) | (np.int64(blocks[b, 1]) << 8)]
    dmin = fp16[np.int64(blocks[b, 2]) | (np.int64(blocks[b, 3]) << 8)]
    for j in range(4):
        lo, mid, hi = (np.int32(blocks[b, 4 + j]), np.int32(blocks[b, 8 + j]),
                       np.int32(blocks[b, 12 + j]))
        d1[j] = d * np.float32(lo & 63)
        m1[j] = dmin * np.float32(mid & 63)
        d1[j + 4] = d * np.float32((hi & 0xF) | ((lo >> 6) << 4))
        m1[j + 4] = dmin * np.float32((hi >> 4) | ((mid >> 6) << 4))
