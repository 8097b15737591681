"""Dumps of the chunks llama.cpp's `llama-perplexity` evaluates, so its statistics can be
reproduced offline (`exactedit kld ... --stats llama-perplexity`).

What the tool does with a text (tools/perplexity/perplexity.cpp, llama.cpp as in llama-cpp-python
0.3.36): tokenize it once with the vocabulary's special prefix (`add_special`, no parsing of special
token text), cut the first n_chunk * n_ctx tokens into n_chunk = tokens // n_ctx chunks, and evaluate
each chunk in a fresh context from position 0, in batches of min(n_batch, n_ctx) tokens, every
position's logits kept. When the vocabulary adds a BOS token, the chunk's first token is replaced
by BOS for the evaluation only (the token table it records keeps the text's token). Scored rows:
positions n_ctx/2 .. n_ctx-2 of each chunk (each predicting the next token of the chunk).

`chunk_plan` reproduces the cut, `capture_chunks` evaluates each chunk as one document of a dump
(engine settings as the tool's: n_ctx, n_batch, n_ubatch, threads, flash attention off), and
records in the dump's meta the plan, including the text's first token of each chunk, so a base file
written from the dump carries the same token table as the tool's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from exactedit.native.llamacpp.capture import CaptureDoc, CaptureResult, capture_dump
from exactedit.native.llamacpp.engine import EngineError, EngineSettings, LlamaEngine

Progress = Callable[[int, int], None]
META_KEY = "perplexity_chunks"


@dataclass(frozen=True)
class ChunkPlan:
    """The chunks of a text as llama-perplexity cuts them."""

    n_ctx: int
    tokens: np.ndarray            # int32 [n_chunk * n_ctx]: the text's tokens, as its base file stores them
    bos: int | None               # the id replacing each chunk's first token, None when the vocab adds none

    @property
    def n_chunk(self) -> int:
        return self.tokens.size // self.n_ctx

    @property
    def first(self) -> int:
        """The first scored position of every chunk (n_ctx / 2)."""
        return self.n_ctx // 2

    def chunk(self, i: int) -> np.ndarray:
        """The tokens chunk i is evaluated with (BOS first when the vocabulary adds one)."""
        toks = self.tokens[i * self.n_ctx:(i + 1) * self.n_ctx].copy()
        if self.bos is not None:
            toks[0] = self.bos
        return toks

    def meta(self) -> dict:
        return {"n_ctx": self.n_ctx, "n_chunk": self.n_chunk, "bos": self.bos,
                "first_tokens": [int(self.tokens[i * self.n_ctx]) for i in range(self.n_chunk)]}


def chunk_plan(tokens, n_ctx: int, bos: int | None, n_chunks: int | None = None, *, where="tokens") -> ChunkPlan:
    """Cut `tokens` (the whole text, tokenized) into chunks of n_ctx; at most `n_chunks` of them."""
    toks = np.asarray(tokens)
    if toks.ndim != 1 or not np.issubdtype(toks.dtype, np.integer):
        raise EngineError(where, "tokens", f"expected a 1-D integer array, got {toks.dtype} {toks.shape}")
    if not isinstance(n_ctx, int) or n_ctx < 4:
        raise EngineError(where, "n_ctx", f"expected an integer >= 4, got {n_ctx!r}")
    if toks.size < 2 * n_ctx:   # the tool's own condition
        raise EngineError(where, "tokens", f"{toks.size} tokens; llama-perplexity needs at least "
                          f"2 * n_ctx = {2 * n_ctx}")
    n = toks.size // n_ctx
    if n_chunks is not None:
        if n_chunks < 1:
            raise EngineError(where, "n_chunks", f"expected >= 1, got {n_chunks}")
        n = min(n, n_chunks)
    return ChunkPlan(n_ctx, toks[:n * n_ctx].astype(np.int32), bos)


def tool_settings(n_ctx: int, n_batch: int = 512, n_ubatch: int = 512, n_threads: int = 2) -> EngineSettings:
    """The engine settings llama-perplexity evaluates a chunk with (`-c -b -ub -t`, `-fa off`):
    its batch is min(n_batch, n_ctx)."""
    n_batch = min(n_batch, n_ctx)
    return EngineSettings(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(n_ubatch, n_batch),
                          n_threads=n_threads, flash_attn="off")


def text_plan(model, text: str, n_ctx: int, n_chunks: int | None = None) -> ChunkPlan:
    """Tokenize `text` as the tool does and cut it into chunks."""
    with LlamaEngine(model) as engine:
        toks = engine.tokenize(text, add_special=True, parse_special=False)
        bos = engine.bos_if_added()
    return chunk_plan(toks, n_ctx, bos, n_chunks, where=model)


def capture_chunks(model, plan: ChunkPlan, out, *, settings: EngineSettings | None = None, name: str = "chunk",
                   overwrite: bool = False, progress: Progress | None = None) -> CaptureResult:
    """One dump at `out` with each chunk of `plan` as a document `{name}-{i}` (i from 1, as the tool
    numbers them), evaluated as llama-perplexity evaluates it."""
    settings = settings or tool_settings(plan.n_ctx)
    if settings.n_ctx < plan.n_ctx:
        raise EngineError(model, "n_ctx", f"the engine's context {settings.n_ctx} is smaller than the "
                          f"chunks' {plan.n_ctx}")
    docs = [CaptureDoc(f"{name}-{i + 1}", plan.chunk(i), source="llama-perplexity-chunk")
            for i in range(plan.n_chunk)]
    return capture_dump(model, docs, out, settings=settings, overwrite=overwrite, progress=progress,
                        extra_meta={META_KEY: plan.meta()})


@dataclass(frozen=True)
class ChunkDump:
    """What `exactedit engine perplexity-chunks` wrote."""

    path: str
    n_ctx: int
    n_chunk: int
    text_tokens: int
    bos: int | None
    settings: dict
    ubatch_sizes: tuple[int, ...]
    model_sha256: str

    def to_dict(self) -> dict:
        return {"dump": self.path, "n_ctx": self.n_ctx, "n_chunk": self.n_chunk, "text_tokens": self.text_tokens,
                "bos": self.bos, "engine_settings": self.settings, "ubatch_sizes": list(self.ubatch_sizes),
                "model_sha256": self.model_sha256, "scored_rows": f"{self.n_ctx // 2}:{self.n_ctx - 1}"}


def dump_text_chunks(model, text_file, n_ctx: int, out, *, n_chunks: int | None = None, n_batch: int = 512,
                     n_ubatch: int = 512, n_threads: int = 2, overwrite: bool = False,
                     progress: Progress | None = None) -> ChunkDump:
    """Tokenize `text_file` as llama-perplexity does, cut it into its chunks and dump each as it
    evaluates them (`-c n_ctx -b n_batch -ub n_ubatch -t n_threads -fa off`). The text is read
    bounded: a regular file (a FIFO or a device refused by name) of at most MAX_TEXT_BYTES, UTF-8."""
    from exactedit.files import MAX_TEXT_BYTES, read_utf8

    text = read_utf8(text_file, MAX_TEXT_BYTES, EngineError, "--text")
    plan = text_plan(model, text, n_ctx, n_chunks)
    settings = tool_settings(n_ctx, n_batch, n_ubatch, n_threads)
    res = capture_chunks(model, plan, out, settings=settings, overwrite=overwrite, progress=progress)
    total = int(np.asarray(plan.tokens).size)
    return ChunkDump(str(res.path), n_ctx, plan.n_chunk, total, plan.bos, settings.as_meta(),
                     tuple(res.meta["ubatch_sizes"]), res.model_sha256)


def render_chunk_dump(r: ChunkDump) -> str:
    return (f"wrote {r.path}: {r.n_chunk} chunks of {r.n_ctx} tokens (one document each; micro-batches "
            f"{list(r.ubatch_sizes)}); llama-perplexity scores rows {r.n_ctx // 2}:{r.n_ctx - 1} of each: "
            f"exactedit kld --dump {r.path} --doc-rows {r.n_ctx // 2}:{r.n_ctx - 1} ...")
