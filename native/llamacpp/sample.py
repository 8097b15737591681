"""Seeded sampling of replies for `exactedit mine` and `dataset build`, with a logits hook.

`sample_all(engine, prompt_tokens, cfg, seeds, stop_ids=..., turn_end=..., processor=...)`
samples one reply per prompt and seed, up to a stop token (kept) or `cfg.max_new` tokens (then
the reply is truncated), with llama.cpp's own sampler chain (top-k, temperature, seeded dist).
Without a processor the replies decode several at a time (native/llamacpp/batched.py); with one, each
reply runs through the live loop of native/llamacpp/generate.py, one at a time. A `LogitsProcessor` is
either a callable `(history, logits) -> logits` (history: the prompt and the tokens sampled so
far, int32; logits: the raw float32 row; it returns the row the sampler chain receives) or an
object with the live shaper's interface (`rules`, `reset()`, `push(token)`,
`shape(logits) -> (logits, fired)`, solvers.shaping.rules.Shaper).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence, Union

import numpy as np

from exactedit.native.llamacpp.engine import EngineError, LlamaEngine
from exactedit.native.llamacpp.batched import DEFAULT_SLOTS, generate_batched
from exactedit.native.llamacpp.generate import Sampling, generate


class _Shaper(Protocol):
    rules: tuple

    def reset(self) -> None: ...

    def push(self, tok: int): ...

    def shape(self, logits: np.ndarray) -> tuple[np.ndarray, tuple[bool, ...]]: ...


LogitsProcessor = Union[Callable[[np.ndarray, np.ndarray], np.ndarray], _Shaper]


@dataclass(frozen=True, eq=False)
class Sample:
    prompt: np.ndarray     # int32 rendered prompt tokens
    tokens: np.ndarray     # int32 sampled tokens, the stop token included when one came
    seed: int
    stop: str              # "turn_end", "end_of_generation" or "max_new"
    fired: np.ndarray | None = None   # bool [steps, rules] when the processor is a shaper

    @property
    def truncated(self) -> bool:
        return self.stop == "max_new"

    @property
    def sequence(self) -> np.ndarray:
        return np.concatenate([self.prompt, self.tokens]).astype(np.int32)


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


def _sample(g, seed: int, turn_end: int | None, fired) -> Sample:
    last = int(g.tokens[-1]) if g.tokens.size else -1
    stop = "max_new" if g.truncated else "turn_end" if last == turn_end else "end_of_generation"
    return Sample(g.prompt, g.tokens, int(seed), stop, fired)


def sample_all(engine: LlamaEngine, prompt_tokens: Sequence[np.ndarray], cfg: Sampling, seeds: Sequence[int], *,
               stop_ids: Sequence[int], turn_end: int | None = None, processor: LogitsProcessor | None = None,
               sequential: bool = False, slots: int = DEFAULT_SLOTS,
               progress: Callable[[int, int], None] | None = None) -> list[list[Sample]]:
    """Per prompt, one `Sample` per seed (same seeds for every prompt; `cfg.seed` is replaced by
    each of `seeds`). Without a processor the
    replies decode `slots` at a time (native/llamacpp/batched.py); with one, or `sequential`, one at a time
    through the live loop (a processor's state is one history)."""
    stops = tuple(int(t) for t in stop_ids)
    if not stops:
        raise EngineError(engine.path, "stop_ids", "no stop token: a reply could only end at max_new")
    shaper = _as_shaper(processor)
    if shaper is None and not sequential:
        jobs = [(p, seed) for p in prompt_tokens for seed in seeds]
        gens = generate_batched(engine, [p for p, _ in jobs],
                                [replace(cfg, seed=int(seed)) for _, seed in jobs],
                                stop_ids=stops, slots=slots, progress=progress)
        samples = [_sample(g, seed, turn_end, None) for g, (_, seed) in zip(gens, jobs)]
        return [samples[i:i + len(seeds)] for i in range(0, len(samples), len(seeds))]
    out, done, total = [], 0, len(prompt_tokens) * len(seeds)
    for ptoks in prompt_tokens:
        row = []
        for seed in seeds:
            g = generate(engine, ptoks, replace(cfg, seed=int(seed)), shaper,
                         stop_ids=stops)
            row.append(_sample(g, seed, turn_end, g.fired))
            done += 1
            if progress is not None:
                progress(done, total)
        out.append(row)
    return out
