"""Generation's one door: `sample_replies(engine, jobs, ...)`, every reply of every command.

`sample_replies(engine, [(prompt_tokens, Sampling), ...], stop_ids=..., turn_end=..., shapers=...,
processor=..., slots=..., record=..., sequential=..., on_token=..., progress=...)` samples one reply per job, in
job order, up to a stop token (kept) or the job's `max_new` tokens (then the reply is truncated),
with llama.cpp's own sampler chain (top-k, temperature, seeded dist), and returns one
`Generation` per job (native/llamacpp/generate.py): its tokens, its seed, why it stopped
("turn_end" when its last token is one of `turn_end`, "end_of_generation" for another stop token,
"max_new"), which rules fired and each step's KL.

Two engines run behind it, token for token the same up to 3 slots:
- the batched loop (native/llamacpp/batched.py): `slots` replies decode together, each with its own
  chain and KV stream; `shapers` (a factory) gives each slot its own shaper, reset for each of its
  jobs. It runs unless a reply asks for the other;
- the one-at-a-time loop (native/llamacpp/generate.py), one reply after the other, when there is a
  `processor` (its state is one history), `record` (each step's raw, received and engine rows, for
  the bitwise shaping check), `on_token` (a per-token hook: `exactedit serve` streams through it) or
  `sequential`; `shapers` then makes the one shaper, reset per job.
A `LogitsProcessor` is either a callable `(history, logits) -> logits` (history: the prompt and the
tokens sampled so far, int32; logits: the raw float32 row; it returns the row the sampler chain
receives) or an object with the live shaper's interface (`rules`, `reset()`, `push(token)`,
`shape(logits) -> (logits, fired)`, solvers.shaping.rules.Shaper).
"""
from __future__ import annotations

from typing import Callable, Iterable, Protocol, Sequence, Union

import numpy as np

from exactedit.native.llamacpp.batched import DEFAULT_SLOTS, _generate_batched
from exactedit.native.llamacpp.engine import EngineError, LlamaEngine
from exactedit.native.llamacpp.generate import Generation, Sampling, _generate
from exactedit.native.llamacpp.rewind import RewindConfig, Rewinder

__all__ = ["DEFAULT_SLOTS", "LogitsProcessor", "sample_replies"]


class _Shaper(Protocol):
    rules: tuple

    def reset(self) -> None: ...

    def push(self, tok: int): ...

    def shape(self, logits: np.ndarray) -> tuple[np.ndarray, tuple[bool, ...]]: ...


LogitsProcessor = Union[Callable[[np.ndarray, np.ndarray], np.ndarray], _Shaper]


class _Callable:
    """A `(history, logits) -> logits` processor in the shaper's interface."""

    rules = ("processor",)

    def __init__(self, fn):
        self.fn, self.history = fn, []

    def reset(self) -> None:
        self.history = []

    def push(self, tok: int) -> None:
        self.history.append(int(tok))

    def shape(self, logits: np.ndarray):
        out = np.asarray(self.fn(np.array(self.history, np.int32), logits.copy()), dtype=np.float32)
        if out.shape != logits.shape:
            raise EngineError("processor", "logits", f"returned shape {out.shape}, expected {logits.shape}")
        return out, (not np.array_equal(out, logits),)


def _as_shaper(processor):
    if processor is None or hasattr(processor, "shape"):
        return processor
    if not callable(processor):
        raise EngineError("processor", "type", "expected a callable (history, logits) -> logits or a shaper")
    return _Callable(processor)


def _token_set(ids: int | Iterable[int] | None) -> frozenset:
    if ids is None:
        return frozenset()
    if isinstance(ids, (int, np.integer)):
        return frozenset((int(ids),))
    return frozenset(int(t) for t in ids)


def sample_replies(engine: LlamaEngine, jobs: Sequence[tuple[np.ndarray, Sampling]], *,
                   stop_ids: Iterable[int] | None = None, turn_end: int | Iterable[int] | None = None,
                   shapers: Callable[[], object] | None = None, processor: LogitsProcessor | None = None,
                   slots: int = DEFAULT_SLOTS, record: bool = False, sequential: bool = False,
                   on_token: Callable[[int, int], bool | None] | None = None,
                   progress: Callable[[int, int], None] | None = None,
                   rewind: RewindConfig | None = None) -> list[Generation]:
    """One `Generation` per (prompt tokens, Sampling) job, in job order (module doc).
    `stop_ids`: the tokens a reply stops after (None: the vocabulary's end-of-generation tokens,
    `engine.is_eog`; empty: none, every reply runs to max_new); `turn_end`: the token(s) whose stop
    is "turn_end". `shapers`: a factory of shapers (solvers.shaping.rules.Shaper), one per slot;
    `processor`: one logits processor or shaper for every reply (one at a time); not both.
    `on_token(job, token)` after each sampled token of job number `job` (one at a time); a true
    return ends that reply there (its stop is "halt"). `progress(done, total)` after each reply.
    `rewind`: a rewind.RewindConfig, the rewind mode (native/llamacpp/rewind.py): a banned phrase or a
    variant that completes is rolled back and resampled, in either engine; `on_token` then sees a
    token once it can no longer be rolled back. None (the penalty mode) leaves the loops as they are."""
    s = engine.settings
    todo = [(np.asarray(p, dtype=np.int32), c) for p, c in jobs]
    if not todo:
        return []
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        raise EngineError("sample_replies", "slots", f"expected an integer >= 1, got {slots!r}")
    for k, (p, c) in enumerate(todo):
        if p.ndim != 1 or p.size == 0 or p.size + c.max_new > s.n_ctx:
            room = s.n_ctx - c.max_new          # "needs 1..-999997952 tokens" said nothing of max_new
            raise EngineError(engine.path, f"prompt[{k}]", (
                f"max_new {c.max_new} leaves no room for a prompt in the context of n_ctx {s.n_ctx} tokens"
                if room < 1 else f"needs 1..{room} tokens (n_ctx {s.n_ctx} less max_new {c.max_new}), got {p.size}"))
    if shapers is not None and processor is not None:
        raise EngineError("sample_replies", "shapers", "give a shaper factory or a processor, not both")
    stops = None if stop_ids is None else frozenset(int(t) for t in stop_ids)
    ends = _token_set(turn_end)
    if processor is None and not record and not sequential and on_token is None:
        return _generate_batched(engine, todo, stop_ids=stops, turn_end=ends, slots=slots, shapers=shapers,
                                 progress=progress, rewind=rewind)
    shaper = _as_shaper(processor) if shapers is None else shapers()
    out = []
    for k, (p, c) in enumerate(todo):
        hook = None if on_token is None else (lambda tok, k=k: on_token(k, tok))
        rw = None if rewind is None else Rewinder(rewind, engine.piece)
        out.append(_generate(engine, p, c, shaper, record=record, stop_ids=stops, turn_end=ends, on_token=hook,
                             rewind=rw))
        if progress is not None:
            progress(len(out), len(todo))
    return out
