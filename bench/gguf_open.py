"""`exactedit bench gguf-open`: open a GGUF and list its tensors, ours vs gguf-py's GGUFReader.

The file is synthetic: a `vocab`-token table with token types, scores and (optionally) as many
merges, as real tokenizers carry, and a model-sized tensor table of tiny F32 tensors. Both readers
open the same file; the ratio is gguf-py's time over ours (best of the repeats each).
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit.quant import gguf
from exactedit.errors import ExacteditError
from exactedit.quant.gguf.write import TensorData, write_gguf

_ROLES = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
          "ffn_down", "post_ffw_norm")


@dataclass(frozen=True)
class GGUFOpenBenchConfig:
    vocab: int = 262_144
    merges: bool = True
    layers: int = 48
    repeats: int = 3           # our open, best of
    gguf_py_repeats: int = 1   # gguf-py's open takes seconds to minutes per run at 262K tokens
    workdir: str | None = None

    def __post_init__(self):
        if self.vocab < 1 or self.layers < 0 or self.repeats < 1 or self.gguf_py_repeats < 1:
            raise ExacteditError(f"bench gguf-open: vocab, repeats >= 1 and layers >= 0, got {self}")


@dataclass(frozen=True)
class GGUFOpenBenchResult:
    vocab: int
    merges: bool
    file_bytes: int
    tensors_ours: int
    tensors_gguf_py: int
    ours_s: float          # open + list tensors, best of repeats
    tokens_s: float        # our decode of the whole token table, once
    gguf_py_s: float       # GGUFReader(path) + list tensors, best of repeats
    ratio: float           # gguf_py_s / ours_s

    def to_dict(self) -> dict:
        return asdict(self)


def _write(path: Path, cfg: GGUFOpenBenchConfig) -> None:
    toks = [f"tok{i}" for i in range(cfg.vocab)]
    meta = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": toks, "tokenizer.ggml.token_type": np.ones(cfg.vocab, np.int32),
            "tokenizer.ggml.scores": np.zeros(cfg.vocab, np.float32)}
    if cfg.merges:
        meta["tokenizer.ggml.merges"] = [f"t{i} k{i}" for i in range(cfg.vocab)]
    tiny = TensorData.from_f32(np.zeros(32, np.float32))
    tensors = {f"blk.{i}.{r}.weight": tiny for i in range(cfg.layers) for r in _ROLES}
    tensors.update({"token_embd.weight": tiny, "output_norm.weight": tiny, "output.weight": tiny})
    write_gguf(path, meta, tensors, overwrite=True)


def _best(fn, repeats: int) -> tuple[float, int]:
    best, out = float("inf"), 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run_gguf_open_bench(cfg: GGUFOpenBenchConfig,
                        progress: Callable[[int, int], None] | None = None) -> GGUFOpenBenchResult:
    from gguf import GGUFReader

    total = 2 + cfg.repeats + cfg.gguf_py_repeats
    tick = (lambda d: progress(d, total)) if progress is not None else (lambda d: None)
    with tempfile.TemporaryDirectory(dir=cfg.workdir) as tmp:
        path = Path(tmp) / "bench_vocab.gguf"
        _write(path, cfg)
        tick(1)

        def ours() -> int:
            with gguf.open(path) as g:
                return len([(t.name, t.type_name, t.shape, t.offset) for t in g.tensors.values()])

        ours_s, n_ours = _best(ours, cfg.repeats)
        tick(1 + cfg.repeats)
        with gguf.open(path) as g:
            t0 = time.perf_counter()
            n_tok = len(g.tokens())
            tokens_s = time.perf_counter() - t0
        if n_tok != cfg.vocab:
            raise ExacteditError(f"bench gguf-open: read {n_tok} tokens, wrote {cfg.vocab}")
        tick(2 + cfg.repeats)

        def theirs() -> int:
            r = GGUFReader(path)
            return len([(t.name, t.tensor_type, t.shape, t.data_offset) for t in r.tensors])

        ref_s, n_ref = _best(theirs, cfg.gguf_py_repeats)
        tick(total)
        size = path.stat().st_size
    return GGUFOpenBenchResult(cfg.vocab, cfg.merges, size, n_ours, n_ref, ours_s, tokens_s, ref_s,
                               ref_s / ours_s)


def render_gguf_open_bench(r: GGUFOpenBenchResult) -> str:
    """`exactedit bench gguf-open`'s table."""
    return (f"vocab {r.vocab:,}{' + merges' if r.merges else ''}, file {r.file_bytes:,} bytes, "
            f"{r.tensors_ours} tensors\n"
            f"  exactedit open + list   {r.ours_s * 1e3:10.1f} ms\n"
            f"  gguf-py GGUFReader      {r.gguf_py_s * 1e3:10.1f} ms\n"
            f"  ratio (gguf-py / ours)  {r.ratio:10.1f}x\n"
            f"  token table decode      {r.tokens_s * 1e3:10.1f} ms")
