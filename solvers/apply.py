"""`exactedit apply BUNDLE --model M --out M2.gguf`: write a bundle's edits into a copy of a GGUF.

The model must be the one the bundle was solved on (its sha256 is in the bundle's inputs), and
every edited tensor must exist there with the bundle's type and shape (checked from the manifest,
before an edit file is read: solvers.bundle.read_bundle's `tensors`). Row patches replace only
their rows (all other rows keep their bytes); the copy is written by `quant.gguf.transplant`, which keeps
every other byte of the file and writes its own JSON manifest beside the output. `overwrite`
replaces a previous output, never an input: an output that is the model (a symlink or hard link
included) or lies inside the bundle directory is refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit.quant import gguf
from exactedit.files import refuse_clobber
from exactedit.quant.gguf.patch import RowPatch, apply_row_patch
from exactedit.quant.gguf.transplant import TransplantResult, transplant
from exactedit.solvers.bundle import Bundle, BundleError, model_tensors, read_bundle

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class AppliedEdit:
    tensor: str
    kind: str
    rows_replaced: int


@dataclass(frozen=True)
class ApplyResult:
    bundle: Path
    bundle_sha256: str
    model: Path
    out: Path
    out_sha256: str
    manifest: Path
    edits: tuple[AppliedEdit, ...]
    transplant: TransplantResult

    def to_dict(self) -> dict:
        return apply_json(self)


def apply_bundle(bundle, model, out, *, overwrite: bool = False, check_model: bool = True,
                 progress: Progress | None = None) -> ApplyResult:
    """Write `out`: `model` with the bundle's edits. Refuses a model whose sha256 differs from the
    one the bundle records (unless `check_model=False`), a tensor whose type or shape differ, and
    an output (or its manifest) that is the model or lies in the bundle, even with `overwrite`."""
    model, out = Path(model), Path(out)
    manifest = out.with_name(out.name + ".manifest.json")
    refuse_clobber({"out": out, "manifest": manifest},
                   {"bundle": bundle.path if isinstance(bundle, Bundle) else bundle, "model": model})
    with gguf.open(model) as g:
        # the edits bounded by the model's tensors before any edit file is read (a crafted entry
        # declaring a huge shape over a sparse file was read whole)
        b = bundle if isinstance(bundle, Bundle) else read_bundle(bundle, tensors=model_tensors(g))
        if check_model:
            want = b.input("model").sha256
            got = g.sha256()
            if got != want:
                raise BundleError(b.path, "inputs.model", f"was solved on a model with sha256 {want}; "
                                  f"{model} has {got}")
        replace, applied = {}, []
        for e in b.edits:
            if e.tensor not in g.tensors:
                raise BundleError(b.path, f"edit {e.tensor!r}", f"tensor not in {model}")
            info = g.tensors[e.tensor]
            if info.type_name != e.type_name or tuple(info.shape) != e.shape:
                raise BundleError(b.path, f"edit {e.tensor!r}", f"is {e.type_name} {list(e.shape)}; the model's "
                                  f"tensor is {info.type_name} {list(info.shape)}")
            if e.tensor in replace:
                raise BundleError(b.path, f"edit {e.tensor!r}", "appears twice")
            if e.kind == "rows":
                raw = np.asarray(g.read_raw(e.tensor))
                replace[e.tensor] = apply_row_patch(raw, RowPatch(e.row_ids, e.raw))
                applied.append(AppliedEdit(e.tensor, e.kind, len(e.row_ids)))
            else:
                replace[e.tensor] = e.raw
                applied.append(AppliedEdit(e.tensor, e.kind, e.shape[0]))
    result = transplant(model, out, replace=replace, overwrite=overwrite, progress=progress)
    return ApplyResult(b.path, b.sha256, model, out, result.dst_sha256, result.manifest, tuple(applied), result)


def apply_json(r: ApplyResult) -> dict:
    """`exactedit apply --json`."""
    return {"bundle": str(r.bundle), "bundle_sha256": r.bundle_sha256, "model": str(r.model), "out": str(r.out),
            "out_sha256": r.out_sha256, "manifest": str(r.manifest),
            "edits": [{"tensor": e.tensor, "kind": e.kind, "rows": e.rows_replaced} for e in r.edits]}


def render_apply(r: ApplyResult) -> str:
    """`exactedit apply`'s summary."""
    lines = [f"wrote {r.out} (sha256 {r.out_sha256})", f"  bundle {r.bundle} ({r.bundle_sha256[:12]})"]
    lines += [f"  {e.tensor}: {e.rows_replaced} rows replaced ({e.kind})" for e in r.edits] or ["  (no edits)"]
    lines.append(f"  transplant manifest {r.manifest}")
    return "\n".join(lines)
