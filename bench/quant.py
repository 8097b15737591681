"""`exactedit bench quant`: our numba quantize/dequantize against ggml's C, in the same run.

ggml's C is the reference code in llama-cpp-python's `llama_cpp/lib/libggml-base` (found through
the installed package, loaded lazily): `ggml_quantize_chunk` to quantize, the type traits'
`to_float` to dequantize. `GgmlC` below is the one ctypes binding of it in the project; the
oracle tests use it through tests/oracles.py. Both sides run on the same rows, into preallocated
outputs, at the same thread count (numba.set_num_threads for ours; the rows split into that many
contiguous chunks, one Python thread each, for the C, which releases the GIL). Each timing is the
best of `repeats` rounds in which ours and ggml's alternate. Results are rows per second and the
ratio ours / ggml.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from exactedit.errors import ExacteditError, QuantError

#: ours / ggml time targets (docs/performance.md), at equal thread counts
TARGETS = {"quantize": 0.8, "dequantize": 1.0}
#: the quantized formats `bench quant` measures (every one in quant.registry except the floats)
BENCHED = ("Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K")


class GgmlUnavailable(ExacteditError):
    """ggml's C library (from the llama-cpp-python package) cannot be found or loaded."""


# ---- the ctypes binding -----------------------------------------------------------------------

class _TypeTraits(ctypes.Structure):
    """ggml.h `struct ggml_type_traits` (the fields up to from_float_ref)."""

    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


_ROW_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def find_libggml_base() -> Path:
    """Path of libggml-base inside the installed llama_cpp package (not imported)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise GgmlUnavailable("llama_cpp: the llama-cpp-python package is not installed; it holds "
                              "ggml's C reference code (pip install -e '.[live]')")
    libdir = Path(spec.origin).parent / "lib"
    names = {"linux": "libggml-base.so", "darwin": "libggml-base.dylib", "win32": "ggml-base.dll"}
    path = libdir / names.get(sys.platform, "libggml-base.so")
    if not path.exists():
        raise GgmlUnavailable(f"{path}: not found; expected ggml's base library in llama_cpp/lib")
    return path


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


class GgmlC:
    """ggml's C reference quantizers and dequantizers, called through ctypes."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else find_libggml_base()
        try:
            lib = ctypes.CDLL(str(self.path))
        except OSError as exc:
            raise GgmlUnavailable(f"{self.path}: cannot be loaded: {exc}") from None
        lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                            ctypes.c_void_p]
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
        for name in ("ggml_fp32_to_fp16_row", "ggml_fp16_to_fp32_row", "ggml_fp32_to_bf16_row_ref",
                     "ggml_bf16_to_fp32_row"):
            getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            getattr(lib, name).restype = None
        self.lib = lib

    def type_id(self, qtype: str) -> int:
        """ggml's enum value for a type name, checked against gguf-py's block layout."""
        try:
            qt = gguf.GGMLQuantizationType[qtype]
        except KeyError:
            raise QuantError(f"qtype {qtype!r}: not a ggml type name") from None
        traits = self.lib.ggml_get_type_traits(qt.value).contents
        if (traits.blck_size, traits.type_size) != gguf.GGML_QUANT_SIZES[qt]:
            raise GgmlUnavailable(f"{self.path}: type {qtype} has block ({traits.blck_size}, "
                                  f"{traits.type_size}), gguf-py says {gguf.GGML_QUANT_SIZES[qt]}")
        return qt.value

    def row_bytes(self, qtype: str, cols: int) -> int:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
        return cols // block * size

    def quantize_into(self, x: np.ndarray, qtype: str, out: np.ndarray) -> None:
        """ggml_quantize_chunk(type, x, out, 0, rows, cols, NULL): x float32 C-contiguous."""
        rows, cols = x.shape
        assert x.dtype == np.float32 and x.flags.c_contiguous and out.flags.c_contiguous
        assert out.shape == (rows, self.row_bytes(qtype, cols)) and out.dtype == np.uint8
        self.lib.ggml_quantize_chunk(self.type_id(qtype), _ptr(x), _ptr(out), 0, rows, cols, None)

    def dequantize_into(self, raw: np.ndarray, qtype: str, out: np.ndarray) -> None:
        """The type traits' to_float over all rows of raw (C-contiguous) into out float32."""
        rows, cols = out.shape
        assert raw.flags.c_contiguous and out.flags.c_contiguous and out.dtype == np.float32
        assert raw.shape == (rows, self.row_bytes(qtype, cols))
        traits = self.lib.ggml_get_type_traits(self.type_id(qtype)).contents
        if traits.to_float:
            _ROW_FN(traits.to_float)(_ptr(raw), _ptr(out), rows * cols)
        elif qtype == "F32":  # ggml has no conversion for F32: the bytes are the values
            ctypes.memmove(_ptr(out), _ptr(raw), out.nbytes)
        else:
            raise GgmlUnavailable(f"{self.path}: type {qtype} has no to_float")

    def quantize(self, x: np.ndarray, qtype: str) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((x.shape[0], self.row_bytes(qtype, x.shape[1])), np.uint8)
        self.quantize_into(x, qtype, out)
        return out

    def dequantize(self, raw: np.ndarray, qtype: str, cols: int) -> np.ndarray:
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        out = np.empty((raw.shape[0], cols), np.float32)
        self.dequantize_into(raw, qtype, out)
        return out

    def convert_row(self, name: str, src: np.ndarray, dst_dtype) -> np.ndarray:
        """One of ggml's row conversions (ggml_fp32_to_fp16_row, ...) over a flat array."""
        src = np.ascontiguousarray(src).reshape(-1)
        dst = np.empty(src.shape[0], dst_dtype)
        getattr(self.lib, name)(_ptr(src), _ptr(dst), src.shape[0])
        return dst


# ---- the benchmark ----------------------------------------------------------------------------

@dataclass(frozen=True)
class QuantBenchConfig:
    """What `exactedit bench quant` measures."""

    rows: int = 4096
    cols: int = 2560
    threads: int = 1
    repeats: int = 3
    seed: int = 0
    qtypes: tuple[str, ...] = BENCHED

    def __post_init__(self):
        import numba

        for name in ("rows", "cols", "threads", "repeats"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise QuantError(f"{name} {value!r}: expected a positive integer")
        if self.threads > numba.config.NUMBA_NUM_THREADS:
            raise QuantError(f"threads {self.threads}: numba was started with at most "
                             f"{numba.config.NUMBA_NUM_THREADS} (NUMBA_NUM_THREADS)")
        if not self.qtypes:
            raise QuantError("qtypes: expected at least one type to benchmark")
        for qtype in self.qtypes:
            if qtype not in BENCHED:
                raise QuantError(f"qtypes: {qtype!r} is not benchmarked; expected one of "
                                 f"{', '.join(BENCHED)}")
            block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][0]
            if self.cols % block:
                raise QuantError(f"cols {self.cols}: a {qtype} row must be a multiple of {block}")


@dataclass(frozen=True)
class QuantBenchRow:
    """One measurement: our fast path and ggml's C on the same rows, same thread count."""

    qtype: str
    op: str                 # "quantize" | "dequantize"
    ours_rows_per_s: float
    ggml_rows_per_s: float
    ratio: float            # ours / ggml
    target: float           # the target ratio (TARGETS)
    meets_target: bool
    identical: bool         # our output equals ggml's, bit for bit


@dataclass(frozen=True)
class QuantBenchResult:
    config: QuantBenchConfig
    rows: tuple[QuantBenchRow, ...]
    ggml_library: str
    ggml_library_sha256: str
    numba_version: str
    cpu_count: int | None

    def to_dict(self) -> dict:
        return {"bench": "quant", "config": asdict(self.config),
                "results": [asdict(r) for r in self.rows], "ggml_library": self.ggml_library,
                "ggml_library_sha256": self.ggml_library_sha256,
                "numba_version": self.numba_version, "cpu_count": self.cpu_count}


def _best_interleaved(a: Callable[[], None], b: Callable[[], None], repeats: int):
    """Best wall time of each of a and b over `repeats` rounds, a and b alternating, so that
    both see the same machine load."""
    best_a = best_b = float("inf")
    for _ in range(repeats):
        for fn, is_a in ((a, True), (b, False)):
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if is_a:
                best_a = min(best_a, dt)
            else:
                best_b = min(best_b, dt)
    return best_a, best_b


def _split(rows: int, parts: int) -> list[slice]:
    edges = np.linspace(0, rows, parts + 1).astype(int)
    return [slice(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def _in_threads(pool: ThreadPoolExecutor | None, chunks: list[slice], fn) -> None:
    if pool is None:
        for sl in chunks:
            fn(sl)
    else:
        list(pool.map(fn, chunks))


def run_quant_bench(config: QuantBenchConfig, progress: Callable[[int, int], None] | None = None,
                    ggml: GgmlC | None = None) -> QuantBenchResult:
    """Throughput (rows/s) of our quantize/dequantize fast paths and ggml's C, and the ratio."""
    import numba

    from exactedit.quant import registry

    ggml = ggml if ggml is not None else GgmlC()
    rng = np.random.default_rng(config.seed)
    x = (rng.standard_normal((config.rows, config.cols)) * 0.02).astype(np.float32)
    chunks = _split(config.rows, config.threads)
    total, done = 4 * len(config.qtypes), 0
    results = []
    previous_threads = numba.get_num_threads()
    numba.set_num_threads(config.threads)
    pool = ThreadPoolExecutor(config.threads) if config.threads > 1 else None
    try:
        for qtype in config.qtypes:
            fmt = registry.get(qtype)
            nbytes = registry.row_bytes(qtype, config.cols)
            ours_raw = np.empty((config.rows, nbytes), np.uint8)
            c_raw = np.empty_like(ours_raw)
            ours_y = np.empty_like(x)
            c_y = np.empty_like(x)
            for a in (ours_raw, c_raw, ours_y, c_y):
                a.fill(0)  # touch every page now, not inside a timing
            fmt.quantize_into(x[:1], ours_raw[:1])  # compile (or load) the kernels first
            fmt.dequantize_into(ours_raw[:1], ours_y[:1])
            timings = {}
            for op, ours, theirs in (
                    ("quantize", lambda: fmt.quantize_into(x, ours_raw),
                     lambda: _in_threads(pool, chunks, lambda sl: ggml.quantize_into(
                         x[sl], qtype, c_raw[sl]))),
                    ("dequantize", lambda: fmt.dequantize_into(c_raw, ours_y),
                     lambda: _in_threads(pool, chunks, lambda sl: ggml.dequantize_into(
                         c_raw[sl], qtype, c_y[sl])))):
                timings[op, "ours"], timings[op, "ggml"] = _best_interleaved(ours, theirs,
                                                                              config.repeats)
                done += 2
                if progress is not None:
                    progress(done, total)
            identical = {"quantize": bool(np.array_equal(ours_raw, c_raw)),
                         "dequantize": bool(np.array_equal(ours_y.view(np.uint32),
                                                           c_y.view(np.uint32)))}
            for op in ("quantize", "dequantize"):
                ours_rate = config.rows / timings[op, "ours"]
                ggml_rate = config.rows / timings[op, "ggml"]
                ratio = ours_rate / ggml_rate
                results.append(QuantBenchRow(qtype, op, ours_rate, ggml_rate, ratio, TARGETS[op],
                                             ratio >= TARGETS[op], identical[op]))
    finally:
        numba.set_num_threads(previous_threads)
        if pool is not None:
            pool.shutdown()
    lib_sha = hashlib.sha256(ggml.path.read_bytes()).hexdigest()
    return QuantBenchResult(config, tuple(results), str(ggml.path), lib_sha, numba.__version__,
                            os.cpu_count())


def format_table(result: QuantBenchResult) -> str:
    """The result as a plain-text table."""
    c = result.config
    lines = [f"rows {c.rows} x cols {c.cols}, threads {c.threads}, best of {c.repeats}",
             f"{'type':<6}{'op':<12}{'ours rows/s':>14}{'ggml rows/s':>14}{'ratio':>8}"
             f"{'target':>8}  {'identical':<9}"]
    for r in result.rows:
        mark = "ok" if r.meets_target else "BELOW"
        lines.append(f"{r.qtype:<6}{r.op:<12}{r.ours_rows_per_s:>14,.0f}{r.ggml_rows_per_s:>14,.0f}"
                     f"{r.ratio:>7.2f}x{r.target:>7.1f}x  {str(r.identical):<9} {mark}")
    return "\n".join(lines)
