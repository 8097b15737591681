"""llama.cpp's own rates on this machine, the ceilings `exactedit bench loop` holds our stages to:
the engine driven the plainest way through its C API, no Python work per token but the calls.

- `plain_generate(engine, jobs, slots)`: batched generation as llama.cpp's `batched` example does
  it: `slots` sequences in one context (a KV stream each, as native/llamacpp/batched.py), each
  with the sampler chain of every generation loop here (engine.py `sampler_chain`: top-k,
  temperature, seeded dist); the starting prompts prefilled together, several sequences per
  `llama_decode` call (up to n_batch tokens), then one token of every running reply per call.
  No stop token: every reply runs to its `max_new` tokens, so a loop of ours run with
  `stop_ids=()` does the same work.
- `plain_prefill(engine, docs)`: each document from position 0 in one context made once, its
  memory cleared between documents, `n_batch` tokens per call, every position's logits computed
  (the graph a capture of the last layer's rows needs) and none copied out.
Both return the tokens they ran; the caller times them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from exactedit.native.llamacpp.engine import EngineError, LlamaEngine, sampler_chain
from exactedit.native.llamacpp.generate import Sampling

__all__ = ["plain_generate", "plain_prefill"]


def plain_generate(engine: LlamaEngine, jobs: Sequence[tuple[np.ndarray, Sampling]], slots: int) -> int:
    """Generate every job's `max_new` tokens, `slots` replies at a time (module doc); the tokens
    generated."""
    lib, s = engine._lib, engine.settings
    if not jobs:
        return 0
    n_slots = min(int(slots), len(jobs))
    per_seq = -(-max(np.asarray(p).size + c.max_new for p, c in jobs) // 256) * 256
    ctx = engine._context(None, n_seq=n_slots, n_ctx=per_seq * n_slots)
    mem = lib.llama_get_memory(ctx)
    cap = max(s.n_batch, n_slots)
    batch = lib.llama_batch_init(cap, 0, 1)
    chains: dict[int, object] = {}
    left: dict[int, int] = {}           # slot -> tokens still to sample
    pos: dict[int, int] = {}
    last: dict[int, int] = {}           # slot -> its token to decode next
    queue = list(range(len(jobs)))
    generated = 0

    def decode(rows) -> None:
        """rows: (slot, token, position, wants logits), at most `cap` of them, one llama_decode."""
        for i, (slot, tok, at, want) in enumerate(rows):
            batch.token[i], batch.pos[i] = tok, at
            batch.n_seq_id[i], batch.seq_id[i][0] = 1, slot
            batch.logits[i] = int(want)
        batch.n_tokens = len(rows)
        if lib.llama_decode(ctx, batch) != 0:
            raise EngineError(engine.path, "llama_decode", f"failed on a batch of {len(rows)} tokens")

    def sample(slot: int, idx: int) -> None:
        nonlocal generated
        tok = int(lib.llama_sampler_sample(chains[slot], ctx, idx))
        generated += 1
        left[slot] -= 1
        last[slot] = tok

    try:
        while queue or chains:
            free = [k for k in range(n_slots) if k not in chains]
            starting = []
            for slot in free[:len(queue)]:
                p, c = jobs[queue.pop(0)]
                lib.llama_memory_seq_rm(mem, slot, -1, -1)
                chains[slot] = sampler_chain(lib, c.top_k, c.temperature, c.seed)
                left[slot], pos[slot] = c.max_new, 0
                starting.append((slot, [int(t) for t in np.asarray(p)]))
            rows = [(slot, t, i, i == len(toks) - 1) for slot, toks in starting for i, t in enumerate(toks)]
            for a in range(0, len(rows), cap):      # the prompts together, n_batch tokens a call
                part = rows[a:a + cap]
                decode(part)
                for i, (slot, _t, at, want) in enumerate(part):
                    if want:
                        pos[slot] = at + 1
                        sample(slot, i)
            while chains and not (queue and any(left[k] == 0 for k in chains)):
                for slot in [k for k in chains if left[k] == 0]:
                    lib.llama_sampler_free(chains.pop(slot))
                if not chains:
                    break
                order = sorted(chains)
                decode([(k, last[k], pos[k], True) for k in order])
                for i, k in enumerate(order):
                    pos[k] += 1
                    sample(k, i)
            for slot in [k for k in chains if left[k] == 0]:
                lib.llama_sampler_free(chains.pop(slot))
    finally:
        for chain in chains.values():
            lib.llama_sampler_free(chain)
        lib.llama_batch_free(batch)
        lib.llama_free(ctx)
    return generated


def plain_prefill(engine: LlamaEngine, docs: Sequence[np.ndarray]) -> int:
    """Prefill each document from position 0 in one context (module doc); the tokens prefilled."""
    lib, s = engine._lib, engine.settings
    docs = [np.asarray(d, dtype=np.int32) for d in docs]
    if any(d.ndim != 1 or d.size > s.n_ctx for d in docs):
        raise EngineError(engine.path, "docs", f"expected 1-D token arrays of at most n_ctx {s.n_ctx} tokens")
    ctx = engine._context(None)
    mem = lib.llama_get_memory(ctx)
    batch = lib.llama_batch_init(s.n_batch, 0, 1)
    done = 0
    try:
        for toks in docs:
            lib.llama_memory_clear(mem, True)
            for start in range(0, toks.size, s.n_batch):
                n = min(s.n_batch, toks.size - start)
                for i in range(n):
                    batch.token[i], batch.pos[i] = int(toks[start + i]), start + i
                    batch.n_seq_id[i], batch.seq_id[i][0] = 1, 0
                    batch.logits[i] = 1
                batch.n_tokens = n
                if lib.llama_decode(ctx, batch) != 0:
                    raise EngineError(engine.path, "llama_decode", f"failed at token {start} of a document")
            done += int(toks.size)
    finally:
        lib.llama_batch_free(batch)
        lib.llama_free(ctx)
    return done
