"""Batched sampling: many replies decoded together, one `llama_decode` per step for all of them
(`_generate_batched`, the engine `native.llamacpp.sample.sample_replies` runs unless a reply asks
for the one-at-a-time loop of native/llamacpp/generate.py).

On a CPU a one-token decode is bound by reading the weights; decoding the next token of `slots`
replies in one batch reads them once, so replies come faster than one at a time (`exactedit bench
generate`, Qwen on 2 cores: 24.1 against 12.3 tokens/s with 16 slots, docs/performance.md). Each reply keeps
its own llama.cpp sampler chain (top-k, temperature, seeded `dist`: the chain of
the one-at-a-time loop, with the rules' samplers first when `shapers` is given) and its own
KV stream (a sequence id per slot, `kv_unified` off), so what one reply attends to is its own
history only. When a reply stops (a stop token, kept, or `max_new` tokens) its slot is cleared and
the next (prompt, seed) job starts there.

A prompt is prefilled alone, in its own `llama_decode` calls, so a reply's first token is the one
the one-at-a-time loop samples. The steps after it (one token per running reply) share one batch;
with up to 3 rows per batch each reply's logits are bitwise those it gets alone, from 4 rows on
ggml multiplies with its batched kernels and the logits move by the engine's own rounding noise
(measured against the same rows decoded alone: KL up to 0.006 nats per row on Qwen2.5-Coder-1.5B,
0.02 on Gemma 3 270M, argmax unchanged), so with more than 3 slots a reply is not token for token
the one-at-a-time loop's. It is deterministic: the same jobs in the same order with the same
`slots` give the same replies (tests/native/llamacpp/test_live_batched.py), and comparisons (base vs
edited, `mine`) run both sides through the same loop with the same jobs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from exactedit.native.llamacpp.engine import EngineError, LlamaEngine, sampler_chain
from exactedit.native.llamacpp.generate import Sampling, Generation, StepShaping, stop_kind
from exactedit.native.llamacpp.rewind import Rewinder

__all__ = ["DEFAULT_SLOTS"]

# 16 on 2 cores: Qwen2.5-Coder-1.5B 1.96x the one-at-a-time loop, 8 slots 1.71x (docs/performance.md)
DEFAULT_SLOTS = 16


@dataclass
class _Slot:
    job: int
    prompt: np.ndarray
    config: Sampling
    chain: object
    pending: list            # tokens still to decode (the prompt, then each sampled token)
    out: list
    steps: StepShaping | None = None
    pos: int = 0
    stopped: bool = False
    rewind: object = None    # rewind mode: its rewind.Rewinder


def _generate_batched(engine: LlamaEngine, jobs: Sequence[tuple[np.ndarray, Sampling]], *,
                      stop_ids: frozenset | None = None, turn_end: frozenset = frozenset(), slots: int = DEFAULT_SLOTS,
                      shapers: Callable[[], object] | None = None,
                      progress: Callable[[int, int], None] | None = None, rewind=None) -> list[Generation]:
    """The batched engine behind `sample.sample_replies` (which checks the jobs' prompts, int32
    [1..n_ctx - max_new], and `slots`): one `Generation` per (prompt, config) job, in job order;
    `slots` replies decode at once. `shapers`: makes a shaper (solvers.shaping.rules.Shaper) for each
    slot, reset for each of its jobs; the rules then run live in every reply as in the one-at-a-time
    loop (its `shape` and `probe` samplers first in the reply's chain, the same per-step record).
    `rewind`: a rewind.RewindConfig (rewind mode): each reply rolls back as in the one-at-a-time
    loop (its own stream's KV cells removed)."""
    lib, s, V = engine._lib, engine.settings, engine.n_vocab
    if not jobs:
        return []
    stops = stop_ids
    n_slots = min(slots, len(jobs))
    per_seq = max(p.size + c.max_new for p, c in jobs)
    per_seq = -(-per_seq // 256) * 256                      # whole 256-cell pages per stream
    ctx = engine._context(None, n_seq=n_slots, n_ctx=per_seq * n_slots)
    mem = lib.llama_get_memory(ctx)
    cap = max(min(s.n_batch, per_seq), n_slots)             # a prefill chunk is at most a stream's cells
    batch = lib.llama_batch_init(cap, 0, 1)
    results: list[Generation | None] = [None] * len(jobs)
    active: dict[int, _Slot] = {}
    slot_shapers = [shapers() for _ in range(n_slots)] if shapers is not None else None
    next_job, done = 0, 0

    def free(st: _Slot) -> None:
        if st.steps is not None:
            st.steps.detach(st.chain)
        lib.llama_sampler_free(st.chain)

    def start(slot: int) -> None:
        nonlocal next_job
        p, c = jobs[next_job]
        lib.llama_memory_seq_rm(mem, slot, -1, -1)
        steps = rw = None
        if slot_shapers is not None or rewind is not None:
            steps = StepShaping(lib, V, slot_shapers[slot] if slot_shapers is not None else None)
            steps.start(p)
        if rewind is not None:
            rw = Rewinder(rewind, engine.piece)
            steps.banned = rw.banned
        first = [smp.sampler for smp in steps.samplers] if steps is not None else ()
        active[slot] = _Slot(next_job, p, c, sampler_chain(lib, c.top_k, c.temperature, c.seed, first),
                             list(int(t) for t in p), [], steps, rewind=rw)
        next_job += 1

    def finish(slot: int) -> None:
        nonlocal done
        st = active.pop(slot)
        free(st)
        n = len(st.out)
        stop = stop_kind(st.out, st.stopped, turn_end)
        if st.steps is not None:
            results[st.job] = st.steps.generation(st.prompt, st.out, st.config.seed, stop,
                                                  st.rewind.events if st.rewind is not None else ())
        else:
            results[st.job] = Generation(st.prompt, np.array(st.out, dtype=np.int32), int(st.config.seed), stop,
                                         np.zeros((n, 0), bool), np.zeros(n, np.float64))
        done += 1
        if progress is not None:
            progress(done, len(jobs))

    def decode(entries) -> dict[int, int]:
        """Decode (slot, tokens) entries in one batch; {slot: batch index of its logits row}."""
        n, at = 0, {}
        for slot, toks in entries:
            st = active[slot]
            for i, t in enumerate(toks):
                batch.token[n], batch.pos[n] = t, st.pos + i
                batch.n_seq_id[n], batch.seq_id[n][0] = 1, slot
                batch.logits[n] = int(i == len(toks) - 1 and len(toks) == len(st.pending))
                n += 1
            if len(toks) == len(st.pending):
                at[slot] = n - 1
            st.pending = st.pending[len(toks):]
            st.pos += len(toks)
        batch.n_tokens = n
        if lib.llama_decode(ctx, batch) != 0:
            raise EngineError(engine.path, "llama_decode", f"failed on a batch of {n} tokens ({len(active)} replies)")
        return at

    def sample(slot: int, idx: int) -> None:
        st = active[slot]
        open_text = st.steps.open_text if st.rewind is not None else True
        tok = int(lib.llama_sampler_sample(st.chain, ctx, idx))
        if st.steps is not None:
            st.steps.accept(tok)
        st.out.append(tok)
        st.stopped = (tok in stops) if stops is not None else engine.is_eog(tok)
        if st.rewind is not None:
            back = st.rewind.push(tok, open_text, ended=st.stopped or len(st.out) >= st.config.max_new)
            if back is not None:            # roll back (generate.py): keep `back` tokens, decode the last kept again
                del st.out[back:]
                st.steps.rewind(st.prompt, st.out)
                st.pos, st.stopped = st.prompt.size + back - 1, False
                lib.llama_memory_seq_rm(mem, slot, st.pos, -1)
                st.pending = [int(st.prompt[st.pos]) if back == 0 else st.out[-1]]
                return
        if st.stopped or len(st.out) >= st.config.max_new:
            finish(slot)
            if next_job < len(jobs):
                start(slot)
        else:
            st.pending = [tok]

    try:
        for slot in range(n_slots):
            start(slot)
        while active:
            # a prompt is prefilled alone, so its first token is the one-at-a-time loop's (module doc)
            while starting := [k for k in sorted(active) if len(active[k].pending) > 1 or not active[k].out]:
                slot = starting[0]
                at = {}
                while slot not in at:
                    at = decode([(slot, active[slot].pending[:cap])])
                sample(slot, at[slot])
            if active:
                # then one token of every running reply, all in one batch
                for slot, idx in decode([(k, active[k].pending) for k in sorted(active)]).items():
                    sample(slot, idx)
    finally:
        for st in active.values():
            free(st)
        lib.llama_batch_free(batch)
        lib.llama_free(ctx)
    return results
