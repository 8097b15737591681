"""The production engine's file contract (native/verify/strata.py runs the command):

Tokens file: little-endian int32 token ids, one after another, no header (4 * T bytes); a regular
file of at most MAX_TOKENS ids (a FIFO or a device is refused by name, not waited on or read whole).
Logits file: little-endian float32, one full-vocabulary row per position, row-major, no header
(4 * T * V bytes); row t holds the logits after reading tokens 0..t (it predicts token t + 1).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from exactedit.errors import FieldError
from exactedit.files import atomic_write_bytes, read_regular

# Ids in a tokens file, at most: every position is evaluated in one context with its full-vocabulary
# logits kept (float32 [T, V]: 2^20 positions of a 150k vocabulary are 600 GB), far past any n_ctx
# the engine runs; a longer file is refused by its size before a byte is read (4 MiB).
MAX_TOKENS = 1 << 20


class StrataError(FieldError):
    """A tokens/logits file or an engine command does not follow the contract."""


def write_tokens(path, tokens) -> Path:
    path = Path(path)
    toks = np.asarray(tokens)
    if toks.ndim != 1 or toks.size == 0 or not np.issubdtype(toks.dtype, np.integer) or toks.min() < 0 \
            or toks.max() > np.iinfo(np.int32).max:
        raise StrataError(path, "tokens", "expected a non-empty 1-D array of non-negative int32 ids")
    if toks.size > MAX_TOKENS:                      # `read_tokens` would refuse it: not written
        raise StrataError(path, "tokens", f"{toks.size} ids, over the limit of {MAX_TOKENS} a tokens file is read with")
    atomic_write_bytes(path, toks.astype("<i4").tobytes())
    return path


def read_tokens(path, vocab: int | None = None, field: str = "tokens file") -> np.ndarray:
    """The ids of a tokens file (a regular file of at most MAX_TOKENS ids), each in [0, vocab);
    else StrataError naming the file and `field` (the flag that gave it)."""
    path = Path(path)
    data = read_regular(path, 4 * MAX_TOKENS, StrataError, field)
    if not data or len(data) % 4:
        raise StrataError(path, field, f"{len(data)} bytes; expected a non-empty multiple of 4 "
                          "(little-endian int32 ids)")
    toks = np.frombuffer(data, "<i4").astype(np.int32)
    check_ids(path, toks, vocab, field)
    return toks


def check_ids(path, toks: np.ndarray, vocab: int | None, field: str = "tokens file") -> None:
    """Every id of `toks` (read from `path`) in [0, vocab) (vocab None: non-negative), else StrataError."""
    bad = np.flatnonzero((toks < 0) | ((toks >= vocab) if vocab is not None else False))
    if bad.size:
        raise StrataError(path, field, f"id {int(toks[bad[0]])} at position {int(bad[0])} "
                          f"is outside [0, {vocab if vocab is not None else 'inf'})")


def write_logits(path, logits) -> Path:
    path = Path(path)
    arr = np.asarray(logits)
    if arr.ndim != 2 or arr.dtype != np.float32:
        raise StrataError(path, "logits", f"expected float32 [T, V], got {arr.dtype} {arr.shape}")
    atomic_write_bytes(path, arr.astype("<f4").tobytes())
    return path


def read_logits(path, rows: int, vocab: int) -> np.ndarray:
    """float32 [rows, vocab], checked against the file's size (memory-mapped, read-only)."""
    path = Path(path)
    if not path.is_file():
        raise StrataError(path, "logits file", "was not written")
    size, want = path.stat().st_size, 4 * rows * vocab
    if size != want:
        raise StrataError(path, "logits file", f"{size} bytes; expected {want} = 4 * {rows} positions "
                          f"* {vocab} vocabulary (float32, one row per position)")
    arr = np.memmap(path, dtype="<f4", mode="r", shape=(rows, vocab))
    if not np.isfinite(arr).all():
        raise StrataError(path, "logits file", "holds non-finite values")
    return arr
