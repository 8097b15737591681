"""`exactedit kld` with llama.cpp's files: read a `--kl-divergence-base` file that llama-perplexity
wrote (`base_file`: score an edited model, or the offline prediction of one, against the base logits
the tool recorded), write one it accepts (`write_base`), and the per-row KLD as .npy (`rows_out`).

The file's rows are the positions n_ctx/2 .. n_ctx-2 of each chunk of n_ctx tokens; the dumps must
hold those chunks as documents, in order (`native.llamacpp.perplexity_chunks.capture_chunks` makes such a
dump). Without --rows / --doc-rows that window is selected in every document; with them, the
selection must predict the file's tokens row for row, or the run is refused. A written file takes
its token table from the dumps (each chunk's first token as the text had it, when the dump records
it: the tool evaluates that position with BOS instead and ignores the stored id).
"""
from __future__ import annotations

import dataclasses
import io
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from exactedit.evals.kl.compare import KldComparison, KldConfig, KldConfigError, compare, render_comparison
from exactedit.evals.kl.base_file import BaseFileWriter, read_base_file
from exactedit.native.llamacpp.perplexity_chunks import META_KEY
from exactedit.files import atomic_write_bytes, file_sha256, refuse_clobber

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class KldFiles:
    """The files of a `kld` run besides the models and dumps (CLI: --base-file, --write-base, --rows-out)."""

    base_file: str | None = None
    write_base: str | None = None
    rows_out: str | None = None

    def __post_init__(self):
        if self.base_file is not None and self.write_base is not None:
            raise KldConfigError("kld: --base-file reads the base side, --write-base writes it; give one")


@dataclass(frozen=True)
class KldRun:
    comparison: KldComparison
    files: KldFiles
    base_file_sha256: str | None = None
    wrote_base_sha256: str | None = None
    rows_out_sha256: str | None = None

    def to_dict(self) -> dict:
        out = self.comparison.to_dict(per_row=self.files.rows_out is None)
        for key, sha in (("base_file", self.base_file_sha256), ("write_base", self.wrote_base_sha256),
                         ("rows_out", self.rows_out_sha256)):
            path = getattr(self.files, key)
            if path is not None:
                out[key] = {"path": path, "sha256": sha}
        return _json_safe(out)   # inf / NaN (an extreme edit) as null: json.dumps(allow_nan=False) holds


def _docs(cfg: KldConfig):
    from exactedit.dumps import read_dump

    return [read_dump(p, verify_hashes=False) for p in cfg.dumps]   # layout only; compare() verifies


def _window(cfg: KldConfig, n_ctx: int) -> KldConfig:
    """The rows llama-perplexity scores in every document, unless rows were chosen."""
    if cfg.rows or cfg.doc_rows is not None:
        return cfg
    return dataclasses.replace(cfg, doc_rows=f"{n_ctx // 2}:{n_ctx - 1}")


def _chunk_tokens(cfg: KldConfig) -> tuple[int, np.ndarray]:
    """(n_ctx, the token table) of dumps whose documents are all chunks of one length."""
    dumps = _docs(cfg)
    lengths = {doc.rows for d in dumps for doc in d.docs}
    if len(lengths) != 1:
        raise KldConfigError(f"kld --write-base: the dumps' documents have {sorted(lengths)} rows; "
                             f"llama-perplexity's chunks all have n_ctx")
    n_ctx = lengths.pop()
    tables = []
    for path, d in zip(cfg.dumps, dumps):
        meta = d.meta.get(META_KEY) if isinstance(d.meta, dict) else None
        firsts = meta.get("first_tokens") if isinstance(meta, dict) else None
        if firsts is not None and len(firsts) != len(d.docs):
            raise KldConfigError(f"{path}: meta {META_KEY}.first_tokens has {len(firsts)} entries for "
                                 f"{len(d.docs)} documents")
        for i, doc in enumerate(d.docs):
            toks = np.array(d.tokens[doc.first_row:doc.stop], np.int32)
            if firsts is not None:
                toks[0] = int(firsts[i])
            tables.append(toks)
    return n_ctx, np.concatenate(tables)


def _check_window(cfg: KldConfig, n_ctx: int) -> None:
    from exactedit.evals.kl.compare import select_rows

    first = n_ctx // 2
    for s in select_rows(cfg, _docs(cfg)):
        if s.stop - s.start != n_ctx - 1 - first or s.doc is None:
            raise KldConfigError(f"kld --write-base: rows {s.start}:{s.stop} of {cfg.dumps[s.dump]} are not a "
                                 f"document's positions {first}..{n_ctx - 2}; use --doc-rows {first}:{n_ctx - 1}")


def _save_rows(path, values: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, values, allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())
    return file_sha256(path)


def _model_vocab(model) -> int | None:
    """The vocabulary of `model` (a GGUF path; None: no model, nothing to check against)."""
    if model is None:
        return None
    from exactedit.quant import gguf
    from exactedit.solvers.tail.model import load_tail

    with gguf.open(model) as g:
        return load_tail(g).spec.vocab


def _json_safe(obj):
    """`obj` with every non-finite float as None: the JSON report stays valid JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def run_kld(cfg: KldConfig, files: KldFiles = KldFiles(), *, progress: Progress | None = None) -> KldRun:
    """`exactedit kld`: `evals.kl.compare.compare` with the base side read from or written to a
    llama-perplexity base file, and the per-row KLD saved. An output file that is an input (a model,
    the base file, a file of a dump) or the other output is refused before anything is computed."""
    refuse_clobber({"--write-base": files.write_base, "--rows-out": files.rows_out},
                   {"--model": cfg.model, "--edited": cfg.edited, "--dump": cfg.dumps,
                    "--base-file": files.base_file})
    base = sha_in = sha_out = sha_rows = None
    if files.base_file is not None:
        base = read_base_file(files.base_file, _model_vocab(cfg.edited))
        sha_in = base.sha256()
        cfg = _window(cfg, base.n_ctx)
        comparison = compare(cfg, base=base, progress=progress)
    elif files.write_base is not None:
        n_ctx, tokens = _chunk_tokens(cfg)
        cfg = _window(cfg, n_ctx)
        _check_window(cfg, n_ctx)
        if cfg.model is None:
            raise KldConfigError("kld --write-base: give --model, the base GGUF whose logits it records")
        vocab = _model_vocab(cfg.model)
        with BaseFileWriter(files.write_base, n_ctx, vocab, tokens) as writer:
            comparison = compare(cfg, base_sink=writer.write, progress=progress)
            sha_out = writer.close()
    else:
        comparison = compare(cfg, progress=progress)
    if files.rows_out is not None:
        values = comparison.per_row_kld
        if values is None:
            raise KldConfigError("kld --rows-out: no edited model was scored")
        sha_rows = _save_rows(files.rows_out, values)
    return KldRun(comparison, files, sha_in, sha_out, sha_rows)


def render_kld_run(r: KldRun) -> str:
    lines = [render_comparison(r.comparison)]
    for label, path, sha in (("base file", r.files.base_file, r.base_file_sha256),
                             ("wrote base file", r.files.write_base, r.wrote_base_sha256),
                             ("wrote per-row KLD", r.files.rows_out, r.rows_out_sha256)):
        if path is not None:
            lines.append(f"{label} {path}  (sha256 {sha[:16]})")
    return "\n".join(lines)
