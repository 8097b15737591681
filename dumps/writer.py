"""Write a dump: arrays coerced to the format's dtypes and validated exactly as the reader would,
written under `<path>.tmp-<pid>`, fsynced, then renamed into place."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from exactedit.dumps.errors import DumpFormatError
from exactedit.dumps.format import (
    ARCHS, MANIFEST, MANIFEST_MAX_BYTES, DocInfo, DumpExpect, Manifest, is_int, check_docs, check_shapes, field_spec,
    parse_manifest, required_fields,
)
from exactedit.dumps.reader import Progress, check_values
from exactedit.files import fsync_dir, writing

_INT_RANGE = {"int32": (-(2 ** 31), 2 ** 31 - 1), "uint8": (0, 255)}


def coerce_field(path, arch: str, name: str, value) -> np.ndarray:
    """The C-ordered little-endian array the format stores for `name` (float32 activations, int32
    token ids, uint8 roles). Integers are range-checked before narrowing; floats that overflow
    float32 become inf and are refused by the value check."""
    spec = field_spec(path, arch, name)
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise DumpFormatError(path, name, f"not an array ({exc})") from None
    want = np.dtype(spec.dtype).newbyteorder("<")
    allowed = "fiu" if want.kind == "f" else "iu"
    if arr.dtype.kind not in allowed or arr.dtype.names is not None:
        kinds = "a real numeric" if want.kind == "f" else "an integer"
        raise DumpFormatError(path, name, f"dtype {arr.dtype}; expected {kinds} array (stored as {want.name})")
    if want.kind != "f" and arr.size:
        low, high = _INT_RANGE[spec.dtype]
        if int(arr.min()) < low or int(arr.max()) > high:
            raise DumpFormatError(path, name, f"values in [{int(arr.min())}, {int(arr.max())}] do not fit "
                                  f"{want.name} [{low}, {high}]")
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(arr.astype(want, copy=False))


def write_dump(path, *, arch: str, layer: int, fields: Mapping[str, Any], docs: Sequence[DocInfo],
               model_sha256: str | None = None, meta: Mapping[str, Any] | None = None,
               overwrite: bool = False, expect: DumpExpect | None = None,
               progress: Progress | None = None) -> Path:
    """Write a dump directory at `path` and return it. Refuses an existing `path` unless `overwrite`
    (and then only if it is a dump directory). `expect` also checks the arrays against a model."""
    path = Path(path)
    if arch not in ARCHS:
        raise DumpFormatError(path, "arch", f"expected one of {ARCHS}, got {arch!r}")
    missing = [n for n in required_fields(arch) if n not in fields]
    if missing:
        raise DumpFormatError(path, missing[0], f"required for arch {arch!r} (needs {', '.join(required_fields(arch))})")
    arrays = {name: coerce_field(path, arch, name, value) for name, value in fields.items()}
    rows = int(arrays["tokens"].shape[0]) if arrays["tokens"].ndim == 1 else -1
    if rows < 1:
        raise DumpFormatError(path, "tokens", f"expected shape [T] with T >= 1, got {list(arrays['tokens'].shape)}")
    docs = tuple(docs)
    check_docs(docs, rows, path)
    if expect is not None:
        expect.check(path, arch, layer)
    check_shapes(path, arch, rows, {k: a.shape for k, a in arrays.items()}, expect)
    check_values(path, arrays, expect.vocab if expect is not None else None)
    layer = int(layer) if is_int(layer) else layer
    meta = dict(meta or {})
    try:
        json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DumpFormatError(path, "meta", f"expected a JSON-serializable object ({exc})") from None
    files = {name: f"{name}.npy" for name in arrays}
    manifest = {"format": "exactedit-dump", "version": 1, "arch": arch, "layer": layer, "rows": rows,
                "model_sha256": model_sha256, "fields": files, "sha256": {n: "0" * 64 for n in files},
                "docs": [d.to_json() for d in docs], "meta": meta}
    # the same checks the reader applies, before anything is written; its size too (the hashes
    # written later are as long as these zeros)
    text = json.dumps(parse_manifest(manifest, path).to_json(), indent=1, ensure_ascii=True, allow_nan=False) + "\n"
    if len(text) > MANIFEST_MAX_BYTES:
        raise DumpFormatError(path, MANIFEST, f"{len(text)} bytes ({len(docs)} documents), over the limit of "
                              f"{MANIFEST_MAX_BYTES} a dump's manifest is read back with; write fewer documents")
    _refuse_existing(path, overwrite)

    tmp = path.parent / f"{path.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        total = sum(int(a.nbytes) for a in arrays.values())
        done = 0
        for name, arr in arrays.items():
            manifest["sha256"][name] = _write_npy(tmp / files[name], arr)
            done += int(arr.nbytes)
            if progress is not None:
                progress(done, total)
        parsed: Manifest = parse_manifest(manifest, path)
        text = json.dumps(parsed.to_json(), indent=1, ensure_ascii=True, allow_nan=False) + "\n"
        _write_bytes(tmp / MANIFEST, text.encode())
        fsync_dir(tmp)
        _replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _refuse_existing(path: Path, overwrite: bool) -> None:
    if not path.exists() and not path.is_symlink():
        return
    if not overwrite:
        raise DumpFormatError(path, "path", "already exists; expected a new path (or overwrite=True)")
    if not path.is_dir() or path.is_symlink() or not (path / MANIFEST).is_file():
        raise DumpFormatError(path, "path", "exists and is not a dump directory; refusing to replace it")


def _replace(tmp: Path, path: Path) -> None:
    old = None
    if path.exists():
        old = path.parent / f"{path.name}.old-{os.getpid()}"
        path.rename(old)
    tmp.rename(path)
    fsync_dir(path.parent)
    if old is not None:
        shutil.rmtree(old)


class _HashingWriter:
    """A write-only file wrapper that hashes what passes through (numpy then writes in chunks)."""

    def __init__(self, f):
        self.f, self.digest = f, hashlib.sha256()

    def write(self, data) -> int:
        self.digest.update(data)
        return self.f.write(data)


def _write_npy(file: Path, arr: np.ndarray) -> str:
    with writing(file), open(file, "wb") as f:
        sink = _HashingWriter(f)
        np.lib.format.write_array(sink, arr, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return sink.digest.hexdigest()


def _write_bytes(file: Path, data: bytes) -> None:
    with writing(file), open(file, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
