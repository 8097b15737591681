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
"""
from __future__ import annotations

import hashlib
import math
import tomllib
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit.dumps.errors import DumpFormatError
from exactedit.dumps.format import ARCHS, DocInfo, DumpExpect, is_int, required_fields
from exactedit.dumps.roles import mark_docs
from exactedit.dumps.writer import write_dump

SPEC_NAME = "dump.toml"
DTYPES = {"float32": "<f4", "float16": "<f2", "bfloat16": "<u2", "int32": "<i4", "int64": "<i8",
          "uint32": "<u4", "uint16": "<u2", "uint8": "u1"}
Roles = Callable[[np.ndarray], np.ndarray]


def read_spec(src) -> tuple[Path, dict]:
    """The TOML spec of a raw dump directory (or the TOML file itself) and its directory."""
    src = Path(src)
    path = src / SPEC_NAME if src.is_dir() else src
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise DumpFormatError(path, "spec", f"cannot read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise DumpFormatError(path, "spec", f"not valid TOML ({exc})") from None
    if spec.get("arch") not in ARCHS:
        raise DumpFormatError(path, "arch", f"expected one of {ARCHS}, got {spec.get('arch')!r}")
    if not is_int(spec.get("layer")) or spec["layer"] < 0:
        raise DumpFormatError(path, "layer", f"expected an integer >= 0, got {spec.get('layer')!r}")
    if not isinstance(spec.get("fields"), dict) or not spec["fields"]:
        raise DumpFormatError(path, "fields", "expected a [fields.NAME] table per field")
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
    if dt not in DTYPES:
        raise DumpFormatError(path, f"fields.{name}.dtype", f"expected one of {sorted(DTYPES)}, got {dt!r}")
    return DTYPES[dt]


def _file(path: Path, name: str, entry: dict) -> Path:
    rel = entry.get("file")
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise DumpFormatError(path, f"fields.{name}.file", f"expected a file name inside the directory, got {rel!r}")
    f = path.parent / rel
    if not f.is_file():
        raise DumpFormatError(f, name, "no such file")
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


def read_field(path: Path, name: str, entry: dict, T: int) -> np.ndarray:
    """One raw field as an array of its stated dtype and shape (bfloat16 widened to float32)."""
    f = _file(path, name, entry)
    dt = _dtype(path, name, entry)
    shape = _shape(path, name, entry, T)
    need = np.dtype(dt).itemsize * math.prod(shape)
    size = f.stat().st_size
    if size != need:
        raise DumpFormatError(f, name, f"{size} bytes, but {entry['dtype']} {list(shape)} needs {need} bytes "
                              f"({size / max(need, 1):.4g}x)")
    arr = np.fromfile(f, dtype=dt).reshape(shape)
    if entry["dtype"] == "bfloat16":
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr


def _docs(path: Path, spec: dict, T: int, tokens: np.ndarray, src_name: str) -> list[DocInfo]:
    raw = spec.get("docs")
    if raw is None:
        digest = hashlib.sha256(np.ascontiguousarray(tokens, "<i4").tobytes()).hexdigest()[:12]
        return [DocInfo(f"{src_name}-{digest}", 0, T, src_name, "", ())]
    if not isinstance(raw, list) or not raw:
        raise DumpFormatError(path, "docs", "expected [[docs]] tables with name and rows")
    out, first = [], 0
    for i, d in enumerate(raw):
        if not isinstance(d, dict) or not is_int(d.get("rows")):
            raise DumpFormatError(path, f"docs[{i}]", f"expected name and rows, got {d!r}")
        out.append(DocInfo(d.get("name"), first, d["rows"], d.get("source", src_name), d.get("character", ""),
                           tuple(d.get("tags", ()))))
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
    arch = spec["arch"]
    T = _rows_from(path, spec)
    fields = {name: read_field(path, name, entry, T) for name, entry in spec["fields"].items()
              if _entry(path, name, entry)}
    missing = [n for n in required_fields(arch) if n not in fields and n != "next"]
    if missing:
        raise DumpFormatError(path, f"fields.{missing[0]}", f"required for arch {arch!r}")
    tokens = fields["tokens"]
    if tokens.shape != (T,):
        raise DumpFormatError(path, "fields.tokens", f"expected shape [T], got {list(tokens.shape)}")
    docs = _docs(path, spec, T, tokens, path.parent.name)
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


def _entry(path, name, entry) -> bool:
    if not isinstance(entry, dict):
        raise DumpFormatError(path, f"fields.{name}", f"expected a table with file, dtype, shape, got {entry!r}")
    return True
