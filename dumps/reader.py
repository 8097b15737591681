"""Read a dump: validated, memory-mapped read-only. Every error is a DumpFormatError naming the
dump directory, the field and what was expected."""
from __future__ import annotations

import ast
import hashlib
import json
import math
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from exactedit.dumps.errors import DumpFormatError
from exactedit.files import file_sha256  # noqa: F401 - re-exported as dumps.reader.file_sha256
from exactedit.dumps.verify import VerifyCache, verify_fields
from exactedit.dumps.format import (
    MANIFEST, MANIFEST_MAX_BYTES, ROLE_NAMES, DocInfo, DumpExpect, Manifest, check_shapes, field_spec,
    parse_manifest,
)

Progress = Callable[[int, int], None]
CHUNK_BYTES = 32 << 20
NPY_MAGIC = b"\x93NUMPY"
NPY_HEADER_MAX = 1 << 16


@dataclass(frozen=True)
class NpyHeader:
    """Where an .npy file's data starts and what it holds."""

    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int


def read_npy_header(file: Path, dump_path, field: str, expected_dtype: str) -> NpyHeader:
    """Parse an .npy header without trusting it (and without numpy's header parser): version 1.0 or
    2.0, a literal dict of exactly descr / fortran_order / shape, C order, the exact little-endian
    dtype, and a file size equal to header + data (no truncation, no trailing bytes)."""
    want = np.dtype(expected_dtype).newbyteorder("<")

    def bad(message: str) -> DumpFormatError:
        return DumpFormatError(dump_path, field, f"{file.name}: {message}")

    if not file.is_file():
        raise DumpFormatError(dump_path, field, f"file {file.name} is missing")
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            lead = f.read(12)
            if len(lead) < 10 or lead[:6] != NPY_MAGIC:
                raise bad("not an .npy file (bad magic; pickles and other formats are refused)")
            if lead[6:8] == b"\x01\x00":
                offset, length = 10, struct.unpack("<H", lead[8:10])[0]
            elif lead[6:8] == b"\x02\x00" and len(lead) == 12:
                offset, length = 12, struct.unpack("<I", lead[8:12])[0]
            else:
                raise bad(f"npy version {tuple(lead[6:8])}; expected 1.0 or 2.0")
            if length > NPY_HEADER_MAX or offset + length > size:
                raise bad(f"header length {length} does not fit the file ({size} bytes)")
            f.seek(offset)
            text = f.read(length).decode("latin1")
    except OSError as exc:
        raise bad(f"cannot be read ({exc})") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # odd escapes in a mutated header are not our concern
            header = ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise bad("header is not a Python literal dict") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise bad("header must be a dict of exactly descr, fortran_order, shape")
    descr, fortran, shape = header["descr"], header["fortran_order"], header["shape"]
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                               for d in shape):
        raise bad(f"shape {shape!r} is not a tuple of non-negative integers")
    if descr != want.str:
        if isinstance(descr, str) and "O" in descr:
            raise bad(f"holds Python objects (pickles are refused); expected {want.str}")
        hint = " (big-endian)" if isinstance(descr, str) and descr.startswith(">") else ""
        raise bad(f"dtype {descr!r}{hint}; expected {want.str!r} ({want.name}, little-endian)")
    if fortran is not False:
        raise bad("Fortran order; expected C order")
    data = math.prod(shape) * want.itemsize
    if size != offset + length + data:
        what = "truncated" if size < offset + length + data else "has trailing bytes"
        raise bad(f"{what}: {size} bytes; expected {offset + length + data} for shape {list(shape)} {want.name}")
    return NpyHeader(shape, want, offset + length)


def check_values(path, arrays: Mapping[str, np.ndarray], vocab: int | None = None,
                 progress: Progress | None = None) -> None:
    """Finite float values; `tokens` in [0, vocab) and `next` in [0, vocab) or -1 (vocab None:
    only the lower bounds). Scans in row chunks, so memory stays bounded on memmaps."""
    total = sum(int(a.nbytes) for a in arrays.values())
    done = 0
    for name, arr in arrays.items():
        row_bytes = max(1, int(arr[:1].nbytes))
        step = max(1, CHUNK_BYTES // row_bytes)
        for start in range(0, arr.shape[0], step):
            chunk = np.asarray(arr[start:start + step])
            _check_chunk(path, name, chunk, start, vocab)
            done += int(chunk.nbytes)
            if progress is not None:
                progress(done, total)


def _check_chunk(path, name: str, chunk: np.ndarray, start: int, vocab: int | None) -> None:
    if chunk.dtype.kind == "f":
        bad = ~np.isfinite(chunk.reshape(chunk.shape[0], -1)).all(axis=1)
        if bad.any():
            row = start + int(np.argmax(bad))
            raise DumpFormatError(path, name, f"row {row}: non-finite value (NaN or inf); expected finite float32")
    elif name in ("tokens", "next"):
        low = -1 if name == "next" else 0
        bad = chunk < low
        if vocab is not None:
            bad |= chunk >= vocab
        if bad.any():
            row = start + int(np.argmax(bad))
            bound = f"[0, {vocab})" if vocab is not None else ">= 0"
            extra = " or -1 (unknown)" if name == "next" else ""
            raise DumpFormatError(path, name, f"row {row}: token id {int(chunk[row - start])}; expected {bound}{extra}")


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


@dataclass(frozen=True, eq=False)
class Dump:
    """A validated dump. `fields` maps each field name to a read-only memmap."""

    path: Path
    manifest: Manifest
    fields: Mapping[str, np.ndarray]
    dims: Mapping[str, int]
    verified: bool = False          # every field file's bytes matched the manifest's sha256 when opened

    arch = property(lambda self: self.manifest.arch)
    layer = property(lambda self: self.manifest.layer)
    rows = property(lambda self: self.manifest.rows)
    docs = property(lambda self: self.manifest.docs)
    model_sha256 = property(lambda self: self.manifest.model_sha256)
    meta = property(lambda self: self.manifest.meta)

    def field(self, name: str) -> np.ndarray:
        if name not in self.fields:
            raise DumpFormatError(self.path, name, f"not in this {self.arch} dump (has {', '.join(self.fields)})")
        return self.fields[name]

    tokens = property(lambda self: self.field("tokens"))
    next = property(lambda self: self.field("next"))
    R = property(lambda self: self.field("R"))
    hh = property(lambda self: self.field("hh"))
    inj = property(lambda self: self.field("inj"))
    sgv = property(lambda self: self.field("sgv"))
    yr = property(lambda self: self.field("yr"))

    @property
    def roles(self) -> np.ndarray | None:
        """The uint8 role bitmask per row, or None when the dump has no `roles` field."""
        return self.fields.get("roles")

    def doc(self, name: str) -> slice:
        for doc in self.docs:
            if doc.name == name:
                return slice(doc.first_row, doc.stop)
        raise DumpFormatError(self.path, "docs", f"no document named {name!r} "
                              f"(have {', '.join(d.name for d in self.docs)})")

    def doc_index(self) -> np.ndarray:
        """int32 [T]: the index into `.docs` of each row's document."""
        index = np.empty(self.rows, dtype=np.int32)
        for i, doc in enumerate(self.docs):
            index[doc.first_row:doc.stop] = i
        return index

    def rows_where(self, role_bits: int, exclude: int = 0) -> np.ndarray:
        """int64 row ids whose roles share a bit with `role_bits` and none with `exclude`."""
        roles = self.roles
        if roles is None:
            raise DumpFormatError(self.path, "roles", "this dump has no roles field (see docs/dump-format.md)")
        roles = np.asarray(roles)
        return np.flatnonzero(((roles & role_bits) != 0) & ((roles & exclude) == 0))

    def role_counts(self) -> dict[str, int]:
        """Rows carrying each role bit, by name (empty when the dump has no roles)."""
        if self.roles is None:
            return {}
        roles = np.asarray(self.roles)
        return {name: int(np.count_nonzero(roles & bit)) for name, bit in ROLE_NAMES.items()}

    def sha256(self) -> str:
        """The dump's identity: sha256 of the canonical manifest, which holds every field file's
        hash. It covers the data only when `verified` (the default of `read_dump`), see dumps.verify."""
        return manifest_sha256(self.manifest)


def manifest_sha256(manifest: Manifest) -> str:
    return hashlib.sha256(canonical_json(manifest.to_json())).hexdigest()


def load_manifest(path) -> Manifest:
    """Read and type-check `path/manifest.json` (shapes and values are not checked here)."""
    path = Path(path)
    if not path.is_dir():
        raise DumpFormatError(path, "path", "not a directory; expected a dump directory with manifest.json")
    file = path / MANIFEST
    try:
        if not file.is_file():
            raise DumpFormatError(path, MANIFEST, "missing")
        if file.stat().st_size > MANIFEST_MAX_BYTES:
            raise DumpFormatError(path, MANIFEST, f"larger than {MANIFEST_MAX_BYTES} bytes")
        obj = json.loads(file.read_bytes().decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError, OSError) as exc:
        raise DumpFormatError(path, MANIFEST, f"not valid UTF-8 JSON ({exc})") from None
    return parse_manifest(obj, path)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def read_dump(path, expect: DumpExpect | None = None, *, verify_hashes: bool = True,
              check_finite: bool = True, cache: VerifyCache | None = None,
              progress: Progress | None = None) -> Dump:
    """Open and validate a dump directory. `expect` checks it against a model (n, h, vocab, ...);
    `verify_hashes` (default) re-hashes every field file against the manifest, so that `sha256()`
    is the identity of the data (a mismatch is a DumpFormatError naming the field); `cache`, owned
    by the caller, skips re-hashing a dump it already verified unchanged; `check_finite=False`
    skips the value scan (finite floats, token ranges). Each reads every byte once; `progress`
    counts both."""
    path = Path(path)
    manifest = load_manifest(path)
    if expect is not None:
        expect.check(path, manifest.arch, manifest.layer)
    headers = {}
    for name, file in manifest.fields.items():
        spec = field_spec(path, manifest.arch, name)
        headers[name] = read_npy_header(path / file, path, name, spec.dtype)
    dims = check_shapes(path, manifest.arch, manifest.rows, {k: h.shape for k, h in headers.items()}, expect)
    hash_bytes = sum((path / f).stat().st_size for f in manifest.fields.values()) if verify_hashes else 0
    scan_bytes = sum(math.prod(h.shape) * h.dtype.itemsize for h in headers.values()) if check_finite else 0
    if verify_hashes:
        verify_fields(path, manifest.fields, manifest.sha256, manifest_sha256(manifest), cache=cache,
                      progress=_phase(progress, 0, hash_bytes + scan_bytes))
    arrays = {}
    for name, file in manifest.fields.items():
        h = headers[name]
        try:
            arrays[name] = np.memmap(path / file, dtype=h.dtype, mode="r", offset=h.offset, shape=h.shape)
        except (ValueError, OSError) as exc:
            raise DumpFormatError(path, name, f"{file}: cannot be memory-mapped ({exc})") from None
    if check_finite:
        check_values(path, arrays, expect.vocab if expect is not None else None,
                     _phase(progress, hash_bytes, hash_bytes + scan_bytes))
    return Dump(path=path, manifest=manifest, fields=MappingProxyType(arrays), dims=MappingProxyType(dims),
                verified=verify_hashes)


def _phase(progress: Progress | None, offset: int, total: int) -> Progress | None:
    """A phase's progress(done, its total) as the whole open's progress(offset + done, total)."""
    if progress is None:
        return None
    return lambda done, _: progress(offset + done, total)
