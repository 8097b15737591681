"""Engine-faithful arithmetic (`--match-engine llamacpp`): the tail as llama.cpp's CPU backend
computes it, so that an offline prediction equals the engine's logits bit for bit.

The default forwards compute the model's math exactly (dequantized weights, float64 sums). The
engine does not: before every matmul against quantized weights ggml-cpu quantizes the float32
activation row (Q8_K for K-quant weights, see quant/q8_k.py) and adds per-block integer dot
products in float32 in its own order. Ignoring that costs KL ~3e-4 against the engine; modelling
it gives identical logits. What llama.cpp 0.3.36 (x86-64, AVX2 + FMA build) does for Q6_K
weights W (rows r) times activations x (rows t), per 256-wide block b:

    q8 = Q8_K(x[t]);  u = the 6-bit codes of W[r] (0..63);  sc = its int8 sub-block scales
    lane_L(b) = sum_{e in lane L} sc[e/16] u[e] q8[e] - 32 (sc[2L] bsum[2L] + sc[2L+1] bsum[2L+1])
        with lane L = elements {32 j + 4 L + i : j < 8, i < 4}  (exact int32)
    tiled path (a micro-batch of >= 8 rows):
        acc = 0;  for b: acc = fma(f32(d_W[b] * f32(sum_L lane_L(b))), d_x[b], acc)
    vec_dot path (a micro-batch of < 8 rows):
        acc_L = 0;  for b: acc_L = fma(f32(d_x[b] * d_W[b]), f32(lane_L(b)), acc_L)
        result = ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))
RMSNorm (ggml_compute_forward_rms_norm_f32): sum of float32 squares in float64, in index order;
mean = f32(sum / n); scale = 1 / sqrtf(mean + eps); y = (x * scale) * w, all float32.

Q8_0 weights (Gemma 3's head) take Q8_0 activations and their own kernels: solvers/head/
engine_q8_0.py. A post-FFN norm (Gemma 3) is one more `rms_norm` on the FFN output before the
residual add; a final logit softcap is ggml's scale, libm `tanhf`, scale (`softcap`).

`q6_k_matmul_ref` is the numpy reference (integer dots as exact float64 matmuls, an exact
float32 fma); `q6_k_matmul` the numba fast path (LLVM's fma). Both must agree bit for bit
(tests/solvers/head/test_engine_numerics.py); the live tests compare them with the engine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import math

import numba
import numpy as np
from numba import prange, types
from numba.extending import intrinsic

from exactedit.quant import q6_k, q8_k
from exactedit.quant.errors import QuantError

ENGINES = ("llamacpp",)
TILED_MIN_ROWS = 8    # ggml-cpu's tiled K-quant matmul takes micro-batches of >= 8 rows
_LANE = np.array([32 * j + 4 * L + i for L in range(8) for j in range(8) for i in range(4)]).reshape(8, 32)


@dataclass(frozen=True)
class MatchEngine:
    """Which engine to imitate and how the rows were cut into micro-batches when it ran
    (`ubatch_sizes`, in row order, summing to the row count; recorded in every dump's meta)."""

    engine: str
    ubatch_sizes: tuple[int, ...]

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise QuantError(f"match-engine: expected one of {ENGINES}, got {self.engine!r}")
        sizes = tuple(self.ubatch_sizes)
        if not sizes or any(not isinstance(s, (int, np.integer)) or s < 1 for s in sizes):
            raise QuantError(f"match-engine: ubatch_sizes must be positive integers, got {sizes!r}")
        object.__setattr__(self, "ubatch_sizes", tuple(int(s) for s in sizes))

    @classmethod
    def from_meta(cls, engine: str, meta: Mapping, rows: int) -> MatchEngine:
        """From a dump's meta (`ubatch_sizes`, written by native.llamacpp)."""
        sizes = meta.get("ubatch_sizes") if isinstance(meta, Mapping) else None
        if not isinstance(sizes, Sequence) or sum(int(s) for s in sizes) != rows:
            raise QuantError(f"match-engine {engine}: the dump's meta lacks ubatch_sizes summing to its "
                             f"{rows} rows (got {sizes!r}); re-dump with native.llamacpp")
        return cls(engine, tuple(sizes))

    def tiled_rows(self) -> np.ndarray:
        """bool [rows]: True where the row's micro-batch runs the tiled kernel."""
        return np.concatenate([np.full(s, s >= TILED_MIN_ROWS) for s in self.ubatch_sizes])


# ---- exact float32 fma ----------------------------------------------------------------------
def fma32_ref(a, b, c) -> np.ndarray:
    """Correctly rounded float32 a*b + c (numpy): the product is exact in float64, the sum's
    rounding error comes from TwoSum, and a float64 sum lying exactly on a float32 midpoint is
    resolved by that error's sign (the only case where rounding twice differs)."""
    a, b, c = (np.asarray(v, np.float32) for v in (a, b, c))
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    r = s.astype(np.float32)
    toward = np.nextafter(r, np.where(s > r.astype(np.float64), np.float32(np.inf), np.float32(-np.inf)))
    mid = (r.astype(np.float64) + toward.astype(np.float64)) / 2
    on_mid = (s == mid) & (err != 0) & (s != r.astype(np.float64))
    up = on_mid & ((err > 0) == (toward > r))  # the exact value lies on toward's side of mid
    return np.where(up, toward, r).astype(np.float32)


@intrinsic
def _fma32(typingctx, a, b, c):
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return sig, codegen


# ---- Q6_K x Q8_K ----------------------------------------------------------------------------
def _q6_k_blocks(raw: np.ndarray, cols: int) -> np.ndarray:
    """uint8 [rows, row_bytes] -> Q6_K blocks [rows, nb] (structured, named fields), validated."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    nb = cols // q6_k.QK_K
    if cols % q6_k.QK_K or raw.ndim != 2 or raw.shape[1] != nb * q6_k.BLOCK_BYTES:
        raise QuantError(f"Q6_K: expected uint8 [rows, {nb * q6_k.BLOCK_BYTES}] for {cols} columns, "
                         f"got {list(raw.shape)}")
    return raw.view(q6_k.BLOCK).reshape(raw.shape[0], nb)


def _q6_k_parts(raw: np.ndarray, cols: int):
    """uint8 [rows, row_bytes] -> unsigned codes u [rows, nb, 256] (0..63), scales [rows, nb, 16]
    int8, d [rows, nb] float32."""
    blk = _q6_k_blocks(raw, cols)
    ql, qh = blk["ql"].astype(np.uint8), blk["qh"].astype(np.uint8)
    u = np.empty(blk.shape + (q6_k.QK_K,), np.uint8)
    for half in range(2):
        l4, h2 = ql[..., 64 * half:64 * half + 64], qh[..., 32 * half:32 * half + 32]
        o = 128 * half
        u[..., o + 0:o + 32] = (l4[..., :32] & 15) | ((h2 & 3) << 4)
        u[..., o + 32:o + 64] = (l4[..., 32:] & 15) | (((h2 >> 2) & 3) << 4)
        u[..., o + 64:o + 96] = (l4[..., :32] >> 4) | (((h2 >> 4) & 3) << 4)
        u[..., o + 96:o + 128] = (l4[..., 32:] >> 4) | (((h2 >> 6) & 3) << 4)
    return u, blk["scales"].astype(np.int8), blk["d"].astype(np.float32)


def _lanes_ref(u, sc, xq) -> np.ndarray:
    """Exact int lanes [rows, T, nb, 8] (as float64) of the AVX2 Q6_K x Q8_K block dot."""
    rows, nb = u.shape[:2]
    T = xq.shape[0]
    w = u.astype(np.float64) * np.repeat(sc.astype(np.float64), 16, axis=-1)      # sc[e/16] u[e]
    q = xq["qs"].astype(np.float64)                                                # [T, nb, 256]
    out = np.empty((rows, T, nb, 8), np.float64)
    for b in range(nb):
        for L in range(8):
            out[:, :, b, L] = w[:, b, _LANE[L]] @ q[:, b, _LANE[L]].T             # exact: < 2**53
    bs = xq["bsums"].astype(np.float64).reshape(T, nb, 8, 2)
    s2 = sc.astype(np.float64).reshape(rows, nb, 8, 2)
    out -= 32 * np.einsum("rblk,tblk->rtbl", s2, bs)
    return out


def q6_k_matmul_ref(raw: np.ndarray, cols: int, x: np.ndarray, tiled: np.ndarray,
                    chunk: int = 2048) -> np.ndarray:
    """Reference: float32 [T, rows] = W (Q6_K, raw rows) @ x[t] as ggml-cpu computes it; row t
    takes the tiled kernel where `tiled[t]`, else vec_dot."""
    x = np.ascontiguousarray(x, np.float32)
    xq = q8_k.quantize_ref(x)
    tiled = np.asarray(tiled, bool)
    out = np.empty((x.shape[0], raw.shape[0]), np.float32)
    for r0 in range(0, raw.shape[0], chunk):
        u, sc, d = _q6_k_parts(raw[r0:r0 + chunk], cols)
        lanes = _lanes_ref(u, sc, xq)                       # [r, T, nb, 8]
        dw, dx = d[:, None, :], xq["d"][None, :, :]        # [r, 1, nb], [1, T, nb]
        acc = np.zeros(lanes.shape[:2], np.float32)
        acc8 = np.zeros(lanes.shape[:2] + (8,), np.float32)
        for b in range(lanes.shape[2]):
            res = (dw[..., b] * lanes[:, :, b, :].sum(-1).astype(np.float32)).astype(np.float32)
            acc = fma32_ref(res, np.broadcast_to(dx[..., b], acc.shape), acc)
            db = (dx[..., b] * dw[..., b]).astype(np.float32)[..., None]
            acc8 = fma32_ref(np.broadcast_to(db, acc8.shape), lanes[:, :, b, :].astype(np.float32), acc8)
        h = acc8[..., 4:] + acc8[..., :4]
        vec = (h[..., 0] + h[..., 2]) + (h[..., 1] + h[..., 3])
        out[:, r0:r0 + chunk] = np.where(tiled[None, :], acc, vec).T
    return out


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _q6_k_matmul_kernel(ql, qh, sc, dw, qL, bsums, dx, tiled, lane_index, out):
    """qL: the Q8_K codes as int16 [T, nb, 256] in lane-major order (lane L's 32 elements at
    32 L .. 32 L + 31, see _LANE), so each lane is a contiguous integer dot that vectorizes."""
    rows, nb = dw.shape
    T = qL.shape[0]
    for r in prange(rows):
        w = np.empty(256, np.int16)
        wl = np.empty(256, np.int16)
        acc = np.zeros(T, np.float32)
        acc8 = np.zeros((T, 8), np.float32)
        lanes = np.empty(8, np.int32)
        for b in range(nb):
            for half in range(2):
                for l in range(32):
                    lo0 = np.int32(ql[r, b, 64 * half + l])
                    lo1 = np.int32(ql[r, b, 64 * half + 32 + l])
                    h = np.int32(qh[r, b, 32 * half + l])
                    o = 128 * half + l
                    w[o] = (lo0 & 15) | ((h & 3) << 4)
                    w[o + 32] = (lo1 & 15) | (((h >> 2) & 3) << 4)
                    w[o + 64] = (lo0 >> 4) | (((h >> 4) & 3) << 4)
                    w[o + 96] = (lo1 >> 4) | (((h >> 6) & 3) << 4)
            for e in range(256):
                w[e] = w[e] * np.int16(sc[r, b, e // 16])        # |u * sc| <= 63 * 128: fits int16
            for k in range(256):
                wl[k] = w[lane_index[k]]
            dwb = dw[r, b]
            for t in range(T):
                total = np.int32(0)
                for L in range(8):
                    s = np.int32(0)
                    for k in range(32 * L, 32 * L + 32):
                        s += np.int32(wl[k]) * np.int32(qL[t, b, k])
                    s -= 32 * (np.int32(sc[r, b, 2 * L]) * np.int32(bsums[t, b, 2 * L])
                               + np.int32(sc[r, b, 2 * L + 1]) * np.int32(bsums[t, b, 2 * L + 1]))
                    lanes[L] = s
                    total += s
                if tiled[t]:
                    acc[t] = _fma32(dwb * np.float32(total), dx[t, b], acc[t])
                else:
                    db = dx[t, b] * dwb
                    for L in range(8):
                        acc8[t, L] = _fma32(db, np.float32(lanes[L]), acc8[t, L])
        for t in range(T):
            if tiled[t]:
                out[t, r] = acc[t]
            else:
                a = acc8[t]
                out[t, r] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))


def q6_k_matmul(raw: np.ndarray, cols: int, x: np.ndarray, tiled: np.ndarray) -> np.ndarray:
    """Fast path of `q6_k_matmul_ref` (numba, rows of W in parallel); identical floats."""
    blk = _q6_k_blocks(raw, cols)
    xq = q8_k.quantize(np.ascontiguousarray(x, np.float32))
    out = np.empty((x.shape[0], blk.shape[0]), np.float32)
    _q6_k_matmul_kernel(np.ascontiguousarray(blk["ql"]), np.ascontiguousarray(blk["qh"]),
                        np.ascontiguousarray(blk["scales"]), blk["d"].astype(np.float32),
                        np.ascontiguousarray(xq["qs"].astype(np.int16)[:, :, _LANE.reshape(-1)]),
                        np.ascontiguousarray(xq["bsums"]),
                        np.ascontiguousarray(xq["d"]), np.ascontiguousarray(tiled, dtype=np.bool_),
                        np.ascontiguousarray(_LANE.reshape(-1)), out)
    return out


# ---- the rest of the rmsnorm tail -----------------------------------------------------------
def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """ggml's RMSNorm times the norm weight, float32 as ggml-cpu computes it (see module doc)."""
    x = np.ascontiguousarray(x, np.float32)
    sq = (x * x).astype(np.float64)
    total = np.cumsum(sq, axis=-1)[..., -1]           # sequential, in index order
    mean = (total / x.shape[-1]).astype(np.float32)
    scale = (np.float32(1) / np.sqrt(mean + np.float32(eps))).astype(np.float32)
    return ((x * scale[..., None]) * np.asarray(w, np.float32)).astype(np.float32)


def softcap_ref(logits: np.ndarray, cap: float) -> np.ndarray:
    """ggml's final logit softcap, float32: scale by f32(1 / cap), libm's `tanhf` (glibc's is not
    correctly rounded, so it is called itself, element by element), scale by cap."""
    import ctypes
    import ctypes.util

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.tanhf.restype, libm.tanhf.argtypes = ctypes.c_float, [ctypes.c_float]
    y = (np.asarray(logits, np.float32) * (np.float32(1) / np.float32(cap))).astype(np.float32)
    t = np.array([libm.tanhf(float(v)) for v in y.reshape(-1)], np.float32).reshape(y.shape)
    return (t * np.float32(cap)).astype(np.float32)


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _softcap_kernel(y, cap, out):
    inv = np.float32(1) / cap
    for t in prange(y.shape[0]):
        for v in range(y.shape[1]):
            out[t, v] = math.tanh(y[t, v] * inv) * cap      # float32 math.tanh calls libm's tanhf


def softcap(logits: np.ndarray, cap: float) -> np.ndarray:
    """Fast path of `softcap_ref` (numba); identical floats."""
    y = np.ascontiguousarray(logits, np.float32)
    out = np.empty_like(y)
    _softcap_kernel(y.reshape(y.shape[0], -1), np.float32(cap), out.reshape(y.shape[0], -1))
    return out


def _matmuls(reference: bool) -> dict:
    from exactedit.solvers.head import engine_q8_0  # imported here: it builds on this module's fma

    if reference:
        return {"Q6_K": q6_k_matmul_ref, "Q8_0": engine_q8_0.q8_0_matmul_ref}
    return {"Q6_K": q6_k_matmul, "Q8_0": engine_q8_0.q8_0_matmul}


def engine_matmul(raw: np.ndarray, type_name: str, cols: int, x: np.ndarray, match: MatchEngine,
                  reference: bool = False, tiled: np.ndarray | None = None) -> np.ndarray:
    """float32 [T, rows] = W @ x[t] as `match.engine` computes it, for W's GGUF type. `tiled`
    (bool [T]) overrides `match.tiled_rows()` for a slice of the rows the engine ran."""
    table = _matmuls(reference)
    if type_name not in table:
        raise QuantError(f"match-engine {match.engine}: no engine-faithful matmul for {type_name} "
                         f"weights (supported: {sorted(table)})")
    tiled = match.tiled_rows() if tiled is None else np.asarray(tiled, bool)
    if tiled.shape[0] != x.shape[0]:
        raise QuantError(f"match-engine: ubatch_sizes cover {tiled.shape[0]} rows, the activations "
                         f"have {x.shape[0]}")
    return table[type_name](raw, cols, x, tiled)


# ---- the engine-faithful logits path (`exactedit logits --match-engine llamacpp`) -----------
def rmsnorm_engine_mix(R: np.ndarray, hh: np.ndarray, w_down_raw: np.ndarray, down_type: str, h: int,
                       w_norm: np.ndarray, eps: float, match: MatchEngine,
                       tiled: np.ndarray | None = None, w_post: np.ndarray | None = None) -> np.ndarray:
    """The head's input [T, n] of an rmsnorm tail as the engine computes it:
    rms_norm(R + W_down @ hh), or rms_norm(R + rms_norm(W_down @ hh) * w_post) with a post-FFN
    norm (Gemma 3), with the engine's quantized-activation matmul and float32 norms."""
    ffn_out = engine_matmul(w_down_raw, down_type, h, np.asarray(hh, np.float32), match, tiled=tiled)
    if w_post is not None:
        ffn_out = rms_norm(ffn_out, w_post, eps)
    return rms_norm(ffn_out + np.asarray(R, np.float32), w_norm, eps)


class EngineMatmul:
    """A `solvers.head.forward_fast.Matmul` strategy: head tiles as the engine multiplies them,
    from the source's raw quantized rows (a `solvers.head.stream.QuantRows`)."""

    def __init__(self, match: MatchEngine, tiled: np.ndarray | None = None):
        self.match = match
        self.tiled = match.tiled_rows() if tiled is None else np.asarray(tiled, bool)
        self.name = f"match-engine {match.engine}"

    def prepare(self, mix: np.ndarray) -> np.ndarray:
        mix = np.ascontiguousarray(mix, np.float32)
        if mix.shape[0] != self.tiled.shape[0]:
            raise QuantError(f"match-engine: {self.tiled.shape[0]} rows of micro-batch layout, "
                             f"{mix.shape[0]} activation rows")
        return mix

    def tile(self, prepared: np.ndarray, source, start: int, stop: int) -> np.ndarray:
        if not hasattr(source, "read_raw"):
            raise QuantError("match-engine: the head must be read from its quantized bytes")
        return engine_matmul(source.read_raw(start, stop), source.qtype, source.cols, prepared,
                             self.match, tiled=self.tiled)


def engine_logits_setup(g, tail, dump, span: tuple[int, int], engine: str):
    """(mix [T, n], EngineMatmul) for dump rows `span` of the rmsnorm `tail`
    (solvers.model.RmsnormTail) of the open GGUF `g`, the micro-batch layout from the dump's meta.
    A post-FFN norm (Gemma 3) is modelled; a logit softcap is refused here, because the head
    pass (solvers.head.stream.vocab_pass) applies its own exact softcap to the tiles."""
    spec = tail.spec
    if tail.kind != "rmsnorm" or tail.softcap:
        raise QuantError(f"match-engine {engine}: covers rmsnorm tails without a logit softcap; "
                         f"{tail.path} has a {tail.kind} tail, softcap {tail.softcap}")
    match = MatchEngine.from_meta(engine, dump.meta, dump.rows)
    tiled = match.tiled_rows()[span[0]:span[1]]
    down = spec.tensor("ffn_down")
    sl = slice(*span)
    w_norm = np.asarray(tail.mix_params.w_norm, np.float32).reshape(-1)
    w_post = tail.l47.w_post
    w_post = None if w_post is None else np.asarray(w_post, np.float32).reshape(-1)
    mix = rmsnorm_engine_mix(dump.R[sl], dump.hh[sl], g.read_raw(down.name), down.type_name, spec.h,
                             w_norm, tail.mix_params.eps, match, tiled, w_post)
    return mix, EngineMatmul(match, tiled)
