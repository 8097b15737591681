"""Model + dump -> full-vocabulary logits, LSE and argmax per row (`exactedit logits`).

The path is: tail forward (layer-47 write, then the head's mix) in float32, then one streaming
pass over the head (`vocab_pass`) whose matmul is a pluggable strategy (default float32 sgemm on
the runtime-dequantized head; an engine-faithful product can be passed as `matmul`). The full
logits [rows, V] are written into `OUT.tmp` as a .npy (its blocks reserved first, so a full disk is
a clean error, not a SIGBUS; a stale `OUT.tmp` of a killed run is reused, one a live run writes is
refused), fsynced, renamed to OUT, and a manifest `OUT.manifest.json` records the sha256 of the
model, the dump and the output. An OUT (or its manifest) that is the model or lies in the dump is
refused.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit.errors import ExacteditError
from exactedit.files import (atomic_write_text, claim_tmp, file_sha256, fsync_replace, preallocate, refuse_clobber,
    writing)
from exactedit.solvers.tail.forward.head_fast import Matmul
from exactedit.solvers.tail.passes.vocab_pass import VocabPass, vocab_pass

Progress = Callable[[int, int], None]


class RowRangeError(ExacteditError):
    """A --rows A:B range that does not fit the dump."""


def parse_rows(text: str | None, total: int) -> tuple[int, int]:
    """'A:B' (either side may be empty, negative counts from the end) -> (start, stop) in [0, total]."""
    if text is None or text.strip() in ("", ":"):
        return 0, total
    parts = text.split(":")
    if len(parts) != 2:
        raise RowRangeError(f"--rows {text!r}: expected A:B")
    try:
        start, stop = (int(p) if p.strip() else d for p, d in zip(parts, (0, total)))
    except ValueError:
        raise RowRangeError(f"--rows {text!r}: A and B must be integers") from None
    start, stop = (v + total if v < 0 else v for v in (start, stop))
    if not 0 <= start < stop <= total:
        raise RowRangeError(f"--rows {text!r}: expected 0 <= A < B <= {total} (the dump's rows)")
    return start, stop


def open_pair(model, dump, *, check_finite: bool = True, verify_hashes: bool = True, cache=None):
    """(GGUFFile, tail, Dump): the model's tail and the dump, validated against each other; the
    dump's field hashes are verified unless `verify_hashes=False` (`cache`: a dumps.VerifyCache)."""
    from exactedit.dumps import read_dump
    from exactedit.quant import gguf
    from exactedit.solvers.tail.model import load_tail

    g = gguf.open(model)
    tail = load_tail(g)
    d = read_dump(dump, expect=tail.dump_expect(), check_finite=check_finite, verify_hashes=verify_hashes,
                  cache=cache)
    return g, tail, d


def tail_mix(tail, dump, rows: tuple[int, int] | None = None, dW=None, *,
             reference: bool = False, chunk: int = 4096) -> np.ndarray:
    """mix [T, n] for dump rows [start, stop): float32 fast path (float64 with `reference`),
    computed in chunks of rows so memory stays bounded by the chunk."""
    start, stop = (0, dump.rows) if rows is None else rows
    parts = [tail.mix(tail.residual(dump, slice(a, min(a + chunk, stop)), dW, reference=reference),
                      reference=reference) for a in range(start, stop, chunk)]
    return np.concatenate(parts, axis=0)


def head_pass(tail, mix, *, matmul: Matmul | None = None, progress: Progress | None = None,
              **kw) -> VocabPass:
    """`vocab_pass` over the tail's head with its softcap (kw: token_sets, topk, exclude, ...)."""
    return vocab_pass(mix, tail.head, softcap=tail.softcap, matmul=matmul, progress=progress, **kw)


@dataclass(frozen=True)
class LogitsResult:
    """What `write_logits` wrote, and the per-row LSE / argmax it saw on the way."""

    out: str
    manifest: str
    rows: tuple[int, int]
    vocab: int
    lse: np.ndarray        # float64 [rows]
    argmax: np.ndarray     # int64 [rows]
    model_sha256: str
    dump_sha256: str
    out_sha256: str
    matmul: str
    dump_verified: bool = True     # False under --no-verify: dump_sha256 is then the manifest's hash only

    def to_dict(self) -> dict:
        return {"out": self.out, "manifest": self.manifest, "rows": list(self.rows),
                "vocab": self.vocab, "model_sha256": self.model_sha256,
                "dump_sha256": self.dump_sha256, "dump_verified": self.dump_verified,
                "out_sha256": self.out_sha256, "matmul": self.matmul, "mean_lse": float(np.mean(self.lse))}


def _fill_npy(tmp: Path, shape: tuple[int, int], fill):
    """A float32 .npy of `shape` at `tmp`, its blocks reserved on disk first (a full disk is then an
    OSError naming `tmp`, not a SIGBUS from the memory map), filled through a memory map by
    `fill(sink)` (sink(a, b, tile) writes columns [a, b)); returns what `fill` returns."""
    arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
    with writing(tmp), open(tmp, "rb+") as fh:
        preallocate(fh.fileno(), os.fstat(fh.fileno()).st_size)

    def sink(a, b, tile):
        arr[:, a:b] = tile

    got = fill(sink)
    arr.flush()
    return got


def write_logits(model, dump, out, *, rows: str | tuple[int, int] | None = None,
                 tile_rows: int = 8192, matmul: Matmul | None = None, match_engine: str | None = None,
                 verify_hashes: bool = True, cache=None, progress: Progress | None = None) -> LogitsResult:
    """Full-vocabulary float32 logits [rows, V] of `model` on the rows of `dump`, as OUT (.npy).
    `match_engine` ("llamacpp") computes them as that engine does (activations quantized before
    each quantized matmul, its summation order; solvers.tail.engine_math) instead of exactly. The dump's
    field hashes are verified first unless `verify_hashes=False`, which the result and the
    manifest record (`dump_verified`)."""
    from exactedit.solvers.tail.forward.head_fast import Sgemm

    out = Path(out)
    manifest = Path(str(out) + ".manifest.json")
    refuse_clobber({"out": out, "manifest": manifest}, {"model": model, "dump": dump})
    g, tail, d = open_pair(model, dump, verify_hashes=verify_hashes, cache=cache)
    span = rows if isinstance(rows, tuple) else parse_rows(rows, d.rows)
    if match_engine is not None:
        if matmul is not None:
            raise ValueError("give match_engine or matmul, not both")
        from exactedit.solvers.tail.engine_math import engine_logits_setup

        mix, matmul = engine_logits_setup(g, tail, d, span, match_engine)
    else:
        matmul = Sgemm() if matmul is None else matmul
        mix = tail_mix(tail, d, span)
    V = tail.spec.vocab
    with claim_tmp(out) as tmp:
        vp = _fill_npy(tmp, (mix.shape[0], V), lambda sink: head_pass(
            tail, mix, matmul=matmul, tile_rows=tile_rows, sink=sink, progress=progress))
        fsync_replace(tmp, out)
    result = LogitsResult(str(out), str(manifest), span, V, vp.lse, vp.argmax,
                          g.sha256(), d.sha256(), file_sha256(out), getattr(matmul, "name", repr(matmul)),
                          d.verified)
    atomic_write_text(manifest, json.dumps({"kind": "exactedit-logits", "model": str(model),
                                            "dump": str(dump), **result.to_dict()}, indent=2) + "\n")
    return result


def render_logits(r: LogitsResult) -> str:
    """The text report of `exactedit logits`."""
    rows = r.rows[1] - r.rows[0]
    return "\n".join([f"wrote {r.out}: float32 [{rows}, {r.vocab}] (rows {r.rows[0]}:{r.rows[1]})",
                      f"sha256 {r.out_sha256}  manifest {r.manifest}",
                      f"model {r.model_sha256[:12]}  dump {r.dump_sha256[:12]}"
                      + ("" if r.dump_verified else " (field hashes NOT verified: --no-verify)")
                      + f"  matmul {r.matmul}",
                      f"mean LSE {float(np.mean(r.lse)):.6f}"])
