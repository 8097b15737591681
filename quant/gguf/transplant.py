"""Copy a GGUF with some tensors' bytes replaced (and optionally new tensors added), every other byte kept.

The output is planned as a list of segments (a byte range of the source, or new bytes), written to
`dst + ".tmp"`, read back and compared segment by segment with its source, structurally re-opened,
fsynced and renamed. Without `add`, every byte outside the replaced tensors equals the source at
the same offset. With `add` (e.g. untying a tied head by adding `output.weight`), the tensor count
and tensor-info table grow and the data section moves to a new aligned start, but metadata, every
existing tensor info and every existing tensor's bytes are copied verbatim; new tensors go at the
end. A JSON manifest records the sha256 of the input, the output and each replaced/added tensor.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from exactedit.quant import gguf
from exactedit.errors import GGUFFormatError, QuantError
from exactedit.files import atomic_write_text, claim_tmp, fsync_dir, writing
from exactedit.quant.gguf.write import TensorData, align_up, encode_tensor_info

_CHUNK = 1 << 24


@dataclass(frozen=True)
class TensorRecord:
    """A replaced or added tensor as it lies in the output."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    sha256: str


@dataclass(frozen=True)
class TransplantResult:
    src: Path
    dst: Path
    manifest: Path
    src_sha256: str
    dst_sha256: str
    dst_bytes: int
    replaced: tuple[TensorRecord, ...]
    added: tuple[TensorRecord, ...]
    bytes_from_src: int     # bytes of the output verified equal to the source


@dataclass(frozen=True)
class _Seg:
    """Output bytes [start, start + length): from the source at `src_at`, or `data` when given."""

    start: int
    length: int
    src_at: int | None = None
    data: bytes | memoryview | None = None


def _check_paths(src: Path, dst: Path, manifest: Path, overwrite: bool) -> None:
    def resolved(p: Path) -> Path:
        try:
            return p.resolve()
        except (RuntimeError, OSError):     # a symlink loop: Python 3.11 raises RuntimeError (a traceback)
            return p.absolute()

    def same(a: Path, b: Path) -> bool:
        return resolved(a) == resolved(b) or (a.exists() and b.exists() and os.path.samefile(a, b))

    for path, what in ((dst, "output"), (dst.with_name(dst.name + ".tmp"), "temporary output"),
                       (manifest, "manifest"), (manifest.with_name(manifest.name + ".tmp"),
                                                "temporary manifest")):
        if same(src, path):
            raise GGUFFormatError(dst, "output", f"the {what} {path} is the input file; refusing to "
                                                 "overwrite it")
    if same(dst, manifest):
        raise GGUFFormatError(dst, "manifest", "the manifest path is the output path")
    for path, what in ((dst, "output"), (manifest, "manifest")):
        if os.path.lexists(path) and not overwrite:      # a dangling link or a loop stands there too
            raise GGUFFormatError(path, what, "exists; pass overwrite=True to replace it")


def _replacement(g: gguf.GGUFFile, name: str, raw) -> np.ndarray:
    info = g.tensor(name)
    raw = np.asarray(raw)
    expected = (info.rows, info.row_bytes)
    if raw.dtype != np.uint8 or raw.shape != expected:
        raise GGUFFormatError(g.path, f"tensor {name}", f"replacement must be uint8 {expected} "
                              f"({info.type_name} {info.shape}), got {raw.dtype} {raw.shape}")
    return raw


def _addition(g: gguf.GGUFFile, name: str, spec) -> TensorData:
    if name in g.tensors:
        raise GGUFFormatError(g.path, f"tensor {name}", "already exists; use replace, not add")
    try:
        return spec if isinstance(spec, TensorData) else TensorData(*spec)
    except (QuantError, TypeError) as exc:
        raise GGUFFormatError(g.path, f"added tensor {name}", str(exc)) from None


def _flat(raw: np.ndarray) -> memoryview:
    """The array's bytes as a flat byte view (no copy when it is already contiguous)."""
    return memoryview(np.ascontiguousarray(raw).reshape(-1)).cast("B")


def _overlay(start: int, src_lo: int, src_hi: int, patches: list[tuple[int, bytes]]) -> list[_Seg]:
    """Segments copying source [src_lo, src_hi) to output `start`, with patches (src offset, bytes)."""
    segs, at = [], src_lo
    for off, data in sorted(patches, key=lambda p: p[0]):
        if off > at:
            segs.append(_Seg(start + at - src_lo, off - at, src_at=at))
        if data:
            segs.append(_Seg(start + off - src_lo, len(data), data=data))
        at = off + len(data)
    if src_hi > at:
        segs.append(_Seg(start + at - src_lo, src_hi - at, src_at=at))
    return segs


def _plan(g: gguf.GGUFFile, repl: dict[str, np.ndarray],
          adds: dict[str, TensorData]) -> tuple[list[_Seg], dict[str, int], int]:
    """Output segments, the output offset of each replaced/added tensor, and the data-section shift."""
    patches = [(g.tensors[n].offset, _flat(r)) for n, r in repl.items()]
    if not adds:
        return _overlay(0, 0, g.size, patches), {n: g.tensors[n].offset for n in repl}, 0
    old_data = g.size - g.data_offset
    rel, infos, rels = align_up(old_data, g.alignment), [], {}
    for name, t in adds.items():
        infos.append(encode_tensor_info(name, t.type_name, t.shape, rel))
        rels[name] = rel
        rel = align_up(rel + t.raw.nbytes, g.alignment)
    new_info_end = g.info_end + sum(len(b) for b in infos)
    data_offset = align_up(new_info_end, g.alignment)
    shift = data_offset - g.data_offset
    head = b"GGUF" + struct.pack("<IQ", g.version, len(g.tensors) + len(adds))
    segs = [_Seg(0, len(head), data=head), _Seg(16, g.info_end - 16, src_at=16)]
    at = g.info_end
    for b in infos:
        segs.append(_Seg(at, len(b), data=b))
        at += len(b)
    segs.append(_Seg(at, data_offset - at, data=bytes(data_offset - at)))
    segs += _overlay(data_offset, g.data_offset, g.size, patches)
    at = data_offset + old_data
    for name, t in adds.items():
        start = data_offset + rels[name]
        segs.append(_Seg(at, start - at, data=bytes(start - at)))
        segs.append(_Seg(start, t.raw.nbytes, data=_flat(t.raw)))
        at = start + t.raw.nbytes
    segs.append(_Seg(at, data_offset + rel - at, data=bytes(data_offset + rel - at)))
    offsets = {n: g.tensors[n].offset + shift for n in repl}
    offsets.update({n: data_offset + r for n, r in rels.items()})
    return [s for s in segs if s.length], offsets, shift


def _write(tmp: Path, src_mm, segs: list[_Seg], tick) -> None:
    with writing(tmp), open(tmp, "wb") as fh:
        for s in segs:
            if s.data is not None:
                fh.write(s.data)
                tick(s.length)
                continue
            for lo in range(s.src_at, s.src_at + s.length, _CHUNK):
                hi = min(lo + _CHUNK, s.src_at + s.length)
                fh.write(src_mm[lo:hi])
                tick(hi - lo)
        fh.flush()
        os.fsync(fh.fileno())


def _verify(tmp: Path, src_mm, segs: list[_Seg], tick) -> tuple[str, int]:
    """Compares every output segment with its source; returns (sha256 of the output, source bytes)."""
    h, from_src, size = hashlib.sha256(), 0, tmp.stat().st_size
    expected = segs[-1].start + segs[-1].length if segs else 0
    if size != expected:
        raise GGUFFormatError(tmp, "verify", f"output has {size} bytes, expected {expected}")
    with open(tmp, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as out:
        for s in segs:
            for lo in range(0, s.length, _CHUNK):
                hi = min(lo + _CHUNK, s.length)
                got = out[s.start + lo:s.start + hi]
                want = s.data[lo:hi] if s.data is not None else src_mm[s.src_at + lo:s.src_at + hi]
                if got != want:
                    bad = np.flatnonzero(np.frombuffer(got, np.uint8) != np.frombuffer(want, np.uint8))
                    raise GGUFFormatError(tmp, "verify", "written bytes differ from the plan",
                                          s.start + lo + int(bad[0]))
                h.update(got)
                tick(hi - lo)
            from_src += s.length if s.data is None else 0
    return h.hexdigest(), from_src


def _check_structure(g: gguf.GGUFFile, tmp: Path, offsets: dict[str, int], shift: int,
                     adds: dict[str, TensorData]) -> None:
    """The output parses, keeps every tensor's type, shape and (shifted) offset, and has the adds."""
    with gguf.open(tmp) as out:
        for name, info in g.tensors.items():
            o = out.tensors.get(name)
            if o is None or (o.type_name, o.shape, o.offset) != (info.type_name, info.shape,
                                                                 info.offset + shift):
                raise GGUFFormatError(tmp, f"tensor {name}", "changed type, shape or offset")
        for name, t in adds.items():
            o = out.tensors.get(name)
            if o is None or (o.type_name, o.shape, o.offset) != (t.type_name, t.shape, offsets[name]):
                raise GGUFFormatError(tmp, f"added tensor {name}", "missing or misplaced in the output")
        if len(out.tensors) != len(g.tensors) + len(adds) or out.metadata_keys() != g.metadata_keys():
            raise GGUFFormatError(tmp, "verify", "tensor table or metadata keys changed")


def _record(name: str, type_name: str, shape, offset: int, raw: np.ndarray) -> TensorRecord:
    data = np.ascontiguousarray(raw)
    return TensorRecord(name, type_name, tuple(shape), offset, data.nbytes,
                        hashlib.sha256(_flat(data)).hexdigest())


def _write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def transplant(src, dst, replace: Mapping[str, np.ndarray],
               add: Mapping[str, TensorData | tuple] | None = None, manifest=None, *,
               overwrite: bool = False,
               progress: Callable[[int, int], None] | None = None) -> TransplantResult:
    """Writes dst: a copy of src with `replace` tensors' raw rows swapped and `add` tensors appended."""
    src, dst = Path(src), Path(dst)
    manifest = Path(manifest) if manifest is not None else dst.with_name(dst.name + ".manifest.json")
    _check_paths(src, dst, manifest, overwrite)
    with gguf.open(src) as g:
        repl = {n: _replacement(g, n, r) for n, r in replace.items()}
        adds = {n: _addition(g, n, t) for n, t in (add or {}).items()}
        segs, offsets, shift = _plan(g, repl, adds)
        out_size = segs[-1].start + segs[-1].length
        total, done = g.size + 2 * out_size, [0]

        def tick(n: int) -> None:
            done[0] += n
            if progress is not None:
                progress(done[0], total)

        hashed = [0]

        def on_hash(d: int, _total: int) -> None:
            tick(d - hashed[0])
            hashed[0] = d

        src_sha = g.sha256(on_hash)
        tick(g.size - hashed[0])
        with claim_tmp(dst) as tmp:     # a stale dst.tmp of a killed run is reused; a live run's refused
            with open(src, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as src_mm:
                _write(tmp, src_mm, segs, tick)
                dst_sha, from_src = _verify(tmp, src_mm, segs, tick)
            _check_structure(g, tmp, offsets, shift, adds)
            os.replace(tmp, dst)
        fsync_dir(Path(dst).parent)
        replaced = tuple(_record(n, g.tensors[n].type_name, g.tensors[n].shape, offsets[n], r)
                         for n, r in repl.items())
        added = tuple(_record(n, t.type_name, t.shape, offsets[n], t.raw) for n, t in adds.items())
    result = TransplantResult(src, dst, manifest, src_sha, dst_sha, out_size, replaced, added, from_src)
    _write_json(manifest, manifest_dict(result))
    return result


def manifest_dict(r: TransplantResult) -> dict:
    """The JSON manifest of a transplant (absolute paths, sha256 of input, output and each tensor)."""
    def rec(t: TensorRecord) -> dict:
        return {"name": t.name, "type": t.type_name, "shape": list(t.shape), "offset": t.offset,
                "nbytes": t.nbytes, "sha256": t.sha256}

    return {"kind": "exactedit.transplant", "version": 1,
            "src": {"path": str(r.src.resolve()), "sha256": r.src_sha256},
            "dst": {"path": str(r.dst.resolve()), "sha256": r.dst_sha256, "bytes": r.dst_bytes},
            "replaced": [rec(t) for t in r.replaced], "added": [rec(t) for t in r.added],
            "bytes_verified_from_src": r.bytes_from_src}
