"""Bundle directories: what a solver ships. Generic over solvers (head, wfld).

A bundle holds a list of tensor edits, each either a row patch (`kind = "rows"`, the quant.gguf.patch
file format: the edited rows' ids and raw bytes) or a whole tensor's raw bytes (`kind = "tensor"`),
plus any report files, and `manifest.json`:

    kind "exactedit.bundle", version 1, solver, created (UTC),
    inputs:  [{role, path, sha256}]            model, dumps, protocol, ...
    config:  the solver's full config
    edits:   [{tensor, kind, type, shape, file, sha256, rows (row patches)}]
    files:   {name: sha256}                     every other file (reports, PNG)
    record:  solver-specific JSON (trajectory, chosen step, summary)
    ledger_head: {seq, hash, ledger} or null    the evals ledger's head when the bundle was written
                                                (an anchor: `exactedit eval ledger --verify --against`)

Writing: every file goes into `DIR.tmp/` (fsynced), then the directory is renamed to DIR. Reading
validates the manifest and re-hashes every file. A bundle is untrusted input: each file is read
once, without blocking (a FIFO, a device or a symlink loop is refused by name), and bounded: the
manifest by MAX_MANIFEST_BYTES, a report by MAX_FILE_BYTES, an edit's file by the size its entry
declares (shape, type, row ids), checked before a byte of it is read; and what the edits declare is
bounded before any edit file is read: at most MAX_EDIT_BYTES in all, and, when the target model's
tensors are given (`read_bundle(path, tensors=...)`, as `apply` does), each edit a tensor of that
model with its type and shape, at most its rows, no tensor twice. `write_bundle` refuses what
these readers would refuse (a report over MAX_FILE_BYTES, edits over MAX_EDIT_BYTES).

`Bundle.sha256` is the bundle's identity: the sha256 of what decides the edit, i.e. the solver, the
inputs' roles and sha256 (not their paths), the full config, and each edit's content (tensor, kind,
type, shape, row ids, bytes). Reports, timings and the creation time are not part of it, so solving
the same inputs with the same config again gives the same identity (test-once and the blind
sign-off key on it); every file is still checked against the manifest when a bundle is read.
`Bundle.manifest_sha256` is the hash of the manifest file itself.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from exactedit import quant
from exactedit.errors import ExacteditError, FieldError
from exactedit.files import file_sha256, fsync_dir, output_lock, read_regular, writing
from exactedit.quant.gguf.patch import RowPatchError, parse_row_patch, write_row_patch

KIND = "exactedit.bundle"
VERSION = 1
MANIFEST = "manifest.json"
EDIT_KINDS = ("rows", "tensor")
MAX_MANIFEST_BYTES = 16 << 20    # manifest.json, read whole: a full-vocabulary row list is ~3 MB of it
MAX_FILE_BYTES = 64 << 20        # a report or PNG listed in `files` (hashed, never held); an edit's
                                 # file is bounded by the size its manifest entry declares
MAX_EDIT_BYTES = 8 << 30         # what a bundle's edits declare in all (each is read whole, and held):
                                 # a whole 262k x 5376 Q6_K head is 1.2 GB


class BundleError(FieldError):
    """A bundle directory is malformed, altered, or cannot be written."""


@dataclass(frozen=True)
class TensorEdit:
    """New bytes for one tensor: `row_ids` + their rows (kind "rows"), or every row ("tensor")."""

    tensor: str
    kind: str
    type_name: str
    shape: tuple[int, int]          # (rows, cols) of the whole tensor
    raw: np.ndarray                 # uint8 [k or rows, row_bytes]
    row_ids: np.ndarray | None = None

    def __post_init__(self):
        where = f"edit {self.tensor!r}"
        if self.kind not in EDIT_KINDS:
            raise BundleError(where, "kind", f"expected one of {EDIT_KINDS}, got {self.kind!r}")
        rows, cols = (int(x) for x in self.shape)
        object.__setattr__(self, "shape", (rows, cols))
        rb = quant.row_bytes(self.type_name, cols)
        raw = np.asarray(self.raw)
        if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != rb:
            raise BundleError(where, "raw", f"expected uint8 [k, {rb}] ({self.type_name} rows of {cols}), "
                              f"got {raw.dtype} {list(raw.shape)}")
        if self.kind == "tensor":
            if raw.shape[0] != rows or self.row_ids is not None:
                raise BundleError(where, "raw", f"a whole-tensor edit needs all {rows} rows and no row ids")
        else:
            ids = np.asarray(self.row_ids if self.row_ids is not None else [], dtype=np.int64)
            if ids.shape != (raw.shape[0],) or (ids.size and (ids.min() < 0 or ids.max() >= rows)):
                raise BundleError(where, "row_ids", f"expected {raw.shape[0]} ids in [0, {rows})")
            if len(np.unique(ids)) != len(ids):
                raise BundleError(where, "row_ids", "repeat a row")
            object.__setattr__(self, "row_ids", ids)

    @property
    def file_name(self) -> str:
        suffix = ".q6k" if self.kind == "rows" and self.type_name == "Q6_K" else \
            (".rows" if self.kind == "rows" else ".raw")
        return self.tensor + suffix


@dataclass(frozen=True)
class InputRef:
    role: str
    path: str
    sha256: str


def _file_size(e: TensorEdit) -> int:
    """The bytes of an edit's file: a row patch's uint32 count, then per row a uint32 id and the
    row; a whole tensor's rows."""
    k, rb = np.asarray(e.raw).shape
    return 4 + k * (4 + rb) if e.kind == "rows" else k * rb


def edit_digest(e: TensorEdit) -> str:
    """sha256 of an edit's content: name, kind, type, shape, row ids (uint32 LE) and bytes."""
    h = hashlib.sha256(json.dumps([e.tensor, e.kind, e.type_name, list(e.shape)]).encode())
    if e.row_ids is not None:
        h.update(np.asarray(e.row_ids, dtype="<u4").tobytes())
    h.update(np.ascontiguousarray(e.raw).tobytes())
    return h.hexdigest()


def bundle_identity(solver: str, inputs: Sequence[InputRef], config: Mapping[str, Any],
                    edits: Sequence[TensorEdit]) -> str:
    """The bundle's identity (see the module docstring); computable before anything is written."""
    obj = {"kind": KIND, "version": VERSION, "solver": solver,
           "inputs": sorted([r.role, r.sha256] for r in inputs), "config": dict(config),
           "edits": [edit_digest(e) for e in edits]}
    return _sha256_bytes(json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode())


@dataclass(frozen=True)
class Bundle:
    path: Path
    sha256: str                     # identity (see the module docstring)
    manifest_sha256: str
    solver: str
    inputs: tuple[InputRef, ...]
    config: Mapping[str, Any]
    edits: tuple[TensorEdit, ...]
    files: Mapping[str, str]
    record: Mapping[str, Any] = field(default_factory=dict)
    ledger_head: Mapping[str, Any] | None = None

    def input(self, role: str) -> InputRef:
        for ref in self.inputs:
            if ref.role == role:
                return ref
        raise BundleError(self.path, "inputs", f"no input with role {role!r}")


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_file(path: Path, data: bytes) -> None:
    with writing(path), open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def write_bundle(out, *, solver: str, inputs: Sequence[InputRef], config: Mapping[str, Any],
                 edits: Sequence[TensorEdit], files: Mapping[str, bytes] | None = None,
                 record: Mapping[str, Any] | None = None, ledger_head: Mapping[str, Any] | None = None,
                 overwrite: bool = False) -> Bundle:
    """Write a bundle directory at `out` (via `out.tmp`, then rename); returns it as read back.
    `ledger_head` ({seq, hash, ledger}, handed in by the caller that holds the ledger) is recorded
    as is; like the reports and the creation time it is not part of the identity."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise BundleError(out, "output", "exists; pass overwrite to replace it")
    names = [e.file_name for e in edits] + list(files or {})
    total = sum(_file_size(e) for e in edits)
    if total > MAX_EDIT_BYTES:                      # no reader would take it
        raise BundleError(out, "edits", f"{total} bytes of edits, over the limit of {MAX_EDIT_BYTES}")
    for name, data in (files or {}).items():
        if len(data) > MAX_FILE_BYTES:
            raise BundleError(out, name, f"{len(data)} bytes, over the limit of {MAX_FILE_BYTES} for a bundle's file")
    if len(set(names)) != len(names) or MANIFEST in names:
        raise BundleError(out, "files", f"file names must be distinct and not {MANIFEST}: {names}")
    for name in names:
        if Path(name).name != name or name.startswith("."):
            raise BundleError(out, "files", f"{name!r} is not a plain file name")
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):          # one run at a time writes `out` (another is refused, not clobbered)
        _write_bundle_dir(out, out.with_name(out.name + ".tmp"), solver, inputs, config, edits, files, record,
                          ledger_head)
    return read_bundle(out)


def _write_bundle_dir(out: Path, tmp: Path, solver, inputs, config, edits, files, record, ledger_head) -> None:
    if tmp.exists():                # left by a killed run: ours by name, and the lock says no run holds it
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        edit_entries = []
        for e in edits:
            path = tmp / e.file_name
            if e.kind == "rows":
                write_row_patch(path, e.row_ids, e.raw)
            else:
                _write_file(path, np.ascontiguousarray(e.raw).tobytes())
            entry = {"tensor": e.tensor, "kind": e.kind, "type": e.type_name, "shape": list(e.shape),
                     "file": e.file_name, "sha256": file_sha256(path)}
            if e.kind == "rows":
                entry["rows"] = [int(r) for r in e.row_ids]
            edit_entries.append(entry)
        hashes = {}
        for name, data in (files or {}).items():
            _write_file(tmp / name, data)
            hashes[name] = _sha256_bytes(data)
        manifest = {
            "kind": KIND, "version": VERSION, "solver": solver,
            "identity": bundle_identity(solver, inputs, config, edits),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "inputs": [{"role": r.role, "path": r.path, "sha256": r.sha256} for r in inputs],
            "config": dict(config), "edits": edit_entries, "files": hashes, "record": dict(record or {}),
            "ledger_head": _ledger_head(out, ledger_head),
        }
        data = json.dumps(manifest, indent=1, allow_nan=False).encode("utf-8")
        if len(data) > MAX_MANIFEST_BYTES:          # no reader would take it
            raise BundleError(out, MANIFEST, f"{len(data)} bytes, over the limit of {MAX_MANIFEST_BYTES}")
        _write_file(tmp / MANIFEST, data)
        fsync_dir(tmp)
        if out.exists():
            old = out.with_name(out.name + ".old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
        fsync_dir(out.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _need(path, obj: Mapping, key: str, kind, where: str = ""):
    name = f"{where}.{key}" if where else key
    if not isinstance(obj, Mapping) or key not in obj:
        raise BundleError(path, name, "missing")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise BundleError(path, name, f"expected {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


Tensors = Mapping[str, tuple[str, tuple[int, ...]]]     # tensor name -> (ggml type, shape) of a model


def model_tensors(g) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensors of an open GGUF as `read_bundle` bounds a bundle's edits by: name -> (type, shape)."""
    return {name: (info.type_name, tuple(int(x) for x in info.shape)) for name, info in g.tensors.items()}


def read_bundle(path, tensors: Tensors | None = None) -> Bundle:
    """Read and validate a bundle: manifest schema, every file's sha256, every edit's bytes. With
    `tensors` (`model_tensors` of the model the edits are for), every edit must be one of them, of
    its type and shape, each at most once: checked before any edit file is read, like the
    MAX_EDIT_BYTES cap on what the edits declare in all."""
    path = Path(path)
    file = path / MANIFEST
    if not os.path.lexists(file):
        raise BundleError(path, MANIFEST, "missing; not a bundle directory")
    data = read_regular(file, MAX_MANIFEST_BYTES, BundleError, "manifest")     # a FIFO or device refused
    try:
        m = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BundleError(path, MANIFEST, f"not valid UTF-8 JSON ({exc})") from None
    except RecursionError:
        raise BundleError(path, MANIFEST, "not valid JSON (nested too deeply)") from None
    if not isinstance(m, dict) or m.get("kind") != KIND or m.get("version") != VERSION:
        raise BundleError(path, "kind", f"expected kind {KIND!r} version {VERSION}")
    solver = _need(path, m, "solver", str)
    inputs = tuple(InputRef(_need(path, r, "role", str, f"inputs[{i}]"), _need(path, r, "path", str, f"inputs[{i}]"),
                            _need(path, r, "sha256", str, f"inputs[{i}]"))
                   for i, r in enumerate(_need(path, m, "inputs", list)))
    config = _need(path, m, "config", dict)
    files = _need(path, m, "files", dict)
    record = _need(path, m, "record", dict)
    for name, sha in files.items():
        _check_file(path, name, sha)
    entries = [_edit_entry(path, i, e, tensors) for i, e in enumerate(_need(path, m, "edits", list))]
    _bound_edits(path, entries, tensors is not None)
    edits = tuple(_read_edit(path, entry) for entry in entries)
    ident = bundle_identity(solver, inputs, config, edits)
    if m.get("identity") != ident:
        raise BundleError(path, "identity", f"{m.get('identity')!r} does not match the bundle's content ({ident})")
    return Bundle(path, ident, _sha256_bytes(data), solver, inputs, config, edits, dict(files), record,
                  _ledger_head(path, m.get("ledger_head")))


def _ledger_head(path, head) -> dict | None:
    """None, or {seq: int >= 0, hash: 64 hex digits, ledger: str}."""
    if head is None:
        return None
    seq, h = (head.get("seq"), head.get("hash")) if isinstance(head, Mapping) else (None, None)
    if not (isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 and isinstance(h, str) and len(h) == 64
            and all(c in "0123456789abcdef" for c in h) and isinstance(head.get("ledger", ""), str)):
        raise BundleError(path, "ledger_head", f"expected null or {{seq, hash, ledger}}, got {head!r}")
    return {"seq": seq, "hash": h, "ledger": head.get("ledger", "")}


def _file(path: Path, name, sha) -> Path:
    """The bundle's file `name` (a plain file name present in the directory), else BundleError."""
    if not isinstance(name, str) or Path(name).name != name or not isinstance(sha, str):
        raise BundleError(path, "files", f"bad entry {name!r}: {sha!r}")
    f = path / name
    if not os.path.lexists(f):
        raise BundleError(path, name, "listed in the manifest but missing")
    return f


def _altered(path: Path, name: str, got: str, sha: str) -> None:
    if got != sha:
        raise BundleError(path, name, f"sha256 differs from the manifest's {sha}: the bundle was altered")


def _check_file(path: Path, name, sha) -> None:
    """A listed report or PNG: a regular file of at most MAX_FILE_BYTES (read without blocking: a
    FIFO or device is refused, not waited on) with the manifest's sha256."""
    data = read_regular(_file(path, name, sha), MAX_FILE_BYTES, BundleError, "files")
    _altered(path, name, _sha256_bytes(data), sha)


@dataclass(frozen=True)
class _EditEntry:
    """An edit's manifest entry, validated, with the size its file must have."""

    where: str
    tensor: str
    kind: str
    type_name: str
    shape: tuple[int, int]
    row_bytes: int
    rows: list | None
    name: str
    sha: str
    size: int


def _edit_entry(path: Path, i: int, e, tensors: Tensors | None) -> _EditEntry:
    where = f"edits[{i}]"
    tensor = _need(path, e, "tensor", str, where)
    kind = _need(path, e, "kind", str, where)
    type_name = _need(path, e, "type", str, where)
    shape = _need(path, e, "shape", list, where)
    if len(shape) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape):
        raise BundleError(path, f"{where}.shape", f"expected [rows, cols] of positive integers, got {shape}")
    if type_name not in quant.SUPPORTED:
        raise BundleError(path, f"{where}.type", f"expected one of {quant.SUPPORTED}, got {type_name!r}")
    if kind not in EDIT_KINDS:
        raise BundleError(path, f"{where}.kind", f"expected one of {EDIT_KINDS}, got {kind!r}")
    if tensors is not None:
        if tensor not in tensors:
            raise BundleError(path, f"{where}.tensor", f"{tensor!r:.200} is not a tensor of the model")
        if tensors[tensor] != (type_name, tuple(shape)):
            want_type, want_shape = tensors[tensor]
            raise BundleError(path, f"{where}.shape", f"{type_name} {shape}; the model's {tensor} is "
                              f"{want_type} {list(want_shape)}")
    try:
        rb = quant.row_bytes(type_name, shape[1])
    except ExacteditError as exc:
        raise BundleError(path, f"{where}.shape", str(exc)) from None
    rows = _need(path, e, "rows", list, where) if kind == "rows" else None
    if rows is not None and len(rows) > shape[0]:
        raise BundleError(path, f"{where}.rows", f"{len(rows)} row ids for a tensor of {shape[0]} rows")
    # the file's size follows from the entry (uint32 count + per row a uint32 id and the row; or
    # every row): checked before a byte is read, so an edit file is never read past what it declares
    size = 4 + len(rows) * (4 + rb) if rows is not None else shape[0] * rb
    name, sha = _need(path, e, "file", str, where), _need(path, e, "sha256", str, where)
    return _EditEntry(where, tensor, kind, type_name, (shape[0], shape[1]), rb, rows, name, sha, size)


def _bound_edits(path: Path, entries: Sequence[_EditEntry], per_model: bool) -> None:
    """What the edits declare, bounded before any of their files is read: MAX_EDIT_BYTES in all
    (naming the first edit that passes it); against a model, no tensor edited twice."""
    total = 0
    for e in entries:
        total += e.size
        if total > MAX_EDIT_BYTES:
            what = "rows" if e.rows is not None else "shape"
            raise BundleError(path, f"{e.where}.{what}", f"declares {e.size} bytes ({total} with the edits "
                              f"before it), over the limit of {MAX_EDIT_BYTES} bytes of edits in a bundle")
    if per_model:
        seen = set()
        for e in entries:
            if e.tensor in seen:
                raise BundleError(path, f"{e.where}.tensor", f"{e.tensor!r:.200} is edited twice")
            seen.add(e.tensor)


def _read_edit(path: Path, entry: _EditEntry) -> TensorEdit:
    where, tensor, kind, type_name, shape = entry.where, entry.tensor, entry.kind, entry.type_name, entry.shape
    rb, rows, name, sha, size = entry.row_bytes, entry.rows, entry.name, entry.sha, entry.size
    f = _file(path, name, sha)
    data = read_regular(f, size, BundleError, f"{where}.file")
    if len(data) != size:
        raise BundleError(path, f"{where}.file", f"{len(data)} bytes; expected {size} ("
                          + (f"{len(rows)} rows of 4 + {rb}, after a 4-byte count)" if rows is not None
                             else f"{shape[0]} rows x {rb})"))
    _altered(path, name, _sha256_bytes(data), sha)
    if rows is not None:
        try:
            patch = parse_row_patch(data, f, rb)
        except RowPatchError as exc:
            raise BundleError(path, f"{where}.file", str(exc)) from None
        if [int(r) for r in patch.row_ids] != rows:
            raise BundleError(path, f"{where}.rows", "differ from the row ids in the patch file")
        raw, ids = patch.raw, patch.row_ids.astype(np.int64)
    else:
        raw, ids = np.frombuffer(data, np.uint8).reshape(shape[0], rb), None
    try:
        return TensorEdit(tensor, kind, type_name, (shape[0], shape[1]), raw, ids)
    except BundleError as exc:
        raise BundleError(path, where, str(exc)) from None
