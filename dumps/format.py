"""The dump format, version 1: manifest schema, documents, row-role bits and field specs per arch.

A dump is a directory holding `manifest.json` and one little-endian `.npy` file per field. This
module says what a valid dump is; `dumps.reader` and `dumps.writer` apply it to files and arrays.
The format is described for users in docs/dump-format.md.
"""
from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from exactedit.dumps.errors import DumpFormatError

FORMAT = "exactedit-dump"
VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_MAX_BYTES = 16 << 20
ARCHS = ("hc4", "rmsnorm")

# Row roles: bits of the optional `roles` field (uint8 [T]). A row is described by its *next* token:
# the row that reads token t and predicts token t+1 carries the bits of token t+1.
ROLE_PROMPT = 1 << 0      # next token is not assistant reply content (system/user turns, chat headers)
ROLE_REPLY = 1 << 1       # next token is part of an assistant reply (its closing <|im_end|> included)
ROLE_STEP0 = 1 << 2       # the row that predicts the first visible reply token (after any <think> block)
ROLE_REPLY_END = 1 << 3   # next token is the <|im_end|> that really closes an assistant reply
ROLE_THINK = 1 << 4       # next token lies in <think> ... </think> (tags included)
ROLE_TOOL = 1 << 5        # next token lies in <tool_call> ... </tool_call> (tags included)
ROLE_CODE = 1 << 6        # next token lies in a ``` code fence (fence lines included)
ROLE_ANCHOR = 1 << 7      # the user marked the row as an anchor (background the edit must leave alone)
ROLE_NAMES: dict[str, int] = {
    "prompt": ROLE_PROMPT, "reply": ROLE_REPLY, "step0": ROLE_STEP0, "reply_end": ROLE_REPLY_END,
    "think": ROLE_THINK, "tool": ROLE_TOOL, "code": ROLE_CODE, "anchor": ROLE_ANCHOR,
}

# Doc tags with a meaning the toolkit knows (users may add any others).
KNOWN_TAGS = ("style", "slop", "collateral", "anchor", "chat", "plain", "blind")

_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,123}\.npy")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FieldSpec:
    """One field: its numpy dtype (little-endian on disk) and dims, symbolic (T rows, S streams,
    n model width, h FFN hidden) or `None` for an extra field's free trailing dims."""

    name: str
    dtype: str
    dims: tuple[str, ...] | None


_COMMON = (FieldSpec("tokens", "int32", ("T",)), FieldSpec("next", "int32", ("T",)))
ROLES_SPEC = FieldSpec("roles", "uint8", ("T",))
ARCH_FIELDS: dict[str, tuple[FieldSpec, ...]] = {
    "hc4": _COMMON + (
        FieldSpec("R", "float32", ("T", "S", "n")),
        FieldSpec("inj", "float32", ("T", "S")),
        FieldSpec("hh", "float32", ("T", "h")),
        FieldSpec("sgv", "float32", ("T",)),
        FieldSpec("yr", "float32", ("T", "n")),
    ),
    "rmsnorm": _COMMON + (
        FieldSpec("R", "float32", ("T", "n")),
        FieldSpec("hh", "float32", ("T", "h")),
    ),
}
EXTRA_MAX_NDIM = 4


def field_spec(path, arch: str, name: str) -> FieldSpec:
    """The spec of field `name` in an `arch` dump: required, `roles`, or an extra float32 field
    (leading dim T, any trailing dims), which both archs allow (e.g. a post-FFN-norm tail's inputs)."""
    for spec in ARCH_FIELDS[arch]:
        if spec.name == name:
            return spec
    if name == ROLES_SPEC.name:
        return ROLES_SPEC
    if not isinstance(name, str) or not _FIELD_NAME.fullmatch(name):
        raise DumpFormatError(path, "fields", f"bad field name {name!r}; expected [A-Za-z_][A-Za-z0-9_]*")
    return FieldSpec(name, "float32", None)


def required_fields(arch: str) -> tuple[str, ...]:
    return tuple(spec.name for spec in ARCH_FIELDS[arch])


def _doc_error(name, field_name: str, message: str) -> DumpFormatError:
    return DumpFormatError(f"DocInfo({name!r})", field_name, message)


@dataclass(frozen=True)
class DocInfo:
    """One document of a dump: rows [first_row, first_row + rows), where it came from and tags.

    `source` and `character` are what splits group by (never rows); `tags` are free words such as
    "style", "slop", "collateral", "anchor", "chat", "blind" (see docs/dump-format.md)."""

    name: str
    first_row: int
    rows: int
    source: str
    character: str
    tags: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or len(self.name) > 256:
            raise _doc_error(self.name, "name", "expected a non-empty string of at most 256 characters")
        for key, low in (("first_row", 0), ("rows", 1)):
            value = getattr(self, key)
            if not is_int(value) or value < low:
                raise _doc_error(self.name, key, f"expected an integer >= {low}, got {value!r}")
            object.__setattr__(self, key, int(value))
        for key in ("source", "character"):
            if not isinstance(getattr(self, key), str):
                raise _doc_error(self.name, key, f"expected a string, got {getattr(self, key)!r}")
        tags = self.tags
        if isinstance(tags, str) or not isinstance(tags, (tuple, list)):
            raise _doc_error(self.name, "tags", f"expected a list of strings, got {tags!r}")
        if not all(isinstance(t, str) and t for t in tags):
            raise _doc_error(self.name, "tags", f"expected non-empty strings, got {list(tags)!r}")
        object.__setattr__(self, "tags", tuple(tags))

    @property
    def stop(self) -> int:
        return self.first_row + self.rows

    def to_json(self) -> dict:
        return {"name": self.name, "first_row": self.first_row, "rows": self.rows,
                "source": self.source, "character": self.character, "tags": list(self.tags)}


@dataclass(frozen=True)
class DumpExpect:
    """What a model needs of a dump: width n, FFN hidden h, vocabulary size, and optionally the
    stream count (hc4), the arch and the edited layer (from the model's tail)."""

    n: int
    h: int
    vocab: int
    streams: int | None = None
    arch: str | None = None
    layer: int | None = None

    def __post_init__(self):
        for key, low in (("n", 1), ("h", 1), ("vocab", 1), ("streams", 1), ("layer", 0)):
            value = getattr(self, key)
            if value is None and key in ("streams", "layer"):
                continue
            if not is_int(value) or value < low:
                raise DumpFormatError("DumpExpect", key, f"expected an integer >= {low}, got {value!r}")
            object.__setattr__(self, key, int(value))
        if self.arch is not None and self.arch not in ARCHS:
            raise DumpFormatError("DumpExpect", "arch", f"expected one of {ARCHS}, got {self.arch!r}")

    def check(self, path, arch: str, layer: int) -> None:
        """Raise unless a dump of `arch` at `layer` is what this model expects."""
        if self.arch is not None and arch != self.arch:
            raise DumpFormatError(path, "arch", f"the model expects a {self.arch!r} dump, got {arch!r}")
        if self.layer is not None and layer != self.layer:
            raise DumpFormatError(path, "layer", f"the model's edited layer is {self.layer}, the dump is of layer {layer}")


@dataclass(frozen=True)
class Manifest:
    """The parsed, type-checked `manifest.json` (shapes and values are checked against the files)."""

    arch: str
    layer: int
    rows: int
    fields: Mapping[str, str]
    sha256: Mapping[str, str]
    docs: tuple[DocInfo, ...]
    model_sha256: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "arch": self.arch, "layer": self.layer,
                "rows": self.rows, "model_sha256": self.model_sha256, "fields": dict(self.fields),
                "sha256": dict(self.sha256), "docs": [d.to_json() for d in self.docs],
                "meta": dict(self.meta)}

    @property
    def chat_framing(self) -> str | None:
        """Where the turn framing that labelled the row roles came from: "gguf" (the model's own
        template), "user:FILE" (a template the user gave), "fallback:NAME" (its template was refused
        or failed; the user named NAME), "default:chatml" (the model has no template); None when the
        dump does not say (roles given with the dump, or written before this was recorded:
        meta.import.chat_framing, meta.documents.chat.chat_framing for `engine dump`, meta.chat.chat_framing
        for `mine`, `dataset build` and `dataset corpus`)."""
        docs = self.meta.get("documents")
        for part in (self.meta.get("import"), docs.get("chat") if isinstance(docs, Mapping) else None,
                     self.meta.get("chat")):
            if isinstance(part, Mapping) and isinstance(part.get("chat_framing"), str):
                return part["chat_framing"]
        return None


_REQUIRED_KEYS = ("format", "version", "arch", "layer", "rows", "fields", "sha256", "docs")
_OPTIONAL_KEYS = ("model_sha256", "meta")


def parse_manifest(obj: Any, path) -> Manifest:
    """Type-check a decoded manifest.json; raise DumpFormatError naming the first bad key."""
    if not isinstance(obj, dict):
        raise DumpFormatError(path, "manifest", f"expected a JSON object, got {type(obj).__name__}")
    for key in _REQUIRED_KEYS:
        if key not in obj:
            raise DumpFormatError(path, key, "missing from manifest.json")
    unknown = sorted(set(obj) - set(_REQUIRED_KEYS) - set(_OPTIONAL_KEYS))
    if unknown:
        raise DumpFormatError(path, unknown[0], f"unknown manifest key (version {VERSION} has "
                              f"{', '.join(_REQUIRED_KEYS + _OPTIONAL_KEYS)})")
    if obj["format"] != FORMAT:
        raise DumpFormatError(path, "format", f"expected {FORMAT!r}, got {obj['format']!r}")
    if not is_int(obj["version"]) or obj["version"] != VERSION:
        raise DumpFormatError(path, "version", f"expected {VERSION}, got {obj['version']!r}")
    if obj["arch"] not in ARCHS:
        raise DumpFormatError(path, "arch", f"expected one of {ARCHS}, got {obj['arch']!r}")
    for key, low in (("layer", 0), ("rows", 1)):
        if not is_int(obj[key]) or obj[key] < low:
            raise DumpFormatError(path, key, f"expected an integer >= {low}, got {obj[key]!r}")
    model_sha = obj.get("model_sha256")
    if model_sha is not None and not (isinstance(model_sha, str) and _SHA256.fullmatch(model_sha)):
        raise DumpFormatError(path, "model_sha256", f"expected 64 lowercase hex digits or null, got {model_sha!r}")
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise DumpFormatError(path, "meta", f"expected a JSON object, got {type(meta).__name__}")
    fields = _parse_fields(obj, path)
    docs = tuple(_parse_doc(d, i, path) for i, d in enumerate(_as_list(obj["docs"], "docs", path)))
    check_docs(docs, obj["rows"], path)
    return Manifest(arch=obj["arch"], layer=obj["layer"], rows=obj["rows"], fields=fields[0],
                    sha256=fields[1], docs=docs, model_sha256=model_sha, meta=meta)


def _parse_fields(obj: dict, path) -> tuple[dict[str, str], dict[str, str]]:
    files, hashes = obj["fields"], obj["sha256"]
    for key, value in (("fields", files), ("sha256", hashes)):
        if not isinstance(value, dict):
            raise DumpFormatError(path, key, f"expected a JSON object name -> string, got {type(value).__name__}")
    for name, file in files.items():
        field_spec(path, obj["arch"], name)
        if not isinstance(file, str) or not _FILE_NAME.fullmatch(file):
            raise DumpFormatError(path, f"fields.{name}", f"expected a plain file name ending in .npy, got {file!r}")
    if len(set(files.values())) != len(files):
        raise DumpFormatError(path, "fields", "two fields name the same file")
    missing = [n for n in required_fields(obj["arch"]) if n not in files]
    if missing:
        raise DumpFormatError(path, f"fields.{missing[0]}",
                              f"required for arch {obj['arch']!r} (needs {', '.join(required_fields(obj['arch']))})")
    if set(hashes) != set(files):
        odd = sorted(set(hashes) ^ set(files))[0]
        raise DumpFormatError(path, f"sha256.{odd}", "sha256 must list exactly the fields")
    for name, digest in hashes.items():
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise DumpFormatError(path, f"sha256.{name}", f"expected 64 lowercase hex digits, got {digest!r}")
    return dict(files), dict(hashes)


def _parse_doc(obj: Any, index: int, path) -> DocInfo:
    where = f"docs[{index}]"
    if not isinstance(obj, dict):
        raise DumpFormatError(path, where, f"expected a JSON object, got {type(obj).__name__}")
    keys = ("name", "first_row", "rows", "source", "character")
    for key in keys:
        if key not in obj:
            raise DumpFormatError(path, f"{where}.{key}", "missing")
    unknown = sorted(set(obj) - set(keys) - {"tags"})
    if unknown:
        raise DumpFormatError(path, f"{where}.{unknown[0]}", "unknown document key")
    tags = obj.get("tags", [])
    if not isinstance(tags, list):
        raise DumpFormatError(path, f"{where}.tags", f"expected a list of strings, got {tags!r}")
    try:
        return DocInfo(obj["name"], obj["first_row"], obj["rows"], obj["source"], obj["character"], tuple(tags))
    except DumpFormatError as exc:
        raise DumpFormatError(path, f"{where}.{exc.field}", exc.message) from None


def check_docs(docs, rows: int, path) -> None:
    """Documents have unique names and partition rows [0, rows): in range, no overlap, no gap."""
    names = set()
    for doc in docs:
        if not isinstance(doc, DocInfo):
            raise DumpFormatError(path, "docs", f"expected DocInfo entries, got {type(doc).__name__}")
        if doc.name in names:
            raise DumpFormatError(path, f"docs.{doc.name}", "duplicate document name")
        names.add(doc.name)
        if doc.stop > rows:
            raise DumpFormatError(path, f"docs.{doc.name}",
                                  f"rows [{doc.first_row}, {doc.stop}) run past the dump's {rows} rows")
    covered = 0
    for doc in sorted(docs, key=lambda d: d.first_row):
        if doc.first_row < covered:
            raise DumpFormatError(path, f"docs.{doc.name}",
                                  f"starts at row {doc.first_row}, inside the previous document (ends at {covered})")
        if doc.first_row > covered:
            raise DumpFormatError(path, "docs", f"rows [{covered}, {doc.first_row}) belong to no document")
        covered = doc.stop
    if covered != rows:
        raise DumpFormatError(path, "docs", f"rows [{covered}, {rows}) belong to no document")


def check_shapes(path, arch: str, rows: int, shapes: Mapping[str, tuple[int, ...]],
                 expect: DumpExpect | None = None) -> dict[str, int]:
    """Unify every field's shape with its spec; return the dims found ({"S", "n", "h"})."""
    dims: dict[str, int] = {"T": rows}
    if expect is not None:
        dims.update(n=expect.n, h=expect.h)
        if expect.streams is not None and arch == "hc4":
            dims["S"] = expect.streams
    from_model = set(dims) - {"T"}
    for name, shape in shapes.items():
        spec = field_spec(path, arch, name)
        if spec.dims is None:
            if not 1 <= len(shape) <= EXTRA_MAX_NDIM or shape[0] != rows or 0 in shape:
                raise DumpFormatError(path, name, f"expected an extra field of shape [T={rows}, ...] with "
                                      f"at most {EXTRA_MAX_NDIM} non-empty dims, got {list(shape)}")
            continue
        if len(shape) != len(spec.dims):
            raise DumpFormatError(path, name, f"expected shape [{', '.join(spec.dims)}], got {list(shape)}")
        for sym, size in zip(spec.dims, shape):
            if size < 1:
                raise DumpFormatError(path, name, f"dim {sym} is empty in shape {list(shape)}")
            if dims.setdefault(sym, size) != size:
                origin = "the model" if sym in from_model else "rows" if sym == "T" else "the other fields"
                raise DumpFormatError(path, name, f"expected shape [{', '.join(spec.dims)}] with "
                                      f"{sym}={dims[sym]} (from {origin}), got {list(shape)}")
    return {k: v for k, v in dims.items() if k != "T"}


def _as_list(value, key: str, path) -> list:
    if not isinstance(value, list):
        raise DumpFormatError(path, key, f"expected a JSON list, got {type(value).__name__}")
    return value


def is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
