"""ggml tensor formats, bit-exact with ggml: quantize, dequantize, and the engine's runtime view.

    quant.quantize(x, qtype) -> uint8 [rows, row_bytes]      x float32 [rows, cols] (1-D: one row)
    quant.dequantize(raw, qtype, cols) -> float32 [rows, cols]
    quant.row_bytes(qtype, cols) -> int;  quant.SUPPORTED
    quant.runtime_q8_0(x), quant.runtime_view(raw, qtype, cols)   (quant/runtime.py)

qtype is a ggml type name: "F32", "F16", "BF16", "Q8_0", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q4_K",
"Q5_K". The numba kernels (and numba itself) are imported on first use, so `import quant.gguf`
stays cheap. The fast paths use numba's current thread count (`numba.set_num_threads`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from exactedit import lazy_exports
from exactedit.errors import ExacteditError, QuantError

# imported on first use: `inspect`'s summary, `untie`
_lazy, __getattr__ = lazy_exports(__name__, {
    "render_summary": "model.arch",
    "render_untie": "model.untie",
    "summarize": "model.arch",
    "untie_gguf": "model.untie:untie",
})
__all__ = _lazy + ["CHUNK_ROWS", "SUPPORTED", "ExacteditError", "QuantError", "dequantize", "quantize",
                   "row_bytes", "runtime_q8_0", "runtime_view"]

SUPPORTED: tuple[str, ...] = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q4_K",
                              "Q5_K")

#: rows handed to a fast path at once; progress is reported after each chunk
CHUNK_ROWS = 8192

Progress = Callable[[int, int], None]


def row_bytes(qtype: str, cols: int) -> int:
    """Bytes of one row of `cols` values of type `qtype`."""
    from exactedit.quant import registry

    return registry.row_bytes(qtype, cols)


def _as_rows(x, qtype: str) -> np.ndarray:
    try:
        x = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise QuantError(f"x: expected a float array to quantize to {qtype}: {exc}") from None
    if x.dtype.kind not in "fiu":
        raise QuantError(f"x: expected real numbers to quantize to {qtype}, got dtype {x.dtype}")
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise QuantError(f"x: expected [rows, cols] (or one row), got shape {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    bad = ~np.isfinite(x)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise QuantError(f"x[{r}, {c}] = {x[r, c]}: expected finite values to quantize to "
                         f"{qtype} (after conversion to float32)")
    return x


def quantize(x, qtype: str, progress: Progress | None = None) -> np.ndarray:
    """float32 rows -> ggml bytes uint8 [rows, row_bytes], byte-identical to ggml's reference
    quantizers. Never modifies `x`; non-float32 input is converted to float32 first."""
    from exactedit.quant import registry

    fmt = registry.get(qtype)
    x = _as_rows(x, qtype)
    rows, cols = x.shape
    out = np.empty((rows, registry.row_bytes(qtype, cols)), np.uint8)
    for start in range(0, rows, CHUNK_ROWS):
        stop = min(rows, start + CHUNK_ROWS)
        fmt.quantize_into(x[start:stop], out[start:stop])
        if progress is not None:
            progress(stop, rows)
    return out


def dequantize(raw, qtype: str, cols: int, progress: Progress | None = None) -> np.ndarray:
    """ggml bytes uint8 [rows, row_bytes] (an array or a read-only memmap slice) -> float32
    [rows, cols]. Reads `raw` in place (a strided view is copied a chunk of rows at a time) and
    never writes it."""
    from exactedit.quant import registry

    fmt = registry.get(qtype)
    nbytes = registry.row_bytes(qtype, cols)
    if not isinstance(raw, np.ndarray):
        raw = np.frombuffer(memoryview(raw), np.uint8)
    raw = raw.view(np.ndarray) if type(raw) is not np.ndarray else raw  # memmap -> plain view
    if raw.dtype != np.uint8:
        raise QuantError(f"raw: expected uint8 bytes of {qtype} rows, got dtype {raw.dtype}")
    if raw.ndim == 1:
        if raw.shape[0] % nbytes:
            raise QuantError(f"raw: {raw.shape[0]} bytes is not a whole number of {qtype} rows "
                             f"of {cols} values ({nbytes} bytes each)")
        raw = raw.reshape(-1, nbytes)
    if raw.ndim != 2 or raw.shape[1] != nbytes:
        raise QuantError(f"raw: expected shape [rows, {nbytes}] for {qtype} rows of {cols} "
                         f"values, got {raw.shape}")
    rows = raw.shape[0]
    out = np.empty((rows, cols), np.float32)
    for start in range(0, rows, CHUNK_ROWS):
        stop = min(rows, start + CHUNK_ROWS)
        # the kernels take C-contiguous rows: a strided view is copied one chunk at a time
        fmt.dequantize_into(np.ascontiguousarray(raw[start:stop]), out[start:stop])
        if progress is not None:
            progress(stop, rows)
    return out


def runtime_q8_0(x) -> np.ndarray:
    """The engine's runtime view of a BF16 tensor: dequant(quant_q8_0(x)), x the bf16 values as
    float32 [rows, cols]."""
    from exactedit.quant.runtime import runtime_q8_0 as _impl

    return _impl(x)


def runtime_view(raw, qtype: str, cols: int) -> np.ndarray:
    """What the engine multiplies with for a stored tensor: BF16 -> its Q8_0 copy (dequantized),
    any other type -> its dequantized values."""
    from exactedit.quant.runtime import runtime_view as _impl

    return _impl(raw, qtype, cols)
