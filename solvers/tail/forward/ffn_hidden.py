"""The last gated FFN's hidden activation `hh = act(x W_gate^T) * (x W_up^T)`, x = ffn_norm(R),
recomputed from the dump's `R` as llama.cpp's CPU backend computes it, bit for bit. `act` is the
architecture's (`activation_of`): silu (SwiGLU: Qwen2, Llama, SmolLM2) or gelu (GEGLU: Gemma).

Pinned to llama-cpp-python 0.3.36 (x86-64, AVX2 + FMA + F16C, no AVX-512; its libggml-cpu reports
`REPACK = 1 | LLAMAFILE = 1`). The graph (src/llama-graph.cpp `build_ffn`) is `ggml_rms_norm`, a
`ggml_mul` by ffn_norm.weight, two `ggml_mul_mat` (gate, up) and one fused `ggml_swiglu_split`;
Gemma's is the same with one fused `ggml_geglu_split` (ffn_ops.geglu_engine: ggml's fp16 gelu table);
the element-wise steps are solvers/tail/forward/ffn_ops.py. What each weight type's matmul is:

  Q5_0        the Q8_0 kernels on the codes c - 16 (quant/dots/q5_0_dot.py: ggml_vec_dot_q5_0_q8_0)
  Q4_1, Q8_0  one kernel for every micro-batch (quant/dots/q4_1_dot.py: ggml_vec_dot_q4_1_q8_1;
              quant/dots/q8_0_dot.py: llamafile's tinyBLAS and ggml_vec_dot_q8_0_q8_0 agree).
  Q6_K        ggml's tiled K-quant kernel for micro-batches of >= 8 rows, vec_dot below
              (quant/dots/q6_k_dot.py; verified live for heads and ffn_down, not for gate/up here).
  Q4_K        the CPU_REPACK q4_K_8x8 kernels (quant/dots/q4_k_repack.py, which says how and
              what was measured), for a tensor of a multiple of 8 rows (llama.cpp's default load).
Which rows run which kernel depends on the micro-batch sizes the engine ran with (a dump's
meta `ubatch_sizes`); without them the rows are taken as one micro-batch. llama.cpp's thread count
splits the weight rows only, never an activation row's kernel (measured with 1, 2 and 4 threads).

`ffn_hidden_engine` is the engine-faithful float32 path (numba kernels; `reference=True` runs the
numpy references of the same kernels, equal bit for bit); `ffn_hidden_ref` is the float64 textbook
formula on dequantized weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from exactedit.errors import QuantError
from exactedit.quant.dots.q4_1_dot import q4_1_matmul, q4_1_matmul_ref
from exactedit.quant.dots.q5_0_dot import q5_0_matmul, q5_0_matmul_ref
from exactedit.quant.dots.q4_k_dot import q4_k_matmul, q4_k_matmul_ref
from exactedit.quant.dots.q4_k_repack import (GEMM_ROWS, REPACK_ROWS, q4_k_repack_matmul, q4_k_repack_matmul_ref,
                                              repack_gemm_rows)
from exactedit.quant.dots.q6_k_dot import TILED_MIN_ROWS, q6_k_matmul, q6_k_matmul_ref
from exactedit.quant.dots.q8_0_dot import q8_0_matmul, q8_0_matmul_ref
from exactedit.solvers.tail.forward.ffn_ops import (SIMD_WIDTH, ffn_norm_engine, ffn_norm_ref, geglu_engine,
                                                     geglu_ref, swiglu_engine, swiglu_ref)

__all__ = ["ACTIVATIONS", "ENGINE_TYPES", "GEMM_ROWS", "REPACK_ROWS", "LastFfn", "activation_of", "changed_units",
           "ffn_hidden_engine", "ffn_hidden_ref", "last_ffn", "q4_k_repack_matmul", "q4_k_repack_matmul_ref",
           "repack_gemm_rows"]


ENGINE_TYPES = ("Q4_1", "Q4_K", "Q5_0", "Q6_K", "Q8_0")
ACTIVATIONS = ("silu", "gelu")
# llama.cpp's build_ffn activation of a parallel-gated FFN per general.architecture (src/llama-model.cpp);
# only architectures whose last FFN is a plain gated one are listed: any other is refused, not guessed
_ARCH_ACT = {"llama": "silu", "qwen2": "silu", "qwen3": "silu", "mistral": "silu", "granite": "silu",
             "gemma": "gelu", "gemma2": "gelu", "gemma3": "gelu"}


def activation_of(architecture) -> str:
    """The gate activation of the FFN llama.cpp builds for `architecture` (general.architecture)."""
    act = _ARCH_ACT.get(str(architecture))
    if act is None:
        raise QuantError(f"general.architecture {architecture!r}: its FFN activation is not modelled "
                         f"(known: {', '.join(sorted(_ARCH_ACT))})")
    return act


def _act(act: str) -> str:
    if act not in ACTIVATIONS:
        raise QuantError(f"act: expected one of {list(ACTIVATIONS)}, got {act!r}")
    return act


def _units(units, rows: int) -> np.ndarray:
    if units is None:
        return np.arange(rows)
    idx = np.asarray(units)
    if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
        raise QuantError(f"units: expected a non-empty 1-D integer array, got {idx.dtype} {idx.shape}")
    if int(idx.min()) < 0 or int(idx.max()) >= rows:
        raise QuantError(f"units: ids must lie in [0, {rows}), got [{int(idx.min())}, {int(idx.max())}]")
    return idx.astype(np.int64)


def _weights(raw: np.ndarray, name: str, type_name: str, cols: int) -> np.ndarray:
    from exactedit.quant.gguf.parse import row_bytes_of

    raw = np.asarray(raw)
    nbytes = row_bytes_of(type_name, cols)
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != nbytes:
        raise QuantError(f"{name}: expected uint8 [rows, {nbytes}] ({type_name} rows of {cols} values, "
                         f"the whole tensor), got {raw.dtype} {list(raw.shape)}")
    return raw


def _engine_matmul(raw: np.ndarray, type_name: str, cols: int, x: np.ndarray, sizes: Sequence[int],
                   q4_k_repacked: bool, reference: bool) -> np.ndarray:
    """float32 [T, rows(raw)] as the engine multiplies these rows (see the module doc)."""
    if type_name == "Q4_1":
        return (q4_1_matmul_ref if reference else q4_1_matmul)(raw, cols, x)
    if type_name == "Q5_0":
        return (q5_0_matmul_ref if reference else q5_0_matmul)(raw, cols, x)
    if type_name == "Q8_0":
        return (q8_0_matmul_ref if reference else q8_0_matmul)(raw, cols, x)
    if type_name == "Q6_K":
        tiled = np.concatenate([np.full(s, s >= TILED_MIN_ROWS) for s in sizes])
        return (q6_k_matmul_ref if reference else q6_k_matmul)(raw, cols, x, tiled)
    if type_name == "Q4_K":
        if q4_k_repacked:
            gemm = repack_gemm_rows(sizes, x.shape[0])
            return (q4_k_repack_matmul_ref if reference else q4_k_repack_matmul)(raw, x, gemm)
        return (q4_k_matmul_ref if reference else q4_k_matmul)(raw, x)
    raise QuantError(f"ffn hidden: no engine-faithful matmul for {type_name} gate/up weights "
                     f"(supported: {list(ENGINE_TYPES)})")


def changed_units(gate0, up0, gate1, up1) -> np.ndarray:
    """int64: the units whose gate or up row differs between two versions of the last FFN's
    gate and up tensors (uint8 [h, row_bytes] each): the rewritten units of a gated edit, whose
    hidden values a dump (the base's) does not hold."""
    return np.flatnonzero((np.asarray(gate0) != np.asarray(gate1)).any(1)
                          | (np.asarray(up0) != np.asarray(up1)).any(1)).astype(np.int64)


@dataclass(frozen=True, eq=False)
class LastFfn:
    """A file's last gated FFN as the engine reads it: the gate and up tensors' names and bytes as
    stored (uint8 [h, row_bytes]), ffn_norm's weight (float32 [n]), the rms eps and the
    architecture. `type_name` and `act` are checked when asked for (a kld comparison reads a file
    whose gate and up types differ, or whose architecture is not listed, without needing either)."""

    gate: str
    up: str
    gate_raw: np.ndarray
    up_raw: np.ndarray
    gate_type: str
    up_type: str
    norm: np.ndarray
    eps: float
    architecture: object

    @property
    def type_name(self) -> str:
        if self.gate_type != self.up_type:
            raise QuantError(f"{self.gate} and {self.up} differ in type ({self.gate_type}, {self.up_type})")
        return self.gate_type

    @property
    def act(self) -> str:
        return activation_of(self.architecture)

    def x(self, R) -> np.ndarray:
        """x = ffn_norm(R) as ggml computes it (float32 [T, n])."""
        return ffn_norm_engine(np.asarray(R, np.float32), self.norm, self.eps)

    def changed(self, gate_raw, up_raw) -> np.ndarray:
        """The units whose gate or up row differs in the given tensors (`changed_units`)."""
        return changed_units(self.gate_raw, self.up_raw, gate_raw, up_raw)

    def hidden(self, R, units, *, gate_raw=None, up_raw=None, ubatch_sizes=None) -> np.ndarray:
        """float32 [T, len(units)]: `ffn_hidden_engine` of those units from R, with the file's gate
        and up tensors or the given ones (an edit's)."""
        return ffn_hidden_engine(np.asarray(R, np.float32), self.norm, self.eps,
                                 self.gate_raw if gate_raw is None else gate_raw,
                                 self.up_raw if up_raw is None else up_raw, self.type_name, list(units),
                                 ubatch_sizes=ubatch_sizes, act=self.act)


def last_ffn(g, down: str, architecture, eps: float) -> LastFfn:
    """The LastFfn of the open GGUF `g` whose last FFN's down projection is the tensor `down` (its
    gate, up and norm named alike: ffn_gate, ffn_up, ffn_norm); the gate and up bytes are the
    file's read-only views, valid while `g` is open (a caller that rewrites rows copies them); a
    missing tensor raises the reader's GGUFFormatError."""
    gate, up, norm = (down.replace("ffn_down", part) for part in ("ffn_gate", "ffn_up", "ffn_norm"))
    return LastFfn(gate, up, np.asarray(g.read_raw(gate)), np.asarray(g.read_raw(up)), g.tensor(gate).type_name,
                   g.tensor(up).type_name, np.asarray(g.read_rows(norm), np.float32).reshape(-1), float(eps),
                   architecture)


def ffn_hidden_engine(R: np.ndarray, norm_weight: np.ndarray, eps: float, gate_raw: np.ndarray,
                      up_raw: np.ndarray, type_name: str, units=None, *,
                      ubatch_sizes: Sequence[int] | None = None, q4_k_repacked: bool | None = None,
                      reference: bool = False, act: str = "silu") -> np.ndarray:
    """float32 [T, len(units)]: llama.cpp's `ffn_swiglu` (act "silu") or `ffn_geglu` (act "gelu")
    of the last layer for the residual rows R [T, n] (the dump's `R`), units = gate/up rows (all by
    default).

    gate_raw / up_raw: the whole tensors' bytes, uint8 [h, row_bytes] (the repack decision reads
    h); ubatch_sizes: the engine's micro-batches over these rows (a dump's meta), default one;
    q4_k_repacked: whether the engine holds Q4_K gate/up in its CPU_REPACK buffer (default: as
    llama.cpp decides, h % 8 == 0; a Q4_K tensor the engine would not repack is refused, since
    its tiled path is not modelled). reference: the numpy kernels instead of numba (same floats)."""
    R = np.asarray(R)
    act = _act(act)
    if R.dtype != np.float32 or R.ndim != 2:
        raise QuantError(f"R: expected float32 [T, n], got {R.dtype} {R.shape}")
    T, cols = R.shape
    gate = _weights(gate_raw, "gate_raw", type_name, cols)
    up = _weights(up_raw, "up_raw", type_name, cols)
    if gate.shape[0] != up.shape[0]:
        raise QuantError(f"up_raw: {up.shape[0]} rows, the gate has {gate.shape[0]}")
    idx = _units(units, gate.shape[0])
    sizes = (T,) if ubatch_sizes is None else tuple(int(s) for s in ubatch_sizes)
    if type_name == "Q4_K":
        repackable = gate.shape[0] % REPACK_ROWS == 0
        if q4_k_repacked is None:
            q4_k_repacked = repackable
            if not repackable:
                raise QuantError(f"Q4_K gate/up of {gate.shape[0]} rows are not repacked by llama.cpp "
                                 f"(rows % {REPACK_ROWS} != 0); its tiled kernel is not modelled")
        elif q4_k_repacked and not repackable:
            raise QuantError(f"q4_k_repacked: llama.cpp repacks Q4_K only with rows % {REPACK_ROWS} == 0, "
                             f"these have {gate.shape[0]}")
    repack_gemm_rows(sizes, T)                                       # validates the layout
    x = ffn_norm_engine(R, np.asarray(norm_weight).reshape(-1), eps)
    g = _engine_matmul(gate[idx], type_name, cols, x, sizes, bool(q4_k_repacked), reference)
    u = _engine_matmul(up[idx], type_name, cols, x, sizes, bool(q4_k_repacked), reference)
    if act == "gelu":                                   # element by element: no SIMD split to follow
        return geglu_engine(g, u)
    return _swiglu_at(g, u, idx, gate.shape[0])


def _swiglu_at(g: np.ndarray, u: np.ndarray, idx: np.ndarray, h: int) -> np.ndarray:
    """swiglu_engine of the units idx as the engine computes them inside rows of h values: a unit
    in the first h - h % 8 takes the AVX2 silu, one in the last h % 8 the scalar expf one."""
    vec = idx < h - h % SIMD_WIDTH
    out = np.empty(g.shape, np.float32)
    if vec.any():
        k = int(vec.sum())
        pad = (-k) % SIMD_WIDTH                       # whole 8-wide chunks: every lane vectorized
        gv = np.pad(g[:, vec], ((0, 0), (0, pad)))
        uv = np.pad(u[:, vec], ((0, 0), (0, pad)))
        out[:, vec] = swiglu_engine(gv, uv)[:, :k]
    for c in np.flatnonzero(~vec):                    # a row of one value: the scalar tail
        out[:, c:c + 1] = swiglu_engine(np.ascontiguousarray(g[:, c:c + 1]),
                                        np.ascontiguousarray(u[:, c:c + 1]))
    return out


def ffn_hidden_ref(R: np.ndarray, norm_weight: np.ndarray, eps: float, gate_raw: np.ndarray,
                   up_raw: np.ndarray, type_name: str, units=None, act: str = "silu") -> np.ndarray:
    """float64 [T, len(units)]: act(x Wg^T) * (x Wu^T), x = R / rms(R) * w, on the dequantized
    weights, every step in float64 (no activation quantization; gelu: its tanh form)."""
    act = _act(act)
    from exactedit.quant import dequantize

    R = np.asarray(R)
    if R.ndim != 2:
        raise QuantError(f"R: expected [T, n], got shape {R.shape}")
    cols = R.shape[1]
    gate = _weights(gate_raw, "gate_raw", type_name, cols)
    up = _weights(up_raw, "up_raw", type_name, cols)
    idx = _units(units, gate.shape[0])
    x = ffn_norm_ref(R, np.asarray(norm_weight, np.float64).reshape(-1), eps)
    wg = dequantize(np.ascontiguousarray(gate[idx]), type_name, cols).astype(np.float64)
    wu = dequantize(np.ascontiguousarray(up[idx]), type_name, cols).astype(np.float64)
    return (geglu_ref if act == "gelu" else swiglu_ref)(x @ wg.T, x @ wu.T)
