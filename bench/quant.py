"""`exactedit bench quant`: our numba quantize/dequantize against ggml's C, in the same run.

ggml's C is the reference code in llama-cpp-python's `llama_cpp/lib/libggml-base` (found through
the installed package, loaded lazily): `ggml_quantize_chunk` to quantize, the type traits'
`to_float` to dequantize. `GgmlC` below is the one ctypes binding of it in the project; the
oracle tests use it through tests/oracles.py. Both sides run on the same rows, into preallocated
outputs, at the same thread count (numba.set_num_threads for ours; the rows split into that many
contiguous chunks, one Python thread each, for the C, which releases the GIL). Each timing is the
best of `repeats`. Results are rows per second and the ratio ours / ggml.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from quant.errors import ExacteditError, QuantError

#: ours / ggml targets of issue 2, at equal thread counts
TARGETS = {"quantize": 0.8, "dequantize": 1.0}


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
