"""ffn_ops: the engine functions against ggml itself, bit for bit, and against the float64 references.

The oracle builds a one-op ggml graph through ctypes (libggml-base + libggml-cpu of the installed
llama-cpp-python): ggml_init with its own buffer, F32 tensors filled through ggml_get_data,
ggml_rms_norm / ggml_mul / ggml_silu / ggml_swiglu_split, ggml_graph_compute_with_ctx with one
thread (every op here works row by row, so the thread count does not change a value).

Tolerance of the references (float64) against the engine (float32), relative to |ref|:
  rms_norm  rtol 2^-20: six float32 roundings (x*x, mean, + eps, sqrtf, 1/, x*scale), each
            <= 2^-24 relative, the double sum adds < n * 2^-53; x 16 for slack. Inputs kept in
            [2^-40, 2^40] so that x*x neither overflows nor underflows float32.
  silu      rtol 2^-20: ggml_v_expf is within ~1.95 ulp (2^-22.9 relative) of exp, glibc's expf
            within 1 ulp; 1 + e and the divide add 2 roundings; exp's error enters silu damped by
            e/(1+e) <= 1. atol 2^-100: both exps overflow to inf above ~88.4, where silu(x) is
            -|x| e^-|x| < 2^-120 in magnitude but the engine returns -0.
  swiglu    silu's bound plus one rounding of the product, on |g|, |u| <= 2^20 (no overflow).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from exactedit.errors import ExacteditError
from exactedit.solvers.tail.forward.ffn_ops import (ffn_norm_engine, ffn_norm_ref, geglu_engine, geglu_ref,
                                                     gelu_table, rms_norm_engine,
                                                     rms_norm_ref, silu_engine, silu_ref, swiglu_engine,
                                                     swiglu_ref)
from tests import oracles

GGML_TYPE_F32 = 0
WIDTHS = (1536, 8960, 576, 13, 1003, 8, 7, 1)  # Qwen2.5 n, Qwen2.5 ffn, SmolLM2 n, ragged tails
RTOL = 2.0 ** -20
SILU_ATOL = 2.0 ** -100


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class GgmlGraph:
    """One-op ggml graphs computed on the CPU backend (ggml's own code, through ctypes)."""

    def __init__(self):
        base = ctypes.CDLL(str(oracles.load().path), mode=ctypes.RTLD_GLOBAL)
        cpu = oracles.ggml_library("ggml-cpu")
        P, T = ctypes.c_void_p, ctypes.c_void_p
        sigs = {
            (base, "ggml_init"): (P, [_InitParams]),
            (base, "ggml_free"): (None, [P]),
            (base, "ggml_new_tensor_2d"): (T, [P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
            (base, "ggml_new_tensor_1d"): (T, [P, ctypes.c_int, ctypes.c_int64]),
            (base, "ggml_get_data"): (P, [T]),
            (base, "ggml_rms_norm"): (T, [P, T, ctypes.c_float]),
            (base, "ggml_mul"): (T, [P, T, T]),
            (base, "ggml_silu"): (T, [P, T]),
            (base, "ggml_swiglu_split"): (T, [P, T, T]),
            (base, "ggml_geglu_split"): (T, [P, T, T]),
            (base, "ggml_new_graph"): (P, [P]),
            (base, "ggml_build_forward_expand"): (None, [P, T]),
            (cpu, "ggml_cpu_init"): (None, []),
            (cpu, "ggml_graph_compute_with_ctx"): (ctypes.c_int, [P, P, ctypes.c_int]),
        }
        for (lib, name), (res, args) in sigs.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                oracles.unavailable("ggml graph oracle", f"{name} not exported by {lib._name}")
            fn.restype, fn.argtypes = res, args
            setattr(self, name[5:], fn)
        self.cpu_init()

    def run(self, op: str, *inputs: np.ndarray, eps: float = 0.0) -> np.ndarray:
        """The output of one op on float32 [T, n] inputs (weight [n] for "ffn_norm")."""
        rows = [np.ascontiguousarray(a, np.float32) for a in inputs]
        need = sum(a.nbytes for a in rows) * 4 + (64 << 20)
        buf = ctypes.create_string_buffer(need)
        ctx = self.init(_InitParams(need, ctypes.cast(buf, ctypes.c_void_p), False))
        assert ctx, "ggml_init failed"
        try:
            ts = []
            for a in rows:
                t = (self.new_tensor_2d(ctx, GGML_TYPE_F32, a.shape[1], a.shape[0]) if a.ndim == 2
                     else self.new_tensor_1d(ctx, GGML_TYPE_F32, a.shape[0]))
                ctypes.memmove(self.get_data(t), a.ctypes.data, a.nbytes)
                ts.append(t)
            if op == "rms_norm":
                out = self.rms_norm(ctx, ts[0], eps)
            elif op == "ffn_norm":
                out = self.mul(ctx, self.rms_norm(ctx, ts[0], eps), ts[1])
            elif op == "silu":
                out = self.silu(ctx, ts[0])
            elif op == "swiglu":
                out = self.swiglu_split(ctx, ts[0], ts[1])
            elif op == "geglu":
                out = self.geglu_split(ctx, ts[0], ts[1])
            else:
                raise ValueError(op)
            graph = self.new_graph(ctx)
            self.build_forward_expand(graph, out)
            assert self.graph_compute_with_ctx(ctx, graph, 1) == 0, "ggml_graph_compute_with_ctx failed"
            res = np.empty_like(rows[0])
            ctypes.memmove(res.ctypes.data, self.get_data(out), res.nbytes)
            return res
        finally:
            self.free(ctx)


@pytest.fixture(scope="module")
def ggml():
    return GgmlGraph()


def _values(kind: str, T: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        v = rng.standard_normal((T, n)) * 3
    elif kind == "large":
        v = rng.standard_normal((T, n)) * 2.0 ** rng.uniform(5, 60, (T, n))
    elif kind == "small":
        v = rng.standard_normal((T, n)) * 2.0 ** rng.uniform(-140, -10, (T, n))
    elif kind == "negative":
        v = -np.abs(rng.standard_normal((T, n))) * 2.0 ** rng.uniform(-4, 8, (T, n))
    elif kind == "exp_edges":  # |x| around the vector exp's 126 / 192 switch points and overflow
        v = rng.choice([-1, 1], (T, n)) * rng.uniform(80.0, 140.0, (T, n))
    else:
        raise ValueError(kind)
    return np.clip(v, -3e38, 3e38).astype(np.float32)


KINDS = ("normal", "large", "small", "negative", "exp_edges")


def _engine(op, *a, eps=1e-6):
    return {"rms_norm": lambda: rms_norm_engine(a[0], eps), "ffn_norm": lambda: ffn_norm_engine(a[0], a[1], eps),
            "silu": lambda: silu_engine(a[0]), "swiglu": lambda: swiglu_engine(a[0], a[1]),
            "geglu": lambda: geglu_engine(a[0], a[1])}[op]()


def _inputs(op, kind, n, seed):
    x = _values(kind, 3, n, seed)
    if op == "ffn_norm":
        return x, (np.random.default_rng(seed + 1).standard_normal(n) * 0.5).astype(np.float32)
    if op in ("swiglu", "geglu"):
        return x, _values("normal", 3, n, seed + 1)
    return (x,)


# --- bit for bit against ggml -----------------------------------------------------------------

@pytest.mark.parametrize("op", ["rms_norm", "ffn_norm", "silu", "swiglu", "geglu"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", WIDTHS)
def test_bits_equal_ggml(ggml, op, kind, n):
    inputs = _inputs(op, kind, n, seed=n * 7 + KINDS.index(kind))
    eps = 1e-6
    oracles.assert_bits_equal(_engine(op, *inputs, eps=eps), ggml.run(op, *inputs, eps=eps), f"{op} {kind} n={n}")


SPECIALS = np.array([0.0, -0.0, 1e-45, -1e-45, 1.1754944e-38, -1.1754944e-38, 88.37, 88.38, 88.39, 88.72,
                     88.73, -88.37, -88.38, -88.39, -88.73, -87.33, -87.34, -103.97, -103.98, 103.98,
                     126.5, -126.5, 132.9, -132.9, 133.1, -133.1, 192.0, -192.0, 3e38, -3e38,
                     np.inf, -np.inf, np.nan, 1.0, -1.0, 20.0, -20.0, 1e-8], np.float32)


@pytest.mark.parametrize("shift", range(8))
def test_special_values_in_vector_and_tail(ggml, shift):
    """Every special value once in the 8-wide part and once in the scalar tail."""
    z = np.roll(np.tile(SPECIALS, 2), shift)[None, : 8 * (len(SPECIALS) // 8) + 5]
    oracles.assert_bits_equal(silu_engine(z), ggml.run("silu", z), "silu specials")
    u = np.full_like(z, 1.5)
    oracles.assert_bits_equal(swiglu_engine(z, u), ggml.run("swiglu", z, u), "swiglu specials")
    oracles.assert_bits_equal(geglu_engine(z, u), ggml.run("geglu", z, u), "geglu specials")
    fin = np.nan_to_num(z, posinf=1.0, neginf=-1.0, nan=2.0)
    for eps in (0.0, 1e-6, 1e-5):
        oracles.assert_bits_equal(rms_norm_engine(fin, eps), ggml.run("rms_norm", fin, eps=eps), f"rms eps={eps}")


@st.composite
def _rows(draw, max_n=40):
    T = draw(st.integers(1, 3))
    n = draw(st.integers(1, max_n))
    elems = st.floats(width=32, allow_nan=False, allow_infinity=False)
    a = draw(arrays(np.float32, (T, n), elements=elems))
    b = draw(arrays(np.float32, (T, n), elements=elems))
    return a, b


@settings(max_examples=150, deadline=None)
@given(_rows())
@example((np.array([[-88.5, 90.0, 1e-40, -0.0, 3.0, -3.0, 126.0, -126.0, 0.5]], np.float32),
          np.array([[1.0, -2.0, 3e38, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0]], np.float32)))
def test_hypothesis_bits_equal_ggml(ggml, ab):
    a, b = ab
    oracles.assert_bits_equal(silu_engine(a), ggml.run("silu", a), "silu")
    oracles.assert_bits_equal(swiglu_engine(a, b), ggml.run("swiglu", a, b), "swiglu")
    oracles.assert_bits_equal(geglu_engine(a, b), ggml.run("geglu", a, b), "geglu")
    oracles.assert_bits_equal(rms_norm_engine(a, 1e-6), ggml.run("rms_norm", a, eps=1e-6), "rms_norm")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(WIDTHS), st.sampled_from(KINDS))
def test_hypothesis_ffn_norm_bits(ggml, seed, n, kind):
    x, w = _inputs("ffn_norm", kind, n, seed)
    oracles.assert_bits_equal(ffn_norm_engine(x, w, 1e-6), ggml.run("ffn_norm", x, w, eps=1e-6), "ffn_norm")


# --- references within float32 error ---------------------------------------------------------

def _moderate(T, n, seed, lo, hi):
    rng = np.random.default_rng(seed)
    return (rng.choice([-1.0, 1.0], (T, n)) * 2.0 ** rng.uniform(lo, hi, (T, n))).astype(np.float32)


@pytest.mark.parametrize("n", WIDTHS)
def test_references_close(n):
    x = _moderate(4, n, n, -40, 40)
    got, ref = rms_norm_engine(x, 1e-6), rms_norm_ref(x, 1e-6)
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=0)
    w = _moderate(1, n, n + 1, -4, 2)[0]
    np.testing.assert_allclose(ffn_norm_engine(x, w, 1e-6), ffn_norm_ref(x, w, 1e-6), rtol=RTOL, atol=0)

    z = np.concatenate([_moderate(2, n, n + 2, -30, 7.5), _values("exp_edges", 2, n, n)])
    np.testing.assert_allclose(silu_engine(z), silu_ref(z), rtol=RTOL, atol=SILU_ATOL)
    g, u = _moderate(3, n, n + 3, -20, 7), _moderate(3, n, n + 4, -20, 20)
    np.testing.assert_allclose(swiglu_engine(g, u), swiglu_ref(g, u), rtol=RTOL, atol=SILU_ATOL * 2.0 ** 20)


def test_gelu_table_is_the_librarys():
    """Every entry of ggml-cpu's exported ggml_table_gelu_f16 (after ggml_cpu_init) equals ours."""
    cpu = oracles.ggml_library("ggml-cpu")
    cpu.ggml_cpu_init()
    try:
        lib = np.ctypeslib.as_array((ctypes.c_uint16 * (1 << 16)).in_dll(cpu, "ggml_table_gelu_f16")).copy()
    except ValueError:
        oracles.unavailable("gelu table", "ggml_table_gelu_f16 not exported by ggml-cpu")
    ours = gelu_table()
    nan = np.isnan(lib.view(np.float16))
    assert np.array_equal(nan, np.isnan(ours.view(np.float16)))
    assert np.array_equal(lib[~nan], ours[~nan]), f"{int(np.sum(lib[~nan] != ours[~nan]))} entries differ"


def test_geglu_reference_close():
    """Within fp16: fp16(g) moves g by <= 2^-11 |g| (gelu's slope is <= 1.13 in magnitude), the table
    entry is rounded to fp16 (<= 2^-11 of it, 2^-25 absolute among fp16 subnormals), the product with u
    one float32 rounding; below -10 the engine gives 0 where |gelu| < 1e-22."""
    rng = np.random.default_rng(5)
    g = (rng.standard_normal((4, 257)) * 4).astype(np.float32)
    u = (rng.standard_normal((4, 257)) * 3).astype(np.float32)
    got, ref = geglu_engine(g, u), geglu_ref(g, u)
    ga, ua = np.abs(g.astype(np.float64)), np.abs(u.astype(np.float64))
    moved = 1.13 * 2.0 ** -11 * ga
    tol = ua * (moved + 2.0 ** -11 * (np.abs(ref) / np.maximum(ua, 1e-300) + moved) + 2.0 ** -25) * 1.01
    tol += 2.0 ** -23 * np.abs(ref)
    assert np.all(np.abs(got - ref) <= tol)
    assert geglu_engine(np.float32([-10.0, -12.0, 10.0]), np.float32([3.0, 3.0, 3.0])).tolist() == [0.0, 0.0, 30.0]


def test_shapes_and_errors():
    x = _values("normal", 2, 13, 0)
    assert rms_norm_engine(x[0], 1e-6).shape == (13,)
    np.testing.assert_array_equal(silu_engine(x[1]), silu_engine(x)[1])
    with pytest.raises(ExacteditError):
        silu_engine(x.astype(np.float64))
    with pytest.raises(ExacteditError):
        swiglu_engine(x, x[:, :5])
    with pytest.raises(ExacteditError):
        rms_norm_engine(np.zeros((2, 0), np.float32), 1e-6)
    with pytest.raises(ExacteditError):
        ffn_norm_engine(x, np.ones(12, np.float32), 1e-6)
