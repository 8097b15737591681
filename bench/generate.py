"""`exactedit bench generate`: batched sampling (native/llamacpp/batched.py) against the one-at-a-time
loop (native/llamacpp/generate.py), the same replies of a real model, in the same run.

Both sides answer the same (prompt, seed) jobs with the same llama.cpp sampler chain (top-k,
temperature, seeded `dist`) and the same cap; the one-at-a-time loop is the baseline, so the
result is a ratio of generated tokens per second measured minutes apart on the same machine,
the order alternating over `repeats` (best of each kept). With `rules` (compiled shaping rules,
`exactedit shape compile`) both sides run them live, as `shape rates` does. The prompts are the
bench's own, in the model's chat template (the rules' one with `rules`; plain "Question: ...
Answer:" text when the GGUF has none). The bench also
reports how many replies came out token for token the same: all of them up to 3 slots (ggml's
one-row kernels), fewer beyond (its batched kernels round differently; native/llamacpp/batched.py).
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit.native.llamacpp.batched import DEFAULT_SLOTS
from exactedit.native.llamacpp.engine import EngineError

Progress = Callable[[int, int], None]

PROMPTS = ("How do I read a CSV file in Python?", "Explain what a hash map is in two sentences.",
           "Write a short poem about the sea.", "How can I reverse a string in JavaScript?",
           "What is the difference between a list and a tuple?", "Give me three tips for writing clear emails.",
           "How do I find the largest file in a directory on Linux?", "What does a compiler do?",
           "Summarize the plot of a detective story in one paragraph.", "How do I sort a dictionary by value?",
           "Name three uses of a binary search tree.", "How can I measure how long a function takes to run?")


@dataclass(frozen=True)
class GenerateBenchConfig:
    model: str                  # GGUF path (the CLI resolves public model names)
    prompts: int = 8
    seeds: int = 1
    max_new: int = 64
    slots: int = DEFAULT_SLOTS
    temperature: float = 0.8
    top_k: int = 40
    repeats: int = 1
    rules: str | None = None    # compiled shaping rules (JSON), run live on both sides

    def __post_init__(self):
        for key in ("prompts", "seeds", "max_new", "slots", "repeats", "top_k"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise EngineError("bench generate", key, f"expected a positive integer, got {v!r}")
        if not 1 <= self.prompts <= len(PROMPTS):
            raise EngineError("bench generate", "prompts", f"expected 1..{len(PROMPTS)} (the bench's own prompts)")


@dataclass(frozen=True)
class GenerateBenchResult:
    config: GenerateBenchConfig
    replies: int
    tokens: int                 # generated tokens per side (the batched side's)
    tokens_one_at_a_time: int
    one_at_a_time_s: float
    batched_s: float
    one_at_a_time_tps: float
    batched_tps: float
    ratio: float                # batched tokens/s over one-at-a-time tokens/s
    identical_replies: int      # replies token for token the same on both sides
    cpus: int

    def to_dict(self) -> dict:
        return {"bench": "generate", **asdict(self)}


def run_generate_bench(cfg: GenerateBenchConfig, progress: Progress | None = None) -> GenerateBenchResult:
    from exactedit.native.llamacpp.batched import generate_batched
    from exactedit.native.llamacpp.chat import model_chat
    from exactedit.native.llamacpp.engine import LlamaEngine
    from exactedit.native.llamacpp.generate import Sampling, generate
    from exactedit.native.llamacpp.chat import prompt_tokens, render_prompt
    from exactedit.native.shaping.live import open_rules, shaper_for

    path = Path(cfg.model)
    compiled = tpl = None
    if cfg.rules is not None:
        compiled, tpl = open_rules(path, cfg.rules)
    chat = model_chat(path) if tpl is None else None
    stop = tuple(compiled.vocab.turn_end) if compiled is not None else None
    shapers = (lambda: shaper_for(compiled)) if compiled is not None else None
    total, done = 2 * cfg.repeats, [0]

    def tick():
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    with LlamaEngine(path) as engine:
        if tpl is not None:
            ptoks = [prompt_tokens(engine, render_prompt(tpl, p)) for p in PROMPTS[:cfg.prompts]]
        elif chat.template is not None:     # the rules' template wins; else the GGUF's own
            ptoks = [engine.tokenize(chat.prompt(p)) for p in PROMPTS[:cfg.prompts]]
        else:                               # no chat template in the GGUF: the questions as plain text
            ptoks = [engine.tokenize(f"Question: {p}\nAnswer:") for p in PROMPTS[:cfg.prompts]]
        jobs = [(p, Sampling(cfg.max_new, cfg.temperature, cfg.top_k, seed))
                for p in ptoks for seed in range(cfg.seeds)]
        generate(engine, jobs[0][0], Sampling(1, cfg.temperature, cfg.top_k, 0))   # warm the weights' pages
        best = {"one": float("inf"), "batched": float("inf")}
        out = {}
        for rep in range(cfg.repeats):
            for side in (("one", "batched") if rep % 2 == 0 else ("batched", "one")):
                t = time.perf_counter()
                if side == "one":
                    gens = [generate(engine, p, c, shaper_for(compiled) if compiled is not None else None,
                                     stop_ids=stop) for p, c in jobs]
                else:
                    gens = generate_batched(engine, [p for p, _ in jobs], [c for _, c in jobs], stop_ids=stop,
                                            slots=cfg.slots, shapers=shapers)
                best[side] = min(best[side], time.perf_counter() - t)
                out[side] = gens
                tick()
    n_one = int(sum(g.tokens.size for g in out["one"]))
    n_bat = int(sum(g.tokens.size for g in out["batched"]))
    same = sum(np.array_equal(a.tokens, b.tokens) for a, b in zip(out["one"], out["batched"]))
    tps_one, tps_bat = n_one / best["one"], n_bat / best["batched"]
    return GenerateBenchResult(cfg, len(jobs), n_bat, n_one, best["one"], best["batched"], tps_one, tps_bat,
                               tps_bat / tps_one, int(same), len(os.sched_getaffinity(0)))


def render_generate_bench(r: GenerateBenchResult) -> str:
    c = r.config
    return "\n".join([
        f"bench generate: {Path(c.model).name}, {r.replies} replies ({c.prompts} prompts x {c.seeds} seeds), "
        f"max_new {c.max_new}, T {c.temperature}, top-k {c.top_k}{', rules live' if c.rules else ''}; "
        f"{r.cpus} cpus, best of {c.repeats}",
        f"  one at a time (baseline)  {r.tokens_one_at_a_time:6} tokens  {r.one_at_a_time_s:8.2f} s  "
        f"{r.one_at_a_time_tps:7.2f} tok/s",
        f"  batched, {c.slots} slots        {r.tokens:6} tokens  {r.batched_s:8.2f} s  {r.batched_tps:7.2f} tok/s",
        f"  ratio (batched / one at a time, tokens/s): {r.ratio:.2f}x; replies token for token the same: "
        f"{r.identical_replies}/{r.replies}" + (" (expected all up to 3 slots)" if c.slots <= 3 else ""),
    ])
