"""A small world for the `kld` tests: an rmsnorm model (Q6_K head, Q8_0 ffn_down), a copy with
ffn_down rows edited, and dumps whose documents are chunks of CTX tokens (micro-batches recorded,
so `--match-engine llamacpp` runs on them)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

N, H, V, CTX = 256, 64, 300, 12


def make_world(root: Path, dumps=(("d1", 2, [CTX, CTX]), ("d2", 1, [5, 7]))) -> tuple[str, ...]:
    """(base, edited, *dump paths); each dump spec is (name, documents, ubatch_sizes[, tokens per document])."""
    from exactedit import quant
    from exactedit.dumps import DocInfo, write_dump
    from exactedit.quant import gguf
    from exactedit.quant.gguf.write import synthetic_model
    from exactedit.quant.gguf.transplant import transplant

    base = synthetic_model(root / "base.gguf", vocab=V, n=N, h=H, layers=1, seed=4).path
    with gguf.open(base) as g:
        W = g.read_rows("blk.0.ffn_down.weight")
        raw = np.array(g.read_raw("blk.0.ffn_down.weight"))
    rows = np.arange(0, N, 16)
    raw[rows] = quant.quantize(W[rows] + 0.3 * np.random.default_rng(1).standard_normal((rows.size, H)), "Q8_0")
    edited = root / "edited.gguf"
    transplant(base, edited, replace={"blk.0.ffn_down.weight": raw})
    rng = np.random.default_rng(0)
    paths = []
    for name, n_docs, ubatches, *ctx in dumps:
        L = ctx[0] if ctx else CTX
        T = n_docs * L
        toks = rng.integers(0, V, T)
        nxt = np.concatenate([np.r_[toks[i * L + 1:(i + 1) * L], -1] for i in range(n_docs)])
        docs = [DocInfo(f"{name}-{i}", i * L, L, "s", "") for i in range(n_docs)]
        paths.append(str(write_dump(root / name, arch="rmsnorm", layer=0, docs=docs, meta={"ubatch_sizes": ubatches},
                                    fields={"tokens": toks, "next": nxt, "R": 3 * rng.standard_normal((T, N)),
                                            "hh": rng.standard_normal((T, H))})))
    return (str(base), str(edited), *paths)
