"""The element-wise ops around the last SwiGLU FFN, as ggml-cpu computes them, bit for bit.

Pinned to llama-cpp-python 0.3.36's x86-64 build (AVX2 + FMA + F16C, no AVX-512: its
libggml-cpu.so answers ggml_cpu_has_avx512() == 0 and holds no zmm instruction). Sources read
(ggml-org/llama.cpp as stored in the search index: vec.h at 08512d759a1c, the others at an unnamed
recent commit; 0.3.36's own vendored commit was not readable, 0.3.35 vendors 4df29be4f. The test
tests/solvers/tail/test_ffn_ops.py holds every function here equal to the installed library itself,
so a drift between these sources and the shipped build shows there):

- src/llama-graph.cpp `build_ffn`: for LLM_FFN_SILU with a parallel gate (Qwen2, Llama, SmolLM2)
  the graph is ONE fused node, `ggml_swiglu_split(ctx, gate, up)` (GGML_OP_GLU, SWIGLU, not
  swapped), not ggml_silu followed by ggml_mul. The ffn_norm before it is `ggml_rms_norm` then a
  separate `ggml_mul` by ffn_norm.weight (build_norm).
- ggml/src/ggml-cpu/ops.cpp `ggml_compute_forward_rms_norm_f32`, per row of ne00 values:
  each square is formed in float (x*x rounded to float32), widened to ggml_float (double) and
  added in element order; the double sum is divided by ne00 in double and rounded to a float
  `mean`; scale = 1.0f / sqrtf(mean + eps), all in float (eps is the float op parameter); the
  row is copied and multiplied by scale in float (`ggml_vec_scale_f32`, one rounding each).
- ggml/src/ggml-cpu/ops.cpp `ggml_compute_forward_swiglu_f32` calls, per row (the split into
  8-wide chunks restarts at every row), vec.cpp `ggml_vec_swiglu_f32`: the first 8*floor(n/8)
  elements go through the AVX2 `ggml_v_silu` and one float product with up; the remaining n % 8
  elements through the scalar `ggml_silu_f32(x) * up`. `ggml_vec_silu_f32` (the unfused
  GGML_UNARY_OP_SILU) splits the same way without the product.
- vec.h, AVX2 `ggml_v_silu`: t = 0 - x (so -0 and +0 both give +0), e = ggml_v_expf(t),
  silu = x / (1 + e) (float add, float divide).
- vec.h, AVX2 `ggml_v_expf` (ARM's optimized-routines expf, max error ~1.95 ulp), per lane:
    z = fma(x, log2e_f, 1.5*2^23)          the rounded shift puts round(x*log2e) in z's low bits
    n = z - 1.5*2^23                       that integer as a float
    b = fma(-n, ln2_lo, fma(-n, ln2_hi, x)) reduced argument, ln2 split in two floats
    e = bits(z) << 23 (32-bit wrap);  k = float with bits e + bits(1.0f)   (2^n while |n| <= 126)
    u = b*b;  j = fma(fma(fma(c5, b, c4), u, fma(c3, b, c2)), u, c1*b)   (exp(b) - 1)
    |n| <= 126:  fma(k, j, k)
    |n| > 192:   s1*s1 (inf, or 0 for negative n)
    otherwise:   fma(s2, j, s2) * s1, with g = 0x82000000 if n <= 0 else 0,
                 s1 = float with bits g + 0x7f000000, s2 = float with bits e - g (32-bit wrap)
  The vector code takes a shortcut (fma(j, k, k) on all 8 lanes) only when no lane has |n| > 126;
  that is the same value per lane, so the lanes are computed one by one here. NaN compares false
  everywhere and comes out of fma(k, j, k) as NaN, as in the vector code.
- vec.h `ggml_silu_f32`: x / (1.0f + expf(-x)) with glibc's expf (libggml-cpu imports
  expf@GLIBC_2.27). glibc's expf is not correctly rounded in every case, so the kernels call
  libm's own expf through ctypes (numba's ctypes support), the same function in this process.

Each engine function (`*_engine`) is float32 only (the double in rms_norm is ggml's own
ggml_float); each `*_ref` beside it is the float64 textbook formula. Last axis = one ggml row.
"""
from __future__ import annotations

import ctypes
import ctypes.util

import numba
import numpy as np

from exactedit.errors import ExacteditError
from exactedit.quant.dots.fma32 import fma32
from exactedit.quant.formats.f32 import bits_f32, f32_bits

__all__ = ["rms_norm_engine", "rms_norm_ref", "ffn_norm_engine", "ffn_norm_ref", "silu_engine",
           "silu_ref", "swiglu_engine", "swiglu_ref", "SIMD_WIDTH", "gelu_table", "gelu_ref", "geglu_engine",
           "geglu_ref"]

SIMD_WIDTH = 8  # float32 lanes of one __m256: the chunk of ggml_vec_silu_f32 / ggml_vec_swiglu_f32

_libm_path = ctypes.util.find_library("m")
if _libm_path is None:  # pragma: no cover - every glibc system has libm
    raise ExacteditError("libm not found: the scalar silu tail needs the C library's expf")
_expf = ctypes.CDLL(_libm_path).expf
_expf.restype, _expf.argtypes = ctypes.c_float, [ctypes.c_float]
_tanhf = ctypes.CDLL(_libm_path).tanhf
_tanhf.restype, _tanhf.argtypes = ctypes.c_float, [ctypes.c_float]


def _f(hexstr: str) -> np.float32:
    return np.float32(float.fromhex(hexstr))


# ggml_v_expf constants (float literals in the C source; each is exact in float32)
_SHIFT = _f("0x1.8p23")
_LOG2E = _f("0x1.715476p+0")
_LN2_HI = _f("0x1.62e4p-1")
_LN2_LO = _f("0x1.7f7d1cp-20")
_C1 = _f("0x1.ffffecp-1")
_C2 = _f("0x1.fffdb6p-2")
_C3 = _f("0x1.555e66p-3")
_C4 = _f("0x1.573e2ep-5")
_C5 = _f("0x1.0e4020p-7")
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_F126 = np.float32(126.0)
_F192 = np.float32(192.0)
_MASK32 = 0xFFFFFFFF


@numba.njit(inline="always")
def _as_f32(bits64):
    """float32 with the low 32 bits of an int64 (two's complement wrap, as _mm256 integer ops)."""
    v = bits64 & _MASK32
    if v >= 0x80000000:
        v -= 0x100000000
    return bits_f32(np.int32(v))


@numba.njit(inline="always")
def _v_expf_lane(x):
    """One lane of the AVX2 ggml_v_expf (float32 in, float32 out)."""
    z = fma32(x, _LOG2E, _SHIFT)
    n = z - _SHIFT
    b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    e = np.int64(f32_bits(z)) << 23
    k = _as_f32(e + 0x3F800000)
    u = b * b
    j = fma32(fma32(fma32(_C5, b, _C4), u, fma32(_C3, b, _C2)), u, _C1 * b)
    if not abs(n) > _F126:
        return fma32(k, j, k)
    g = 0x82000000 if n <= _ZERO else 0
    s1 = _as_f32(g + 0x7F000000)
    s2 = _as_f32(e - g)
    if abs(n) > _F192:
        return s1 * s1
    return fma32(s2, j, s2) * s1


@numba.njit(inline="always")
def _v_silu_lane(x):
    return x / (_ONE + _v_expf_lane(_ZERO - x))


@numba.njit(inline="always")
def _silu_scalar(x):
    return x / (_ONE + _expf(-x))


@numba.njit
def _silu_rows(z, out):
    """ggml_vec_silu_f32 on each row of z [T, n] float32 into out."""
    n = z.shape[1]
    head = n - n % SIMD_WIDTH
    for t in range(z.shape[0]):
        for i in range(head):
            out[t, i] = _v_silu_lane(z[t, i])
        for i in range(head, n):
            out[t, i] = _silu_scalar(z[t, i])


@numba.njit
def _swiglu_rows(g, u, out):
    """ggml_vec_swiglu_f32 on each row of gate g and up u [T, n] float32 into out."""
    n = g.shape[1]
    head = n - n % SIMD_WIDTH
    for t in range(g.shape[0]):
        for i in range(head):
            out[t, i] = _v_silu_lane(g[t, i]) * u[t, i]
        for i in range(head, n):
            out[t, i] = _silu_scalar(g[t, i]) * u[t, i]


@numba.njit(cache=True)
def _rms_norm_rows(x, eps, out):
    """ggml_compute_forward_rms_norm_f32 on each row of x [T, n] float32 into out."""
    n = x.shape[1]
    for t in range(x.shape[0]):
        total = 0.0  # ggml_float
        for i in range(n):
            sq = x[t, i] * x[t, i]  # float32 product
            total += np.float64(sq)
        mean = np.float32(total / n)
        scale = np.float32(1.0) / np.sqrt(mean + eps)
        for i in range(n):
            out[t, i] = x[t, i] * scale


def _rows(a, name: str) -> np.ndarray:
    """float32 C-contiguous [T, n] view of a 1-D or 2-D input (rows = ggml rows)."""
    a = np.asarray(a)
    if a.dtype != np.float32:
        raise ExacteditError(f"{name}: expected float32 (the engine's activations), got {a.dtype}")
    if a.ndim not in (1, 2) or a.shape[-1] == 0:
        raise ExacteditError(f"{name}: expected a non-empty [n] or [T, n] array, got shape {a.shape}")
    return np.ascontiguousarray(a.reshape(-1, a.shape[-1]))


def rms_norm_engine(R: np.ndarray, eps: float) -> np.ndarray:
    """ggml_rms_norm of R ([n] or [T, n] float32) with the float eps, as ggml-cpu rounds it."""
    x = _rows(R, "R")
    eps32 = np.float32(eps)
    if not eps32 >= 0:
        raise ExacteditError(f"eps: ggml asserts eps >= 0, got {eps!r}")
    out = np.empty_like(x)
    _rms_norm_rows(x, eps32, out)
    return out.reshape(np.shape(R))


def rms_norm_ref(R: np.ndarray, eps: float) -> np.ndarray:
    """R / sqrt(mean(R^2) + eps) over the last axis, float64."""
    x = np.asarray(R, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + float(np.float32(eps)))


def ffn_norm_engine(R: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x = ffn_norm(R): ggml_rms_norm, then the separate ggml_mul by weight [n] (one float
    product per element)."""
    w = np.asarray(weight)
    if w.dtype != np.float32 or w.shape != (np.shape(R)[-1],):
        raise ExacteditError(f"weight: expected float32 [{np.shape(R)[-1]}], got {w.dtype} {w.shape}")
    return rms_norm_engine(R, eps) * w


def ffn_norm_ref(R: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return rms_norm_ref(R, eps) * np.asarray(weight, np.float64)


def silu_engine(z: np.ndarray) -> np.ndarray:
    """ggml_silu (GGML_UNARY_OP_SILU, ggml_vec_silu_f32) of z ([n] or [T, n] float32)."""
    x = _rows(z, "z")
    out = np.empty_like(x)
    _silu_rows(x, out)
    return out.reshape(np.shape(z))


def silu_ref(z: np.ndarray) -> np.ndarray:
    """z * sigmoid(z) in float64 (sigmoid as exp(-log(1 + exp(-z))): no overflow)."""
    x = np.asarray(z, np.float64)
    return x * np.exp(-np.logaddexp(0.0, -x))


def swiglu_engine(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml_swiglu_split(gate=g, up=u): silu(g) * u as llama.cpp's FFN computes it (ggml_vec_swiglu_f32)."""
    if np.shape(g) != np.shape(u):
        raise ExacteditError(f"u: expected the gate's shape {np.shape(g)}, got {np.shape(u)}")
    gg, uu = _rows(g, "g"), _rows(u, "u")
    out = np.empty_like(gg)
    _swiglu_rows(gg, uu, out)
    return out.reshape(np.shape(g))


def swiglu_ref(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return silu_ref(g) * np.asarray(u, np.float64)


# ---- GEGLU (Gemma's FFN) -------------------------------------------------------------------------
# src/llama-graph.cpp `build_ffn` with LLM_FFN_GELU and a parallel gate is ONE fused node,
# `ggml_geglu_split(ctx, gate, up)`; ggml-cpu's vec.h defines GGML_GELU_FP16, so
# `ggml_vec_geglu_f32` is, per element (no SIMD split):
#     g <= -10: 0.0f;   g >= 10: g * u;   else: fp32(ggml_table_gelu_f16[fp16(g)]) * u
# (fp16(g) is F16C's round to nearest even). The table (ggml_cpu_init) holds, per fp16 value x,
# fp16(ggml_gelu_f32(x)) with ggml_gelu_f32(x) = 0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f +
# GELU_COEF_A*x*x))); the build contracts `1.0f + GELU_COEF_A*x*x` into fma(GELU_COEF_A*x, x, 1.0f)
# (measured: with it every one of the 63,488 finite entries equals the library's exported table,
# without it one differs; tests/solvers/tail/test_ffn_ops.py holds the table equal to the library's).
_GELU_A = np.float32(0.044715)
_SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)
_GELU_TABLE: np.ndarray | None = None


def gelu_table() -> np.ndarray:
    """uint16 [65536]: ggml-cpu's `ggml_table_gelu_f16` (fp16 bits of gelu at every fp16 value)."""
    global _GELU_TABLE
    if _GELU_TABLE is None:
        from exactedit.quant.dots.fma32 import fma32_ref

        x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
        with np.errstate(all="ignore"):
            inner = fma32_ref(_GELU_A * x, x, np.full_like(x, 1.0))
            arg = (_SQRT_2_OVER_PI * x) * inner
            t = np.array([_tanhf(float(v)) for v in arg], dtype=np.float32)
            y = (np.float32(0.5) * x) * (np.float32(1.0) + t)
            tab = y.astype(np.float16).view(np.uint16)
        tab.setflags(write=False)
        _GELU_TABLE = tab
    return _GELU_TABLE


def geglu_engine(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml_geglu_split(gate=g, up=u): gelu(g) * u as llama.cpp's Gemma FFN computes it (the table
    lookup above; float32 [n] or [T, n])."""
    if np.shape(g) != np.shape(u):
        raise ExacteditError(f"u: expected the gate's shape {np.shape(g)}, got {np.shape(u)}")
    gg, uu = _rows(g, "g"), _rows(u, "u")
    from exactedit.quant.formats.f16 import FP16_TO_FP32

    with np.errstate(all="ignore"):
        mid = FP16_TO_FP32[gelu_table()[gg.astype(np.float16).view(np.uint16)]] * uu
        out = np.where(gg <= np.float32(-10), np.float32(0), np.where(gg >= np.float32(10), gg * uu, mid))
    return out.astype(np.float32).reshape(np.shape(g))


def gelu_ref(z: np.ndarray) -> np.ndarray:
    """The tanh approximation of GELU that ggml tabulates, in float64."""
    x = np.asarray(z, np.float64)
    return 0.5 * x * (1.0 + np.tanh(float(_SQRT_2_OVER_PI) * (x + float(_GELU_A) * x ** 3)))


def geglu_ref(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return gelu_ref(g) * np.asarray(u, np.float64)
