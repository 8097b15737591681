"""Engine-faithful arithmetic (`--match-engine llamacpp`): the tail as llama.cpp's CPU backend
computes it, so that an offline prediction equals the engine's logits bit for bit.

The default forwards compute the model's math exactly (dequantized weights, float64 sums). The
engine does not: before every matmul against quantized weights ggml-cpu quantizes the float32
activation row (Q8_K for K-quant weights, see quant/formats/q8_k.py) and adds per-block integer dot
products in float32 in its own order. Ignoring that costs KL ~3e-4 against the engine; modelling
it gives identical logits. The weight x activation dot products (Q6_K x Q8_K, Q8_0 x Q8_0 and
Q4_1 x Q8_1, in ggml-cpu's tiled and vec_dot orders) are modelled with the formats, in
quant/dots/q6_k_dot.py, quant/dots/q8_0_dot.py and quant/dots/q4_1_dot.py; this module puts them together into
the tail: which kernel each row's micro-batch takes, the float32 norms, the softcap, and the
`Matmul` strategy the vocab pass plugs in.

RMSNorm (ggml_compute_forward_rms_norm_f32): sum of float32 squares in float64, in index order;
mean = f32(sum / n); scale = 1 / sqrtf(mean + eps); y = (x * scale) * w, all float32.

A post-FFN norm (Gemma 3) is one more `rms_norm` on the FFN output before the residual add; a
final logit softcap is ggml's scale, libm `tanhf`, scale (`softcap`). `softcap_ref` / `softcap`
are reference and fast path, equal bit for bit (tests/solvers/tail/test_engine.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import math

import numba
import numpy as np
from numba import prange

from exactedit.errors import QuantError
from exactedit.quant.dots.q4_1_dot import q4_1_matmul, q4_1_matmul_ref
from exactedit.quant.dots.q6_k_dot import TILED_MIN_ROWS, q6_k_matmul, q6_k_matmul_ref
from exactedit.quant.dots.q8_0_dot import q8_0_matmul, q8_0_matmul_ref

ENGINES = ("llamacpp",)


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
        """From a dump's meta (`ubatch_sizes`, written by native.llamacpp.engine)."""
        sizes = meta.get("ubatch_sizes") if isinstance(meta, Mapping) else None
        if not isinstance(sizes, Sequence) or sum(int(s) for s in sizes) != rows:
            raise QuantError(f"match-engine {engine}: the dump's meta lacks ubatch_sizes summing to its "
                             f"{rows} rows (got {sizes!r}); re-dump with native.llamacpp.engine")
        return cls(engine, tuple(sizes))

    def tiled_rows(self) -> np.ndarray:
        """bool [rows]: True where the row's micro-batch runs the tiled kernel."""
        return np.concatenate([np.full(s, s >= TILED_MIN_ROWS) for s in self.ubatch_sizes])


# ---- the rest of the rmsnorm tail -----------------------------------------------------------
def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """ggml's RMSNorm times the norm weight, float32 as ggml-cpu computes it: the one engine rms
    norm (solvers.tail.forward.ffn_ops.ffn_norm_engine, checked bit for bit against ggml's C)."""
    from exactedit.solvers.tail.forward.ffn_ops import ffn_norm_engine

    x = np.asarray(x, np.float32)
    return ffn_norm_engine(x, np.asarray(w, np.float32).reshape(-1), eps)


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
    if reference:
        return {"Q6_K": q6_k_matmul_ref, "Q8_0": q8_0_matmul_ref, "Q4_1": q4_1_matmul_ref}
    return {"Q6_K": q6_k_matmul, "Q8_0": q8_0_matmul, "Q4_1": q4_1_matmul}


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
    """A `solvers.tail.forward.head_fast.Matmul` strategy: head tiles as the engine multiplies them,
    from the source's raw quantized rows (a `solvers.tail.passes.vocab_pass.QuantRows`)."""

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
    (solvers.tail.model.RmsnormTail) of the open GGUF `g`, the micro-batch layout from the dump's meta.
    A post-FFN norm (Gemma 3) is modelled; a logit softcap is refused here, because the head
    pass (solvers.tail.passes.vocab_pass.vocab_pass) applies its own exact softcap to the tiles."""
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
