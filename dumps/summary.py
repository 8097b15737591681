"""What `exactedit dump inspect` reports: a dump's arch, rows, fields, documents and role counts,
as a frozen result with a JSON form and a plain-text table."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactedit.dumps.format import DocInfo
from exactedit.dumps.reader import Dump, Progress, read_dump


@dataclass(frozen=True)
class FieldInfo:
    name: str
    file: str
    shape: tuple[int, ...]
    dtype: str
    sha256: str


@dataclass(frozen=True)
class DumpSummary:
    path: str
    arch: str
    layer: int
    rows: int
    model_sha256: str | None
    sha256: str
    dims: dict[str, int]
    fields: tuple[FieldInfo, ...]
    docs: tuple[DocInfo, ...]
    role_counts: dict[str, int]
    meta: dict[str, Any]
    hashes_verified: bool

    def to_json(self) -> dict:
        return {
            "path": self.path, "arch": self.arch, "layer": self.layer, "rows": self.rows,
            "model_sha256": self.model_sha256, "sha256": self.sha256, "dims": dict(self.dims),
            "fields": [{"name": f.name, "file": f.file, "shape": list(f.shape), "dtype": f.dtype,
                        "sha256": f.sha256} for f in self.fields],
            "docs": [d.to_json() for d in self.docs], "role_counts": dict(self.role_counts),
            "meta": dict(self.meta), "hashes_verified": self.hashes_verified,
        }

    to_dict = to_json  # the name every printed result answers to (cli.emit)


def summarize(dump: Dump, hashes_verified: bool = False) -> DumpSummary:
    fields = tuple(FieldInfo(name, dump.manifest.fields[name], tuple(arr.shape), arr.dtype.name,
                             dump.manifest.sha256[name]) for name, arr in dump.fields.items())
    return DumpSummary(path=str(dump.path), arch=dump.arch, layer=dump.layer, rows=dump.rows,
                       model_sha256=dump.model_sha256, sha256=dump.sha256(), dims=dict(dump.dims),
                       fields=fields, docs=tuple(dump.docs), role_counts=dump.role_counts(),
                       meta=dict(dump.meta), hashes_verified=hashes_verified)


def inspect_dump(path, *, verify_hashes: bool = True, progress: Progress | None = None) -> DumpSummary:
    """Read and fully validate the dump at `path` (values scanned, field hashes re-hashed unless
    `verify_hashes=False`, which the summary records) and summarize it."""
    return summarize(read_dump(path, verify_hashes=verify_hashes, progress=progress), verify_hashes)


def format_table(s: DumpSummary) -> str:
    """The summary as aligned plain-text tables (fields, documents, roles)."""
    dims = ", ".join(f"{k}={v}" for k, v in sorted(s.dims.items()))
    lines = [f"dump     {s.path}", f"arch     {s.arch} (layer {s.layer}), {s.rows} rows, {dims}",
             f"model    {s.model_sha256 or '(not recorded)'}", f"sha256   {s.sha256}"
             + ("  (field hashes verified)" if s.hashes_verified else
                "  (field hashes NOT verified: --no-verify; this is the manifest's hash only)")]
    if s.meta:
        lines.append("meta     " + ", ".join(f"{k}={v}" for k, v in sorted(s.meta.items())))
    lines += ["", *_table(("field", "shape", "dtype", "file"),
                          [(f.name, "x".join(map(str, f.shape)), f.dtype, f.file) for f in s.fields])]
    lines += ["", *_table(("doc", "rows", "first", "source", "character", "tags"),
                          [(d.name, d.rows, d.first_row, d.source, d.character, ",".join(d.tags))
                           for d in s.docs])]
    if s.role_counts:
        lines += ["", *_table(("role", "rows"), list(s.role_counts.items()))]
    else:
        lines += ["", "roles    (no roles field)"]
    return "\n".join(lines)


def _table(header: tuple[str, ...], rows: list[tuple]) -> list[str]:
    cells = [tuple(map(str, header))] + [tuple(map(str, r)) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
