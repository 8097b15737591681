"""Read a GGUF file memory-mapped: header, metadata and tensor infos validated up front, payloads on demand.

`open(path)` parses only what it must: scalars are read, array payloads are skipped by computing their
byte lengths (numeric arrays in one step, string arrays by walking their length prefixes). Every count
is checked against the bytes left before anything loops or allocates, so evil input gives a
`GGUFFormatError` naming the file, the field and the offset, never a crash, hang or huge allocation.
"""
from __future__ import annotations

import builtins
import difflib
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGUFValueType

from exactedit.errors import GGUFFormatError, QuantError
from exactedit.files import file_sha256  # noqa: F401 - re-exported as quant.gguf.file_sha256
from exactedit.quant.gguf.parse import (ARRAY_DTYPES, DEFAULT_ALIGNMENT, GGUF_MAGIC, HEADER_BYTES, SCALAR_FORMATS,
    SUPPORTED_VERSIONS, KV, Reader, TensorInfo, ggml_layout, parse, row_bytes_of)

_VT = GGUFValueType


@dataclass(frozen=True)
class MetadataInfo:
    """Where a metadata value lives; `count` and `elem_type` only for arrays."""

    key: str
    type_name: str
    offset: int
    elem_type: str | None = None
    count: int | None = None


class GGUFFile:
    """A validated, read-only, memory-mapped GGUF. Build it with `quant.gguf.open(path)`."""

    def __init__(self, reader: Reader, version: int, kv: dict[str, KV], tensors: dict[str, TensorInfo],
                 alignment: int, info_end: int, data_offset: int):
        self.path, self._r, self.version = reader.path, reader, version
        self._kv, self.tensors = kv, tensors
        self.alignment, self.data_offset = alignment, data_offset
        self.info_end = info_end  # one past the tensor-info table; zero padding follows to data_offset
        self.size = reader.size
        self._sha256: str | None = None
        self._tokens: tuple[str, ...] | None = None

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, v{self.version}, {len(self.tensors)} tensors)"

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Unmaps the file unless arrays handed out by read_raw still view it (they keep it alive)."""
        try:
            self._r.mm.close()
        except BufferError:
            pass

    # ---- metadata -----------------------------------------------------------------------------
    def metadata_keys(self) -> list[str]:
        return list(self._kv)

    def metadata_info(self, key: str) -> MetadataInfo:
        kv = self._kv[key]
        elem = None if kv.elem_type is None else _VT(kv.elem_type).name
        return MetadataInfo(key, _VT(kv.vtype).name, kv.offset, elem, kv.count)

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value: Python scalar, str, numpy array (numeric arrays), or list (str/nested)."""
        kv = self._kv.get(key)
        if kv is None:
            return default
        if kv.vtype == _VT.STRING:
            return self._r.string(kv.offset, key)[0]
        if kv.vtype == _VT.ARRAY:
            return self._r.array_value(kv.offset, key)
        return kv.scalar

    def tokens(self) -> list[str]:
        """The token table (`tokenizer.ggml.tokens`), decoded on the first call (the map is
        read-only, so later calls copy that)."""
        if self._tokens is None:
            kv = self._kv.get("tokenizer.ggml.tokens")
            if kv is None or kv.vtype != _VT.ARRAY or kv.elem_type != _VT.STRING:
                raise GGUFFormatError(self.path, "tokenizer.ggml.tokens", "no string-array token table")
            self._tokens = tuple(self._r.string_items(kv.offset + 12, kv.count))
        return list(self._tokens)

    def token_types(self) -> np.ndarray | None:
        kv = self._kv.get("tokenizer.ggml.token_type")
        if kv is None or kv.vtype != _VT.ARRAY or kv.elem_type in (_VT.STRING, _VT.ARRAY):
            return None
        return np.asarray(self.get("tokenizer.ggml.token_type"), dtype=np.int32)

    # ---- tensors ------------------------------------------------------------------------------
    def tensor(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        if info is None:
            near = difflib.get_close_matches(name, list(self.tensors), n=5, cutoff=0.6)
            hint = f"; near matches: {', '.join(near)}" if near else ""
            raise GGUFFormatError(self.path, f"tensor {name}", f"not found among "
                                  f"{len(self.tensors)} tensors{hint}")
        return info

    def read_raw(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) of a tensor as a read-only uint8 view [rows, row_bytes] of the map."""
        info = self.tensor(name)
        stop = info.rows if stop is None else stop
        if not (0 <= start <= stop <= info.rows):
            raise GGUFFormatError(self.path, f"tensor {name}",
                                  f"row range [{start}, {stop}) is outside [0, {info.rows}]")
        rb = info.row_bytes
        view = np.frombuffer(self._r.mm, dtype=np.uint8, count=(stop - start) * rb,
                             offset=info.offset + start * rb)
        return view.reshape(stop - start, rb)

    def read_rows(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) of a tensor dequantized to float32 [rows, cols] (via quant.dequantize)."""
        from exactedit.quant import dequantize

        info = self.tensor(name)
        raw = self.read_raw(name, start, stop)
        try:
            return dequantize(raw, info.type_name, info.cols)
        except QuantError as exc:
            raise GGUFFormatError(self.path, f"tensor {name}", f"cannot dequantize "
                                  f"{info.type_name}: {exc}") from None

    def sha256(self, progress: Callable[[int, int], None] | None = None) -> str:
        """sha256 of the whole file, streamed once and cached on this object."""
        if self._sha256 is None:
            self._sha256 = file_sha256(self.path, progress)
        return self._sha256


def open(path) -> GGUFFile:  # noqa: A001 - the public name the project asked for
    """Maps a GGUF read-only and validates its header, metadata and tensor table."""
    path = Path(path)
    if not path.is_file():
        raise GGUFFormatError(path, "file", "does not exist or is not a regular file")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise GGUFFormatError(path, "header", f"file has {size} bytes, a GGUF header needs "
                              f"{HEADER_BYTES} (truncated?)", 0)
    with builtins.open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    r = Reader(path, mm, size)
    try:
        return GGUFFile(r, *parse(r))
    except BaseException:
        mm.close()
        raise
