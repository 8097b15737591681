"""Row patch files for one tensor (SPEC.md section 3): the edited rows' ids and quantized bytes.

Format, little-endian: uint32 count, then per row a uint32 row id followed by the row's bytes
(2,100 bytes for a Q6_K row of 2560). The file does not store the row width: a reader derives it
from the file size and checks it against `row_bytes` when the caller knows it.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exactedit.errors import FieldError
from exactedit.files import fsync_dir, open_regular


class RowPatchError(FieldError):
    """A row patch file or a row patch request is malformed."""


@dataclass(frozen=True)
class RowPatch:
    """Row ids (uint32 [k], distinct) and their raw bytes (uint8 [k, row_bytes])."""

    row_ids: np.ndarray
    raw: np.ndarray

    def __post_init__(self):
        ids, raw = np.asarray(self.row_ids), np.asarray(self.raw)
        if ids.ndim != 1 or raw.ndim != 2 or raw.dtype != np.uint8 or len(ids) != len(raw):
            raise RowPatchError("<row patch>", "rows", f"needs row_ids [k] and uint8 raw [k, row_bytes], "
                                f"got {ids.shape} and {raw.dtype} {raw.shape}")
        if len(ids) and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() > 0xFFFFFFFF):
            raise RowPatchError("<row patch>", "row_ids", "must be integers in [0, 2**32)")
        if len(np.unique(ids)) != len(ids):
            raise RowPatchError("<row patch>", "row_ids", "must be distinct")
        ids = ids.astype(np.uint32)
        ids.flags.writeable = False
        raw = raw.copy()
        raw.flags.writeable = False
        object.__setattr__(self, "row_ids", ids)
        object.__setattr__(self, "raw", raw)

    @property
    def row_bytes(self) -> int:
        return self.raw.shape[1]


def write_row_patch(path, row_ids, raw_rows, *, overwrite: bool = False) -> Path:
    """Writes a patch file (via path + ".tmp", fsync, rename); returns its path."""
    patch = RowPatch(row_ids, raw_rows)
    path = Path(path)
    if path.exists() and not overwrite:
        raise RowPatchError(path, "output", "exists; pass overwrite=True to replace it")
    k, rb = patch.raw.shape
    body = np.empty((k, 4 + rb), np.uint8)
    body[:, :4] = patch.row_ids.astype("<u4").view(np.uint8).reshape(k, 4)
    body[:, 4:] = patch.raw
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<I", k))
            fh.write(body.tobytes())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(Path(path).parent)
    return path


def read_row_patch(path, row_bytes: int | None = None) -> RowPatch:
    """Reads and validates a patch file; `row_bytes`, when given, must match the file."""
    path = Path(path)
    if not path.is_file():
        raise RowPatchError(path, "file", "does not exist or is not a regular file")
    with open_regular(path, None, RowPatchError, "file") as fh:       # a file swapped for a FIFO: refused
        data = fh.read()
    return parse_row_patch(data, path, row_bytes)


def parse_row_patch(data: bytes, path, row_bytes: int | None = None) -> RowPatch:
    """A patch file's bytes (read by the caller, bounded as it knows), validated as `read_row_patch`
    does; errors name `path`."""
    if len(data) < 4:
        raise RowPatchError(path, "count", f"file has {len(data)} bytes, the count needs 4", 0)
    (k,) = struct.unpack_from("<I", data, 0)
    left = len(data) - 4
    if k == 0:
        if left:
            raise RowPatchError(path, "count", f"is 0 but {left} bytes follow", 0)
        return RowPatch(np.zeros(0, np.uint32), np.zeros((0, row_bytes or 0), np.uint8))
    if left % k or left // k <= 4:
        raise RowPatchError(path, "count", f"{k} rows do not divide the {left} bytes left into "
                            "(uint32 id + row bytes) records", 0)
    rb = left // k - 4
    if row_bytes is not None and rb != row_bytes:
        raise RowPatchError(path, "rows", f"{k} rows of {rb} bytes, expected {row_bytes}-byte rows "
                            f"({4 + k * (4 + row_bytes)} bytes in all, file has {len(data)})", 4)
    body = np.frombuffer(data, np.uint8, offset=4).reshape(k, 4 + rb)
    ids = body[:, :4].copy().view("<u4").ravel()
    if len(np.unique(ids)) != k:
        raise RowPatchError(path, "row ids", "repeat a row", 4)
    return RowPatch(ids, body[:, 4:])


def apply_row_patch(raw_tensor: np.ndarray, patch: RowPatch) -> np.ndarray:
    """A copy of raw_tensor (uint8 [rows, row_bytes]) with the patch's rows replaced."""
    raw_tensor = np.asarray(raw_tensor)
    if raw_tensor.dtype != np.uint8 or raw_tensor.ndim != 2:
        raise RowPatchError("<tensor>", "raw", f"needs uint8 [rows, row_bytes], got "
                            f"{raw_tensor.dtype} {raw_tensor.shape}")
    rows, rb = raw_tensor.shape
    if not len(patch.row_ids):
        return raw_tensor.copy()
    if patch.row_bytes != rb:
        raise RowPatchError("<row patch>", "rows", f"rows of {patch.row_bytes} bytes cannot patch a "
                            f"tensor with {rb}-byte rows")
    if int(patch.row_ids.max()) >= rows:
        raise RowPatchError("<row patch>", "row ids", f"row {int(patch.row_ids.max())} is outside "
                            f"the tensor's {rows} rows")
    out = raw_tensor.copy()
    out[patch.row_ids.astype(np.intp)] = patch.raw
    return out
