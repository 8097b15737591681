"""Untie a tied head: add `output.weight` as a byte copy of `token_embd.weight`, or refuse.

A tied model (Gemma) multiplies its final hidden state by the input embedding table. Editing a
row of that table also moves the token's input embedding, which the offline prediction does not
model (a measured miss of KL 0.18 on Gemma 3 270M). exactedit never edits a tied row: `untie`
writes a copy of the model with `output.weight` added (same type, shape and bytes as
`token_embd.weight`; llama.cpp then uses it as the head and keeps `token_embd` for the input),
every other tensor byte-identical (checked by the transplant). `solve head` refuses a tied head
(solvers/head/solve.py `check_tail`) and names this command.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit.quant.model import arch
from exactedit.quant import gguf
from exactedit.errors import ExacteditError
from exactedit.quant.gguf.transplant import transplant

HEAD, EMBED = "output.weight", "token_embd.weight"


class TiedHeadError(ExacteditError):
    """An untie that cannot be done: the model is not tied, or the copy lost the head's bytes."""

    def __init__(self, path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {HEAD}: {message}")


@dataclass(frozen=True)
class UntieResult:
    src: str
    src_sha256: str
    dst: str
    dst_sha256: str
    manifest: str
    type_name: str
    shape: tuple[int, ...]
    head_sha256: str

    def to_dict(self) -> dict:
        return asdict(self)


def untie(model, out, *, overwrite: bool = False, progress: Callable[[int, int], None] | None = None) -> UntieResult:
    model, out = Path(model), Path(out)
    with gguf.open(model) as g:
        if not arch.detect_tail(g).tied:
            raise TiedHeadError(model, "already present: the head is not tied, nothing to untie")
        info = g.tensor(EMBED)
        raw = np.array(g.read_raw(EMBED))
    res = transplant(model, out, replace={}, add={HEAD: (info.type_name, info.shape, raw)},
                     overwrite=overwrite, progress=progress)
    with gguf.open(out) as g2:
        head = g2.tensor(HEAD)
        if head.type_name != info.type_name or tuple(head.shape) != tuple(info.shape) \
                or not np.array_equal(g2.read_raw(HEAD), raw) or arch.detect_tail(g2).tied:
            raise TiedHeadError(out, "the written copy does not hold token_embd's bytes as an untied head")
    added = res.added[0]
    return UntieResult(str(model), res.src_sha256, str(out), res.dst_sha256, str(res.manifest),
                       info.type_name, tuple(info.shape), added.sha256)


def render_untie(res: UntieResult) -> str:
    """`exactedit untie`'s line."""
    return (f"wrote {res.dst} (sha256 {res.dst_sha256}): output.weight = token_embd.weight, "
            f"{res.type_name} {list(res.shape)}")
