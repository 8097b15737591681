"""Dumps captured from llama.cpp: the rmsnorm tail's inputs, read off the graph by tensor name.

For each document (its own sequence from position 0, every position's logits requested, so the
last layer keeps all rows) the engine's evaluation callback copies
    R   = `ffn_inp-L` (or `sa_out-L`, Gemma): the residual before layer L's FFN is added
    hh  = `ffn_swiglu-L` (or `ffn_geglu-L`): the FFN hidden activation entering ffn_down
and the dump records the engine, its settings and the micro-batch sizes (`ubatch_sizes`), which
decide the engine's matmul kernels: verify with the same settings the dump was made with.
Documents may carry their row roles (native/llamacpp/chat.py derives them from the model's template);
when they do, the dump has a `roles` field, with ROLE_ANCHOR on documents tagged "anchor".
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from exactedit.dumps import DocInfo, write_dump
from exactedit.dumps.roles import mark_docs
from exactedit.native.llamacpp.engine import EngineError, EngineRun, EngineSettings, LlamaEngine
from exactedit.quant.model import arch
from exactedit.quant import gguf

Progress = Callable[[int, int], None]
# Graph names per dump field, first match wins (llama.cpp's names; L is the last layer).
TAIL_NAMES = {"R": ("ffn_inp-{L}", "sa_out-{L}"), "hh": ("ffn_swiglu-{L}", "ffn_geglu-{L}")}


@dataclass(frozen=True)
class CaptureDoc:
    """One document to evaluate: its token ids, where it came from, and optionally its row roles
    (uint8 [T], dumps/roles.py)."""

    name: str
    tokens: np.ndarray
    source: str = "live"
    character: str = ""
    tags: tuple[str, ...] = ()
    roles: np.ndarray | None = None


@dataclass(frozen=True)
class CaptureResult:
    path: Path
    rows: int
    layer: int
    model_sha256: str
    meta: dict
    logits: np.ndarray | None   # the engine's logits [rows, V], for comparisons made right away (None: not kept)


def tail_names(layer: int) -> list[str]:
    return [n.format(L=layer) for names in TAIL_NAMES.values() for n in names]


def pick(run: EngineRun, layer: int, path) -> dict[str, np.ndarray]:
    """The dump fields R and hh from a capture (the first graph name present for each)."""
    fields = {}
    for field, names in TAIL_NAMES.items():
        for name in names:
            arr = run.captured.get(name.format(L=layer))
            if arr is not None and arr.shape[0] == run.tokens.size:
                fields[field] = arr
                break
        else:
            raise EngineError(path, "capture", f"none of {[n.format(L=layer) for n in names]} was "
                              f"seen in the graph; is this an rmsnorm-tail model?")
    return fields


def capture_dump(model, docs: Sequence[CaptureDoc], out, *, settings: EngineSettings | None = None,
                 overwrite: bool = False, progress: Progress | None = None,
                 extra_meta: dict | None = None, keep_logits: bool = True) -> CaptureResult:
    """Evaluate each document on `model` with llama.cpp and write an rmsnorm dump at `out`
    (`extra_meta` is stored beside the engine's own record in the dump's meta). With `keep_logits`
    False the engine's logits are dropped document by document (the result's `logits` is None): a
    large capture then holds only the dump's fields, not [rows, V] floats. Several dumps of one
    model: `Capturer`, which loads and hashes the model once."""
    with Capturer(model, settings) as cap:
        return cap.dump(docs, out, overwrite=overwrite, progress=progress, extra_meta=extra_meta,
                        keep_logits=keep_logits)


class Capturer:
    """One model, read (tail, sha256) and loaded into llama.cpp once, for any number of dumps
    (`dump`, every document in one context, its memory cleared before each: engine.sequences);
    `engine` is the loaded model (e.g. to tokenize with it). Close it (or use `with`)."""

    def __init__(self, model, settings: EngineSettings | None = None):
        self.model = Path(model)
        self.settings = settings or EngineSettings()
        with gguf.open(self.model) as g:
            self.tail = arch.detect_tail(g)
            self.sha256 = g.sha256()
        if self.tail.kind != "rmsnorm":
            raise EngineError(self.model, "tail", f"llama.cpp capture supports rmsnorm tails, not {self.tail.kind}")
        self.engine = LlamaEngine(self.model, self.settings)
        self._open = contextlib.ExitStack()
        self._evaluate = None

    def __enter__(self) -> Capturer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._open.close()
        self.engine.close()

    def dump(self, docs: Sequence[CaptureDoc], out, *, overwrite: bool = False, progress: Progress | None = None,
             extra_meta: dict | None = None, keep_logits: bool = True) -> CaptureResult:
        """`capture_dump` of `docs` to `out` on the loaded model."""
        model, settings, tail, engine = self.model, self.settings, self.tail, self.engine
        if not docs:
            raise EngineError(model, "docs", "nothing to capture")
        total = sum(int(np.asarray(d.tokens).size) for d in docs)
        with_roles = [d.roles is not None for d in docs]
        if any(with_roles) and not all(with_roles):
            raise EngineError(out, "roles", "either every document carries its row roles or none does")
        for d in docs:
            if d.roles is not None and np.shape(d.roles) != np.shape(d.tokens):
                raise EngineError(out, f"roles of {d.name}", f"{np.shape(d.roles)} roles for {np.shape(d.tokens)} tokens")
        parts: dict[str, list[np.ndarray]] = {"tokens": [], "next": [], "R": [], "hh": []}
        logits, ubatches, infos, done, first = [], [], [], 0, 0
        if self._evaluate is None:
            self._evaluate = self._open.enter_context(engine.sequences(capture=tail_names(tail.layer)))
        for doc in docs:
            tick = None if progress is None else (lambda d, _t, base=done: progress(base + d, total))
            run = self._evaluate(doc.tokens, tick)
            fields = pick(run, tail.layer, model)
            toks = run.tokens
            parts["tokens"].append(toks)
            parts["next"].append(np.append(toks[1:], -1).astype(np.int32))
            parts["R"].append(fields["R"])
            parts["hh"].append(fields["hh"])
            if keep_logits:
                logits.append(run.logits)
            ubatches += list(run.ubatch_sizes)
            infos.append(DocInfo(doc.name, first, toks.size, doc.source, doc.character, tuple(doc.tags)))
            first += toks.size
            done += toks.size
        meta = {"engine": {"name": "llamacpp", **engine.info}, "engine_settings": settings.as_meta(),
                "ubatch_sizes": ubatches, "captured": {k: list(v) for k, v in TAIL_NAMES.items()},
                "per_document_sequences": True, **(extra_meta or {})}
        fields = {k: np.concatenate(v) for k, v in parts.items()}
        if all(with_roles):
            fields["roles"] = mark_docs(np.concatenate([np.asarray(d.roles, np.uint8) for d in docs]), infos)
        path = write_dump(out, arch="rmsnorm", layer=tail.layer, fields=fields, docs=infos,
                          model_sha256=self.sha256, meta=meta, overwrite=overwrite)
        return CaptureResult(Path(path), first, tail.layer, self.sha256, meta,
                             np.concatenate(logits) if keep_logits else None)
