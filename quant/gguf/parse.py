"""GGUF parsing behind `quant.gguf.open`: bounds-checked reads, header, metadata and tensor table.

Every count is checked against the bytes left before anything loops or allocates; array payloads
are skipped by computing their byte lengths (numeric arrays in one step, string arrays by walking
their length prefixes) and decoded only on demand. Errors are `GGUFFormatError(path, field, ...)`.
"""
from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from exactedit.errors import GGUFFormatError, QuantError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_ARRAY_DEPTH = 8
HEADER_BYTES = 4 + 4 + 8 + 8

_VT = GGUFValueType
SCALAR_FORMATS = {_VT.UINT8: "<B", _VT.INT8: "<b", _VT.UINT16: "<H", _VT.INT16: "<h",
                  _VT.UINT32: "<I", _VT.INT32: "<i", _VT.FLOAT32: "<f", _VT.BOOL: "<B",
                  _VT.UINT64: "<Q", _VT.INT64: "<q", _VT.FLOAT64: "<d"}
ARRAY_DTYPES = {_VT.UINT8: "<u1", _VT.INT8: "<i1", _VT.UINT16: "<u2", _VT.INT16: "<i2",
                _VT.UINT32: "<u4", _VT.INT32: "<i4", _VT.FLOAT32: "<f4", _VT.BOOL: "<u1",
                _VT.UINT64: "<u8", _VT.INT64: "<i8", _VT.FLOAT64: "<f8"}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_MIN_KV_BYTES = 8 + 4 + 1                   # key length, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one ne, type, offset


def ggml_layout(type_name: str) -> tuple[int, int, int]:
    """(ggml type id, elements per block, bytes per block) of a ggml type name such as "Q6_K"."""
    try:
        qtype = GGMLQuantizationType[type_name]
        block, size = GGML_QUANT_SIZES[qtype]
    except KeyError:
        raise QuantError(f"unknown ggml type {type_name!r}") from None
    return int(qtype), block, size


def row_bytes_of(type_name: str, cols: int) -> int:
    """Bytes of one row of `cols` elements in ggml type `type_name` (cols must fill whole blocks)."""
    _, block, size = ggml_layout(type_name)
    if cols % block:
        raise QuantError(f"{type_name} rows need a multiple of {block} columns, got {cols}")
    return cols // block * size


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: shape in numpy order (reversed ggml ne), absolute byte offset in the file."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def row_bytes(self) -> int:
        return row_bytes_of(self.type_name, self.cols)


class KV(NamedTuple):
    """Where one metadata value lies; scalars are decoded at open, the rest on demand."""

    vtype: int
    offset: int          # first byte of the value
    end: int             # one past its last byte
    elem_type: int | None
    count: int | None
    scalar: Any


class Reader:
    """Bounds-checked little-endian reads from the mapped file."""

    def __init__(self, path: Path, mm: mmap.mmap, size: int):
        self.path, self.mm, self.size = path, mm, size

    def fail(self, field: str, message: str, offset: int | None) -> GGUFFormatError:
        return GGUFFormatError(self.path, field, message, offset)

    def need(self, pos: int, n: int, field: str) -> None:
        if n > self.size - pos:
            raise self.fail(field, f"needs {n} bytes but the file ends after {self.size - pos}"
                                   " (truncated?)", pos)

    def u32(self, pos: int, field: str) -> int:
        self.need(pos, 4, field)
        return _U32.unpack_from(self.mm, pos)[0]

    def u64(self, pos: int, field: str) -> int:
        self.need(pos, 8, field)
        return _U64.unpack_from(self.mm, pos)[0]

    def string(self, pos: int, field: str) -> tuple[str, int]:
        n = self.u64(pos, f"{field} length")
        self.need(pos + 8, n, field)
        try:
            return self.mm[pos + 8:pos + 8 + n].decode("utf-8"), pos + 8 + n
        except UnicodeDecodeError as exc:
            raise self.fail(field, f"is not valid UTF-8 ({exc.reason})", pos) from None

    def vtype(self, pos: int, field: str) -> int:
        t = self.u32(pos, field)
        if t not in _VT._value2member_map_:
            raise self.fail(field, f"unknown GGUF value type {t} (expected 0..12)", pos)
        return t

    def skip_strings(self, pos: int, count: int, field: str) -> int:
        if count > (self.size - pos) // 8:
            raise self.fail(field, f"{count} strings cannot fit in the {self.size - pos} bytes left", pos)
        unpack, mm = _U64.unpack_from, self.mm
        start = pos
        try:
            for _ in range(count):
                pos += 8 + unpack(mm, pos)[0]
        except (struct.error, OverflowError):   # a length prefix pointed past the end
            pos = self.size + 1
        if pos > self.size:
            raise self.fail(field, "string array runs past the end of the file (truncated?)", start)
        return pos

    def skip_array(self, pos: int, field: str, depth: int = 0) -> tuple[int, int, int]:
        """Skips an array payload at pos (elem type, count, items); returns (elem_type, count, end)."""
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(field, f"arrays nested deeper than {MAX_ARRAY_DEPTH}", pos)
        elem = self.vtype(pos, f"{field} element type")
        count = self.u64(pos + 4, f"{field} count")
        pos += 12
        if elem == _VT.STRING:
            return elem, count, self.skip_strings(pos, count, field)
        if elem == _VT.ARRAY:
            if count > (self.size - pos) // 12:
                raise self.fail(field, f"{count} nested arrays cannot fit in the bytes left", pos)
            for i in range(count):
                pos = self.skip_array(pos, f"{field}[{i}]", depth + 1)[2]
            return elem, count, pos
        n = count * struct.calcsize(SCALAR_FORMATS[elem])
        if n > self.size - pos:
            raise self.fail(field, f"{count} x {_VT(elem).name} ({n} bytes) cannot fit in the "
                                   f"{self.size - pos} bytes left (truncated?)", pos)
        return elem, count, pos + n

    def string_items(self, pos: int, count: int) -> list[str]:
        unpack, mm, out = _U64.unpack_from, self.mm, []
        for i in range(count):
            n = unpack(mm, pos)[0]
            try:
                out.append(mm[pos + 8:pos + 8 + n].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise self.fail(f"string item {i}", f"is not valid UTF-8 ({exc.reason})", pos) from None
            pos += 8 + n
        return out

    def array_value(self, pos: int, field: str) -> Any:
        elem, count = self.u32(pos, field), self.u64(pos + 4, field)
        pos += 12
        if elem == _VT.STRING:
            return self.string_items(pos, count)
        if elem == _VT.ARRAY:
            out = []
            for i in range(count):
                out.append(self.array_value(pos, f"{field}[{i}]"))
                pos = self.skip_array(pos, f"{field}[{i}]")[2]
            return out
        arr = np.frombuffer(self.mm, dtype=ARRAY_DTYPES[elem], count=count, offset=pos)
        return arr.astype(bool) if elem == _VT.BOOL else arr


class Parsed(NamedTuple):
    version: int
    kv: dict[str, KV]
    tensors: dict[str, TensorInfo]
    alignment: int
    info_end: int
    data_offset: int


def parse(r: Reader) -> Parsed:
    magic = r.mm[0:4]
    if magic != GGUF_MAGIC:
        raise r.fail("magic", f"expected {GGUF_MAGIC!r}, found {magic!r} (not a GGUF file)", 0)
    version = r.u32(4, "version")
    if version not in SUPPORTED_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        why = ("big-endian GGUF files are not supported" if swapped in SUPPORTED_VERSIONS else
               "GGUF v1 is obsolete and not supported" if version == 1 else "unknown version")
        raise r.fail("version", f"{version}: {why} (expected 2 or 3)", 4)
    n_tensors, n_kv = r.u64(8, "tensor_count"), r.u64(16, "kv_count")
    pos = HEADER_BYTES
    if n_kv > (r.size - pos) // _MIN_KV_BYTES:
        raise r.fail("kv_count", f"{n_kv} key/value pairs cannot fit in the {r.size - pos} bytes left", 16)
    kv, pos = _parse_metadata(r, pos, n_kv)
    alignment = _alignment(r, kv)
    if n_tensors > (r.size - pos) // _MIN_TENSOR_INFO_BYTES:
        raise r.fail("tensor_count", f"{n_tensors} tensor infos cannot fit in the {r.size - pos} "
                                     "bytes left", 8)
    infos, pos = _parse_tensor_infos(r, pos, n_tensors)
    data_offset = -(-pos // alignment) * alignment
    if infos and data_offset > r.size:
        raise r.fail("data", f"tensor data would start at {data_offset}, past the end of the "
                             f"{r.size}-byte file (truncated?)", pos)
    tensors = _place_tensors(r, infos, data_offset, alignment)
    return Parsed(version, kv, tensors, alignment, pos, data_offset)


def _parse_metadata(r: Reader, pos: int, n_kv: int) -> tuple[dict[str, KV], int]:
    kv: dict[str, KV] = {}
    for i in range(n_kv):
        key_at = pos
        key, pos = r.string(pos, f"metadata key #{i}")
        if key in kv:
            raise r.fail(f"metadata key {key!r}", "appears twice", key_at)
        vtype = r.vtype(pos, f"{key} value type")
        pos += 4
        elem = count = scalar = None
        if vtype == _VT.STRING:
            n = r.u64(pos, f"{key} length")
            r.need(pos + 8, n, key)
            end = pos + 8 + n
        elif vtype == _VT.ARRAY:
            elem, count, end = r.skip_array(pos, key)
        else:
            fmt = SCALAR_FORMATS[vtype]
            r.need(pos, struct.calcsize(fmt), key)
            scalar = struct.unpack_from(fmt, r.mm, pos)[0]
            scalar = bool(scalar) if vtype == _VT.BOOL else scalar
            end = pos + struct.calcsize(fmt)
        kv[key] = KV(vtype, pos, end, elem, count, scalar)
        pos = end
    return kv, pos


def _alignment(r: Reader, kv: dict[str, KV]) -> int:
    a = kv.get("general.alignment")
    if a is None:
        return DEFAULT_ALIGNMENT
    if a.vtype != _VT.UINT32 or a.scalar == 0 or a.scalar & (a.scalar - 1):
        raise r.fail("general.alignment", f"must be a UINT32 power of two, found {_VT(a.vtype).name} "
                                          f"{a.scalar!r}", a.offset)
    return a.scalar


def _parse_tensor_infos(r: Reader, pos: int, n: int) -> tuple[list[tuple], int]:
    infos, seen = [], set()
    for i in range(n):
        at = pos
        name, pos = r.string(pos, f"tensor info #{i} name")
        if name in seen:
            raise r.fail(f"tensor {name}", "appears twice in the tensor table", at)
        seen.add(name)
        n_dims = r.u32(pos, f"tensor {name} n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise r.fail(f"tensor {name} n_dims", f"{n_dims}, expected 1..{MAX_DIMS}", pos)
        pos += 4
        r.need(pos, 8 * n_dims + 12, f"tensor {name} info")
        ne = struct.unpack_from(f"<{n_dims}Q", r.mm, pos)
        type_id, rel = struct.unpack_from("<IQ", r.mm, pos + 8 * n_dims)
        pos += 8 * n_dims + 12
        try:
            type_name = GGMLQuantizationType(type_id).name
            block, tsize = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
        except (ValueError, KeyError):
            raise r.fail(f"tensor {name} type", f"unsupported ggml type id {type_id}", at) from None
        if max(ne) >= 2**63 or math.prod(ne) >= 2**63:
            raise r.fail(f"tensor {name} shape", f"ne {list(ne)} overflows int64 elements", at)
        if ne[0] % block:
            raise r.fail(f"tensor {name} shape", f"{type_name} needs a multiple of {block} columns, "
                                                 f"found ne[0] = {ne[0]}", at)
        nbytes = ne[0] // block * tsize
        for d in ne[1:]:
            nbytes *= d
        infos.append((name, type_name, tuple(reversed(ne)), rel, nbytes, at))
    return infos, pos


def _place_tensors(r: Reader, infos: list[tuple], data_offset: int,
                   alignment: int) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for name, type_name, shape, rel, nbytes, at in infos:
        if rel % alignment:
            raise r.fail(f"tensor {name} offset", f"{rel} is not a multiple of the alignment "
                                                  f"{alignment}", at)
        if nbytes > r.size - data_offset - rel:
            raise r.fail(f"tensor {name} data", f"{nbytes} bytes at data offset {rel} run past the "
                                                f"end of the {r.size}-byte file (truncated?)", at)
        tensors[name] = TensorInfo(name, type_name, shape, data_offset + rel, nbytes)
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values() if t.nbytes)
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise r.fail(f"tensor {b} offset", f"overlaps tensor {a} (which ends at {end})", start)
    return tensors
