"""Engine-faithful Q4_K x Q8_K: numpy reference == numba fast path == ggml-cpu's own kernel, bit for
bit (tolerance 0: the same int32 lanes and min sums, the same float32 products, FMAs and adds in
the same order as the AVX2 `ggml_vec_dot_q4_K_q8_K`).

The oracle is the installed llama-cpp-python's libggml-cpu, reached the way the engine reaches it:
`ggml_get_type_traits_cpu(GGML_TYPE_Q4_K)` gives the vec_dot and its vec_dot_type (Q8_K), whose
traits give the activation quantizer `from_float`. The struct layout is that of ggml/include/ggml-cpu.h
(from_float, vec_dot, vec_dot_type, nrows) and is checked against the exported symbols."""
from __future__ import annotations

import ctypes

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactedit import quant
from exactedit.quant.dots import q4_k_dot as d4k
from exactedit.quant.formats import q8_k
from exactedit.quant.kquants import k_scale_min as ksm
from exactedit.quant.kquants import q4_k
from tests import oracles
from tests.strategies import float_rows, make_block

GGML_TYPE_Q4_K, GGML_TYPE_Q8_K = 12, 15
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

_VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class _TraitsCpu(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


class GgmlQ4K:
    """ggml-cpu's Q8_K quantizer and Q4_K x Q8_K vec_dot, from the CPU type traits."""

    def __init__(self, cpu: ctypes.CDLL):
        cpu.ggml_cpu_init()                                  # fp16 tables the kernels read
        cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TraitsCpu)
        self.cpu = cpu
        self.q4 = cpu.ggml_get_type_traits_cpu(GGML_TYPE_Q4_K).contents
        self.q8 = cpu.ggml_get_type_traits_cpu(GGML_TYPE_Q8_K).contents
        self.vec_dot = _VEC_DOT(self.q4.vec_dot)
        self.from_float = _FROM_FLOAT(self.q8.from_float)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        out = np.zeros((x.shape[0], x.shape[1] // q8_k.QK * q8_k.BLOCK_BYTES), np.uint8)
        for t in range(x.shape[0]):
            self.from_float(x[t].ctypes.data, out[t].ctypes.data, x.shape[1])
        return out

    def matmul(self, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
        cols = x.shape[1]
        xq = self.quantize(x)
        raw = np.ascontiguousarray(raw, np.uint8)
        out, s = np.empty((x.shape[0], raw.shape[0]), np.float32), np.zeros(1, np.float32)
        sp = s.ctypes.data
        rp = [raw[r].ctypes.data for r in range(raw.shape[0])]
        for t in range(x.shape[0]):
            xp = xq[t].ctypes.data
            for r, p in enumerate(rp):
                self.vec_dot(cols, sp, 0, p, 0, xp, 0, 1)
                out[t, r] = s[0]
        return out


@pytest.fixture(scope="module")
def ggml():
    return GgmlQ4K(oracles.ggml_library("ggml-cpu"))  # package or library missing: tests.oracles decides


# ---- inputs ------------------------------------------------------------------------------------

def _acts(kind: str, T: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((T, cols)) * rng.uniform(0.1, 30, (T, 1))).astype(np.float32)
    if kind == "edge":
        x[0, :256] = 0                                               # all-zero block: d_x = 0
        x[1] *= np.float32(1e30)                                     # large activations
        x[2, :256] = np.float32(3e38) * np.sign(x[2, :256])          # |x| near FLT_MAX, one-signed
        x[3] *= np.float32(1e-38)                                    # tiny, subnormal codes scale
        x[4, :256] = np.abs(x[4, :256])                              # one-signed: the largest bsums
        x[4, 7] = -x[4, :256].max()                                  # max negative: q = +127 runs
        kinds = ("ties", "outlier", "constant", "subnormal", "fp16_overflow", "tiny_huge")
        for i, k in enumerate(kinds[:max(0, T - 5)]):
            x[5 + i] = np.concatenate([make_block(k, 256, rng) for _ in range(cols // 256)])
    return x


def _header(raw: np.ndarray, d: int | None = None, dmin: int | None = None, scales=None) -> None:
    """Overwrite fp16 d / dmin bits and the 12 scale bytes of every block of raw (in place)."""
    blk = raw.view(q4_k.BLOCK)
    if d is not None:
        blk["d"] = np.uint16(d).view(np.float16)
    if dmin is not None:
        blk["dmin"] = np.uint16(dmin).view(np.float16)
    if scales is not None:
        blk["scales"] = scales


def _random_bytes(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Any bytes, fp16 d / dmin finite (exponent < 31): every code, scale and min pattern."""
    raw = rng.integers(0, 256, (rows, cols // 256 * q4_k.BLOCK_BYTES)).astype(np.uint8)
    blk = raw.view(q4_k.BLOCK)
    for f in ("d", "dmin"):
        bits = blk[f].view(np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= np.uint16(0xFBFF)         # inf / NaN -> finite
    return raw


def _weights(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "bytes":
        return _random_bytes(rows, cols, rng)
    w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    if kind == "plain":
        return quant.quantize(w, "Q4_K")
    w[0] = 0                                                         # all-zero blocks
    w[1, :256] = np.linspace(3.0, 3.5, 256)                          # a large positive min
    w[2] += 1e3                                                      # mins dominate
    raw = np.ascontiguousarray(quant.quantize(w, "Q4_K"))
    b = raw.reshape(rows, -1, q4_k.BLOCK_BYTES)
    _header(b[3], d=0x7BFF, dmin=0x7BFF, scales=np.full(12, 0xFF, np.uint8))  # 65504, sc = m = 63
    b[3, :, q4_k.OFF_QS:] = 0xFF                                     # every code 15
    _header(b[4], d=0x0001, dmin=0x8001)                             # subnormal fp16 scales, -dmin
    _header(b[5], d=0x8000, dmin=0x0000)                             # -0 / +0 scales
    _header(b[6], d=0xFBFF, dmin=0x7BFF)                             # -65504: extreme, mixed signs
    b[7] = _random_bytes(1, b.shape[1] * 256, rng).reshape(b[7].shape)
    return raw


# (name, weight kind, activation kind, rows, cols, T): Qwen2.5's n (1536) and FFN width (8960)
CASES = [("random-256", "plain", "plain", 320, 256, 200), ("random-1536", "plain", "plain", 256, 1536, 128),
         ("random-8960", "plain", "plain", 192, 8960, 64), ("edge-256", "edge", "edge", 64, 256, 11),
         ("edge-1536", "edge", "edge", 40, 1536, 11), ("bytes-1536", "bytes", "plain", 96, 1536, 16),
         ("bytes-edge-8960", "bytes", "edge", 24, 8960, 11)]


# ---- the oracle's own shape --------------------------------------------------------------------

def test_type_ids_and_traits_layout(ggml):
    """Enum values agree with gguf-py and libggml-base; the CPU traits struct reads as ggml-cpu.h
    declares it (its pointers are the exported kernel and quantizer)."""
    assert gguf.GGMLQuantizationType.Q4_K.value == GGML_TYPE_Q4_K
    assert gguf.GGMLQuantizationType.Q8_K.value == GGML_TYPE_Q8_K
    base = oracles.load().lib
    for tid, name, block in ((GGML_TYPE_Q4_K, b"q4_K", q4_k.BLOCK_BYTES),
                             (GGML_TYPE_Q8_K, b"q8_K", q8_k.BLOCK_BYTES)):
        tr = base.ggml_get_type_traits(tid).contents
        assert (tr.type_name, tr.blck_size, tr.type_size) == (name, 256, block)
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    assert ggml.q4.vec_dot == addr(ggml.cpu.ggml_vec_dot_q4_K_q8_K)
    assert (ggml.q4.vec_dot_type, ggml.q4.nrows) == (GGML_TYPE_Q8_K, 1)
    assert ggml.q8.from_float == addr(ggml.cpu.quantize_row_q8_K)


def test_utmp_unpacking_is_get_scale_min_k4():
    sc12 = np.random.default_rng(0).integers(0, 256, (4096, 12)).astype(np.uint8)
    sc12[0], sc12[1] = 0x00, 0xFF
    got, want = d4k.scales_mins_ref(sc12), ksm.unpack_scales_ref(sc12)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


# ---- reference == fast path == ggml --------------------------------------------------------------

def _inf_iscale(x: np.ndarray) -> np.ndarray:
    """[T, nb] bool: blocks whose 127 / amax overflows float32 (0 < amax < ~3.7e-37), where ggml's
    `nearest_int(+-inf)` gives 0 codes."""
    amax = np.abs(x.reshape(x.shape[0], -1, q8_k.QK)).max(-1)
    with np.errstate(divide="ignore", over="ignore"):
        return (amax > 0) & np.isinf(np.float32(127) / amax)


def _check(ggml, raw: np.ndarray, x: np.ndarray, what: str) -> None:
    want_q = ggml.quantize(x)
    for how, xq in (("reference", q8_k.quantize_ref(x)), ("fast", q8_k.quantize(x))):
        got = xq.view(np.uint8).reshape(x.shape[0], -1)
        oracles.assert_bytes_equal(got, want_q, q8_k.BLOCK_BYTES, f"{what}: Q8_K {how} vs ggml")
    with np.errstate(over="ignore", invalid="ignore"):
        want = ggml.matmul(raw, x)
        ref = d4k.q4_k_matmul_ref(raw, x)
    fast = d4k.q4_k_matmul(raw, x)
    oracles.assert_bits_equal(fast, ref, f"{what}: fast vs reference")
    oracles.assert_bits_equal(ref, want, f"{what}: reference vs ggml")


@pytest.mark.parametrize("name,wk,xk,rows,cols,T", CASES, ids=[c[0] for c in CASES])
def test_matmul_reference_fast_and_ggml(ggml, name, wk, xk, rows, cols, T):
    _check(ggml, _weights(wk, rows, cols, 2), _acts(xk, T, cols, 3), name)


@SETTINGS
@given(data=st.data())
@example(data=None)
def test_hypothesis_rows_match_ggml(ggml, data):
    """Weights quantized from the project's corner rows (zero, ties, subnormal, fp16 over- and
    underflow, ...), activations from the same kinds: three-way equal."""
    if data is None:                                                 # the all-zero row, explicitly
        w, x = np.zeros((2, 512), np.float32), _acts("plain", 3, 512, 0)
    else:
        w = data.draw(float_rows(256, max_rows=4, max_blocks=3), label="w")
        x = data.draw(float_rows(256, max_rows=3, max_blocks=1), label="x")
        x = np.tile(x, (1, w.shape[1] // 256))
    with np.errstate(all="ignore"):
        raw = np.ascontiguousarray(quant.quantize(w, "Q4_K"))
    _check(ggml, raw, x, "hypothesis")


def test_q8_k_tiny_block_codes_match_ggml(ggml):
    """A block whose largest value is below ~3.7e-37: -127/max overflows to -inf, and ggml's
    nearest_int writes code 0 (the low byte of -2^22), not 127; reference and fast path alike."""
    x = np.full((1, 256), 1e-38, np.float32)
    x[0, ::3] = -2e-38
    assert _inf_iscale(x).all()
    ours = q8_k.quantize_ref(x).view(np.uint8).reshape(1, -1)
    oracles.assert_bytes_equal(ours, ggml.quantize(x), q8_k.BLOCK_BYTES, "Q8_K, iscale = inf")
    fast = q8_k.quantize(x).view(np.uint8).reshape(1, -1)
    oracles.assert_bytes_equal(fast, ggml.quantize(x), q8_k.BLOCK_BYTES, "Q8_K fast path, iscale = inf")


# ---- reference == fast path, no oracle needed ----------------------------------------------------

@pytest.mark.parametrize("wk,xk,cols", [("plain", "plain", 768), ("edge", "edge", 512), ("bytes", "edge", 2560)])
def test_reference_vs_fast_bits(wk, xk, cols):
    """Tolerance 0: both compute the same int32 sums and the same float32 FMA / add sequence."""
    raw, x = _weights(wk, 24, cols, 5), _acts(xk, 11, cols, 6)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = d4k.q4_k_matmul_ref(raw, x, chunk=7)
    oracles.assert_bits_equal(d4k.q4_k_matmul(raw, x), ref, "fast vs reference")


def test_bad_inputs_are_refused():
    raw = _weights("plain", 2, 256, 0)
    with pytest.raises(quant.QuantError, match="Q4_K weights"):
        d4k.q4_k_matmul(raw[:, :-1], np.zeros((1, 256), np.float32))
    with pytest.raises(quant.QuantError, match="activations"):
        d4k.q4_k_matmul(raw, np.zeros((1, 128), np.float32))
    with pytest.raises(quant.QuantError, match="Q4_K weights"):
        d4k.q4_k_matmul_ref(raw, np.zeros((1, 512), np.float32))
    with pytest.raises(quant.QuantError, match="non-finite"):
        d4k.q4_k_matmul(raw, np.full((1, 256), np.nan, np.float32))
