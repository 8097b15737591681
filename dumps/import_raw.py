"""`exactedit dump import`: raw little-endian field files + a small TOML -> a version-1 dump.

A production engine writes plain arrays (no `.npy` header, no hashes). The directory it leaves
holds one file per field and `dump.toml` saying what each file is:

    arch = "hc4"                    # or "rmsnorm"
    layer = 47
    model_sha256 = "..."            # optional: the GGUF the engine ran
    [fields.tokens]
    file = "tokens.i32"
    dtype = "int32"
    shape = ["T"]                   # "T" (first dimension only): the row count, read off the tokens file
    [fields.R]
    file = "R.f32"
    dtype = "float32"
    shape = ["T", 4, 2560]
    ...
    [[docs]]                        # optional; default: one document of all rows
    name = "trace-01"
    rows = 512
    source = "prod"
    character = "mika"
    tags = ["chat", "slop"]

Every file's size must be exactly its dtype's itemsize times the product of its shape: anything
else is a `DumpFormatError` naming the file, the field and both sizes. dtypes: float32, float16,
bfloat16 (widened to float32 exactly), int32, int64, uint32, uint16, uint8. `next` may be
omitted: it is derived per document (the next token, -1 at a document's last row). `roles` may be
omitted: `roles(tokens)` (a callable the caller hands in, e.g. from the model's chat framing,
native/llamacpp/documents.py) derives them per document. The dump is then written by `write_dump`, which
checks everything the reader checks and records each field's sha256.

The spec is checked whole: an unknown key is refused with the nearest valid one, every value's type
is checked (`tags = "style"` is not a list), a field file must be a regular file inside the
directory (a link leading out of it is refused), `next` (when given) must be the next token within
each document, and `roles` (when given) must not contradict itself (PROMPT with REPLY; STEP0 or
REPLY_END without REPLY; STEP0 inside THINK). Fields are memory-mapped, and converted (float16,
bfloat16, int64, ...) in chunks of CHUNK_BYTES into a scratch file beside the output, so memory
stays bounded whatever the fields' sizes.
"""
from __future__ import annotations

import difflib
import hashlib
import math
import os
import shutil
import stat
import tomllib
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit.dumps.errors import DumpFormatError
from exactedit.dumps.format import (
    ARCHS, ROLE_PROMPT, ROLE_REPLY, ROLE_REPLY_END, ROLE_STEP0, ROLE_THINK, DocInfo, DumpExpect, field_spec, is_int,
    required_fields,
)
from exactedit.dumps.roles import mark_docs
from exactedit.dumps.writer import write_dump

SPEC_NAME = "dump.toml"
DTYPES = {"float32": "<f4", "float16": "<f2", "bfloat16": "<u2", "int32": "<i4", "int64": "<i8",
          "uint32": "<u4", "uint16": "<u2", "uint8": "u1"}
Roles = Callable[[np.ndarray], np.ndarray]
SPEC_KEYS = ("arch", "layer", "model_sha256", "T", "fields", "docs")
FIELD_KEYS = ("file", "dtype", "shape")
DOC_KEYS = ("name", "rows", "source", "character", "tags")
MAX_SPEC_BYTES = 1 << 24
CHUNK_BYTES = 1 << 26
_INT_RANGE = {"int32": (-(2 ** 31), 2 ** 31 - 1), "uint8": (0, 255)}


def _known(path, where: str, table: dict, allowed) -> None:
    """Refuse a key the format does not define, naming the nearest valid one."""
    for key in table:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.5)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise DumpFormatError(path, f"{where}{key}", f"unknown key; {hint}expected one of {list(allowed)}")


def _regular(path: Path, field: str) -> int:
    """The size of a regular file (refusing FIFOs, devices, directories: they block or never end)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise DumpFormatError(path, field, f"cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise DumpFormatError(path, field, "not a regular file")
    return st.st_size


def read_spec(src) -> tuple[Path, dict]:
    """The TOML spec of a raw dump directory (or the TOML file itself) and its directory."""
    src = Path(src)
    path = src / SPEC_NAME if src.is_dir() else src
    if _regular(path, "spec") > MAX_SPEC_BYTES:
        raise DumpFormatError(path, "spec", f"more than {MAX_SPEC_BYTES} bytes")
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise DumpFormatError(path, "spec", f"cannot read ({exc})") from None
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise DumpFormatError(path, "spec", f"not valid TOML ({exc})"[:300]) from None
    _known(path, "", spec, SPEC_KEYS)
    if not isinstance(spec.get("arch"), str) or spec["arch"] not in ARCHS:
        raise DumpFormatError(path, "arch", f"expected one of {ARCHS}, got {spec.get('arch')!r}")
    if not is_int(spec.get("layer")) or spec["layer"] < 0:
        raise DumpFormatError(path, "layer", f"expected an integer >= 0, got {spec.get('layer')!r}")
    if not isinstance(spec.get("fields"), dict) or not spec["fields"]:
        raise DumpFormatError(path, "fields", "expected a [fields.NAME] table per field")
    sha = spec.get("model_sha256")
    if sha is not None and not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        raise DumpFormatError(path, "model_sha256", f"expected 64 lowercase hex digits, got {sha!r}"[:200])
    for name, entry in spec["fields"].items():
        _entry(path, name, entry)
        _known(path, f"fields.{name}.", entry, FIELD_KEYS)
        field_spec(path, spec["arch"], name)          # a valid field name
    return path, spec


def _rows_from(path: Path, spec: dict) -> int:
    """T: the `T` key, else the tokens file's size over its item size."""
    if "T" in spec:
        if not is_int(spec["T"]) or spec["T"] < 1:
            raise DumpFormatError(path, "T", f"expected an integer >= 1, got {spec['T']!r}")
        return int(spec["T"])
    tok = spec["fields"].get("tokens")
    if not isinstance(tok, dict):
        raise DumpFormatError(path, "fields.tokens", "required (the token ids of the trace)")
    f = _file(path, "tokens", tok)
    size = f.stat().st_size
    item = np.dtype(_dtype(path, "tokens", tok)).itemsize
    if size == 0 or size % item:
        raise DumpFormatError(f, "tokens", f"{size} bytes is not a whole number of {tok.get('dtype')} ids")
    return size // item


def _dtype(path, name, entry) -> str:
    dt = entry.get("dtype")
    if not isinstance(dt, str) or dt not in DTYPES:
        raise DumpFormatError(path, f"fields.{name}.dtype", f"expected one of {sorted(DTYPES)}, got {dt!r}")
    return DTYPES[dt]


def _file(path: Path, name: str, entry: dict) -> Path:
    rel = entry.get("file")
    if not isinstance(rel, str) or not rel or "\0" in rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise DumpFormatError(path, f"fields.{name}.file", f"expected a file name inside the directory, got {rel!r}")
    f = path.parent / rel
    if not f.exists() and not f.is_symlink():
        raise DumpFormatError(f, name, "no such file")
    try:
        inside = f.resolve(strict=True).is_relative_to(path.parent.resolve(strict=True))
    except (OSError, RuntimeError) as exc:             # a dangling link or a link loop
        raise DumpFormatError(f, name, f"cannot be resolved ({exc})") from None
    if not inside:
        raise DumpFormatError(path, f"fields.{name}.file", f"{rel!r} leads out of the directory "
                              f"(to {f.resolve()}); expected a file inside it")
    _regular(f, name)
    return f


def _shape(path, name, entry, T: int) -> tuple[int, ...]:
    shape = entry.get("shape")
    if not isinstance(shape, list) or not shape:
        raise DumpFormatError(path, f"fields.{name}.shape", f"expected a list of dimensions, got {shape!r}")
    out = []
    for i, d in enumerate(shape):
        if d == "T" and i == 0:
            out.append(T)
        elif is_int(d) and d >= 1:
            out.append(int(d))
        else:
            raise DumpFormatError(path, f"fields.{name}.shape", f"dimension {i} is {d!r}; expected an integer "
                                  ">= 1 (or \"T\" as the first)")
    return tuple(out)


def _mapped(path: Path, name: str, entry: dict, T: int) -> tuple[Path, np.ndarray]:
    """(file, read-only memmap of its stated dtype and shape) after the size check."""
    f = _file(path, name, entry)
    dt = _dtype(path, name, entry)
    shape = _shape(path, name, entry, T)
    need = np.dtype(dt).itemsize * math.prod(shape)
    size = f.stat().st_size
    if size != need:
        raise DumpFormatError(f, name, f"{size} bytes, but {entry['dtype']} {list(shape)} needs {need} bytes "
                              f"({size / max(need, 1):.4g}x)")
    return f, np.memmap(f, dtype=dt, mode="r", shape=shape)


def _convert(chunk: np.ndarray, bf16: bool, want: np.dtype) -> np.ndarray:
    return (chunk.astype(np.uint32) << 16).view(np.float32) if bf16 else chunk.astype(want)


def stage_field(path: Path, arch: str, name: str, entry: dict, T: int, scratch: Path) -> np.ndarray:
    """One raw field as the dump stores it, without reading it whole: the file itself (memmap)
    when its dtype is the stored one, else converted in chunks into `scratch` and mapped from
    there. Integers are range-checked chunk by chunk before they are narrowed."""
    f, raw = _mapped(path, name, entry, T)
    want = np.dtype(field_spec(path, arch, name).dtype).newbyteorder("<")
    bf16 = entry["dtype"] == "bfloat16"
    if not bf16 and raw.dtype == want:
        return raw
    if want.kind != "f" and raw.dtype.kind not in "iu":
        raise DumpFormatError(f, name, f"dtype {entry['dtype']}; expected an integer dtype (stored as {want.name})")
    if want.kind != "f" and bf16:
        raise DumpFormatError(f, name, f"dtype bfloat16; expected an integer dtype (stored as {want.name})")
    scratch.mkdir(parents=True, exist_ok=True)
    out = np.lib.format.open_memmap(scratch / f"{name}.npy", mode="w+", dtype=want, shape=raw.shape)
    row = max(1, raw[:1].nbytes)
    step = max(1, CHUNK_BYTES // row)
    for a in range(0, raw.shape[0], step):
        chunk = np.asarray(raw[a:a + step])
        if want.kind != "f" and chunk.size:
            low, high = _INT_RANGE[want.name]
            bad = (chunk < low) | (chunk > high)
            if bad.any():
                i = int(np.flatnonzero(bad.reshape(-1))[0])
                raise DumpFormatError(f, name, f"row {a + i // max(1, chunk[:1].size)}: value "
                                      f"{int(chunk.reshape(-1)[i])} does not fit {want.name} [{low}, {high}]")
        out[a:a + step] = _convert(chunk, bf16, want)
    out.flush()
    del out
    return np.load(scratch / f"{name}.npy", mmap_mode="r")


def _docs(path: Path, spec: dict, T: int, tokens: np.ndarray, src_name: str) -> list[DocInfo]:
    raw = spec.get("docs")
    if raw is None:
        digest = hashlib.sha256(np.ascontiguousarray(tokens, "<i4").tobytes()).hexdigest()[:12]
        return [DocInfo(f"{src_name}-{digest}", 0, T, src_name, "", ())]
    if not isinstance(raw, list) or not raw:
        raise DumpFormatError(path, "docs", "expected [[docs]] tables with name and rows")
    out, first = [], 0
    for i, d in enumerate(raw):
        if not isinstance(d, dict) or not is_int(d.get("rows")) or d["rows"] < 1:
            raise DumpFormatError(path, f"docs[{i}]", f"expected name and rows >= 1, got {d!r}"[:200])
        _known(path, f"docs[{i}].", d, DOC_KEYS)
        for key in ("name", "source", "character"):
            if key in d and not isinstance(d[key], str):
                raise DumpFormatError(path, f"docs[{i}].{key}", f"expected a string, got {d[key]!r}"[:200])
        tags = d.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
            raise DumpFormatError(path, f"docs[{i}].tags", f"expected a list of non-empty strings, got {tags!r}"[:200])
        try:
            out.append(DocInfo(d.get("name"), first, d["rows"], d.get("source", src_name), d.get("character", ""),
                               tuple(tags)))
        except DumpFormatError as exc:
            raise DumpFormatError(path, f"docs[{i}].{exc.field}", exc.message) from None
        first += int(d["rows"])
    if first != T:
        raise DumpFormatError(path, "docs", f"documents cover {first} rows; the fields have {T}")
    return out


def import_raw(src, out, *, roles: Roles | None = None, overwrite: bool = False, meta: dict | None = None,
               expect: DumpExpect | None = None, model_sha256: str | None = None,
               chat_framing: str | None = None) -> Path:
    """Write a v1 dump at `out` from the raw directory `src` (see the module docstring); `expect`
    checks the dims against a model, `model_sha256` is recorded when the spec names none,
    `chat_framing` (where the turn framing behind `roles` came from: "gguf", "fallback:chatml",
    "default:chatml") is recorded as meta.import.chat_framing when the roles are inferred."""
    path, spec = read_spec(src)
    out = Path(out)
    scratch = out.parent / f".{out.name}.import-{os.getpid()}"
    try:
        return _import(path, spec, out, scratch, roles=roles, overwrite=overwrite, meta=meta, expect=expect,
                       model_sha256=model_sha256, chat_framing=chat_framing)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _import(path: Path, spec: dict, out: Path, scratch: Path, *, roles, overwrite, meta, expect,
            model_sha256, chat_framing) -> Path:
    arch = spec["arch"]
    T = _rows_from(path, spec)
    missing = [n for n in required_fields(arch) if n not in spec["fields"] and n != "next"]
    if missing:
        raise DumpFormatError(path, f"fields.{missing[0]}", f"required for arch {arch!r}")
    fields = {name: stage_field(path, arch, name, entry, T, scratch) for name, entry in spec["fields"].items()}
    tokens = fields["tokens"]
    if tokens.shape != (T,):
        raise DumpFormatError(path, "fields.tokens", f"expected shape [T], got {list(tokens.shape)}")
    _check_ids(path, spec, "tokens", tokens, expect)
    docs = _docs(path, spec, T, tokens, path.parent.name)
    if "next" in fields:
        _check_next(path, spec, fields, docs, expect)
    if "roles" in fields:
        _check_roles(path, spec, fields["roles"])
    if "next" not in fields:
        nxt = np.append(tokens[1:], -1).astype(np.int64)
        for d in docs:
            nxt[d.stop - 1] = -1
        fields["next"] = nxt
    if "roles" not in fields and roles is not None:
        fields["roles"] = mark_docs(np.concatenate([np.asarray(roles(tokens[d.first_row:d.stop]), np.uint8)
                                                    for d in docs]), docs)
    info = {"import": {"spec": str(path), "spec_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                       "files": {n: e["file"] for n, e in spec["fields"].items()},
                       "roles": "given" if "roles" in spec["fields"] else ("inferred" if roles else "none")}}
    if info["import"]["roles"] == "inferred" and chat_framing is not None:
        info["import"]["chat_framing"] = chat_framing
    return write_dump(out, arch=arch, layer=spec["layer"], fields=fields, docs=docs,
                      model_sha256=spec.get("model_sha256") or model_sha256, meta={**(meta or {}), **info},
                      overwrite=overwrite, expect=expect)


def _check_ids(path: Path, spec: dict, name: str, ids: np.ndarray, expect: DumpExpect | None, low: int = 0) -> None:
    """Token ids in [low, vocab) (vocab: the model's, when known), before anything reads them."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise DumpFormatError(path, f"fields.{name}", f"expected shape [T], got {list(arr.shape)}")
    high = expect.vocab if expect is not None else None
    bad = (arr < low) | ((arr >= high) if high is not None else False)
    if np.any(bad):
        row = int(np.flatnonzero(bad)[0])
        bound = f"[0, {high})" if high is not None else ">= 0"
        raise DumpFormatError(path.parent / spec["fields"][name]["file"], name,
                              f"row {row}: token id {int(arr[row])}; expected {bound}" + (" or -1" if low < 0 else ""))


def _check_next(path: Path, spec: dict, fields: dict, docs, expect) -> None:
    """Within a document next[t] is tokens[t + 1] (docs/dump-format.md); its last row is free."""
    nxt, tok = np.asarray(fields["next"]), np.asarray(fields["tokens"])
    if nxt.shape != tok.shape:
        raise DumpFormatError(path, "fields.next", f"expected shape [T], got {list(nxt.shape)}")
    _check_ids(path, spec, "next", nxt, expect, low=-1)
    for d in docs:
        a, b = d.first_row, d.stop - 1
        bad = nxt[a:b] != tok[a + 1:b + 1]
        if bad.any():
            row = a + int(np.flatnonzero(bad)[0])
            raise DumpFormatError(path.parent / spec["fields"]["next"]["file"], "next",
                                  f"row {row} (document {d.name!r}): next {int(nxt[row])}, but the document's next "
                                  f"token is {int(tok[row + 1])}; expected next[t] == tokens[t + 1] within a document")


_CONTRADICTIONS = (
    (ROLE_PROMPT | ROLE_REPLY, ROLE_PROMPT | ROLE_REPLY, "PROMPT and REPLY: the next token is reply content or not"),
    (ROLE_STEP0 | ROLE_REPLY, ROLE_STEP0, "STEP0 without REPLY: step0 predicts the reply's first token"),
    (ROLE_REPLY_END | ROLE_REPLY, ROLE_REPLY_END, "REPLY_END without REPLY: the turn end closing a reply is in it"),
    (ROLE_STEP0 | ROLE_THINK, ROLE_STEP0 | ROLE_THINK, "STEP0 inside THINK: step0 comes after the think block"),
)


def _check_roles(path: Path, spec: dict, roles_field: np.ndarray) -> None:
    r = np.asarray(roles_field)
    if r.ndim != 1:
        raise DumpFormatError(path, "fields.roles", f"expected shape [T], got {list(r.shape)}")
    for mask, bits, what in _CONTRADICTIONS:
        bad = (r & mask) == bits
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DumpFormatError(path.parent / spec["fields"]["roles"]["file"], "roles",
                                  f"row {row}: bits {int(r[row]):#04x} set {what}")


def _entry(path, name, entry) -> bool:
    if not isinstance(entry, dict):
        raise DumpFormatError(path, f"fields.{name}", f"expected a table with file, dtype, shape, got {entry!r}")
    return True
