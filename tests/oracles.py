"""ggml's own C code as the oracle for the format tests, and the one place that decides what a
missing oracle or live extra means.

The ctypes binding itself is `bench.quant.GgmlC` (one binding, shared with `exactedit bench
quant`): libggml-base from the installed llama-cpp-python package, with `ggml_quantize_chunk`
(quantize, reference quantizers, no importance matrix), the type traits' `to_float` (dequantize)
and ggml's fp16 / bf16 row conversions. This module gives the tests fixture-friendly loaders, the
conversions as numpy functions, and byte comparisons that name the first bad block.

Missing pieces (`unavailable`): every oracle and live test asks through `load`, `ggml_library`,
`llama_cpp` or `live_model`, never through its own `pytest.skip` / `importorskip`. Package
missing, library missing or a library that does not load all end the same way with the same
message: a skip that says why, or, under EXACTEDIT_REQUIRE_ORACLES=1 (which `.ci/run` sets), a
failure, so CI cannot pass with the central claim untested.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import NoReturn

import numpy as np
import pytest

from exactedit.bench.quant import GgmlC, GgmlUnavailable, find_libggml_base

REQUIRE_ENV = "EXACTEDIT_REQUIRE_ORACLES"


def required() -> bool:
    """True under EXACTEDIT_REQUIRE_ORACLES=1 (CI): a missing oracle or live extra fails."""
    return os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0")


def unavailable(what: str, why: str) -> NoReturn:
    """Skip with the reason, or fail with the same reason when the oracles are required."""
    message = f"{what} unavailable (it ships with the `live` extra: pip install -e '.[live]'): {why}"
    if required():
        pytest.fail(f"{message} [{REQUIRE_ENV}=1: a missing oracle or live extra is a failure]", pytrace=False)
    pytest.skip(message)


def load() -> GgmlC:
    """The ggml oracle (libggml-base through ctypes)."""
    try:
        return GgmlC()
    except GgmlUnavailable as exc:
        unavailable("ggml oracle", str(exc))


def ggml_library(name: str) -> ctypes.CDLL:
    """Another library of llama_cpp/lib (e.g. "ggml-cpu"), loaded after libggml-base (globally, as
    ggml's own loader does, so that its symbols resolve)."""
    base = load().path
    path = base.with_name(base.name.replace("ggml-base", name))
    if not path.is_file():
        unavailable("ggml oracle", f"{path}: not found; expected {name} beside {base.name}")
    try:
        ctypes.CDLL(str(base), mode=ctypes.RTLD_GLOBAL)
        return ctypes.CDLL(str(path))
    except OSError as exc:
        unavailable("ggml oracle", f"{path}: cannot be loaded: {exc}")


def llama_cpp():
    """The llama-cpp-python package (the live engine), with its libraries present."""
    try:
        find_libggml_base()
        import llama_cpp as module
    except GgmlUnavailable as exc:
        unavailable("llama.cpp engine", str(exc))
    except (ImportError, OSError) as exc:
        unavailable("llama.cpp engine", f"llama_cpp cannot be imported: {exc}")
    return module


def live_model(name: str) -> Path:
    """A public model of the live extra (e.g. "qwen", "gemma"), assembled, with its engine."""
    from exactedit.native.llamacpp import models

    llama_cpp()
    if not models.installed(name):
        pkgs = models.MODELS[name].packages
        listed = pkgs[0] if len(pkgs) == 1 else f"{pkgs[0]} ... {pkgs[-1]}, {len(pkgs)} packages"
        unavailable(f"the {name} model", f"{models.MODELS[name].about}: {listed} not installed")
    return models.locate(name)


def fp32_to_fp16_bits(c: GgmlC, x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_fp16_row: uint16 bits."""
    return c.convert_row("ggml_fp32_to_fp16_row", np.asarray(x, np.float32), np.uint16)


def fp16_bits_to_fp32(c: GgmlC, h: np.ndarray) -> np.ndarray:
    """ggml_fp16_to_fp32_row: float32 values."""
    return c.convert_row("ggml_fp16_to_fp32_row", np.asarray(h, np.uint16), np.float32)


def fp32_to_bf16_bits(c: GgmlC, x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_bf16_row_ref: uint16 bits."""
    return c.convert_row("ggml_fp32_to_bf16_row_ref", np.asarray(x, np.float32), np.uint16)


def first_bad_block(got: np.ndarray, want: np.ndarray, block_bytes: int) -> str | None:
    """None if the byte arrays [rows, row_bytes] are equal, else where and how they differ."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype} vs {want.shape} {want.dtype}"
    bad = (got != want).reshape(got.shape[0], -1, block_bytes).any(axis=2)
    if not bad.any():
        return None
    r, b = (int(i) for i in np.argwhere(bad)[0])
    sl = slice(b * block_bytes, (b + 1) * block_bytes)
    return (f"{int(bad.sum())} bad blocks; first: row {r} block {b}:\n"
            f"  got  {got[r, sl].tobytes().hex()}\n  want {want[r, sl].tobytes().hex()}")


def assert_bytes_equal(got: np.ndarray, want: np.ndarray, block_bytes: int, what: str = "") -> None:
    msg = first_bad_block(got, want, block_bytes)
    assert msg is None, f"{what}: {msg}"


def assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """float32 arrays equal bit for bit (NaNs included); names the first difference."""
    g = np.ascontiguousarray(got, np.float32).view(np.uint32)
    w = np.ascontiguousarray(want, np.float32).view(np.uint32)
    assert g.shape == w.shape, f"{what}: shape {g.shape} vs {w.shape}"
    bad = np.argwhere(g != w)
    assert len(bad) == 0, (f"{what}: {len(bad)} values differ; first at {tuple(bad[0])}: "
                           f"{got[tuple(bad[0])]!r} vs {want[tuple(bad[0])]!r}")
