"""`exactedit bench generate`: batched sampling (native/llamacpp/batched.py) against the one-at-a-time
loop (native/llamacpp/generate.py), both through generation's door (native/llamacpp/sample.py,
`sequential` picking the one-at-a-time loop), the same replies of a real model, in the same run; or, with
`against="plain"`, batched sampling with the shaping rules live against the same batched sampling
without them (what the rules cost).

Both sides answer the same (prompt, seed) jobs with the same llama.cpp sampler chain (top-k,
temperature, seeded `dist`) and the same cap; the one-at-a-time loop is the baseline, so the
result is a ratio of generated tokens per second measured minutes apart on the same machine,
the order alternating over `repeats` (best of each kept). With `rules` (compiled shaping rules,
`exactedit shape compile`) both sides run them live, as `shape rates` does. The prompts are the
bench's own, in the model's chat template (the rules' one with `rules`; plain "Question: ...
Answer:" text when the GGUF has none). The bench also
reports how many replies came out token for token the same: all of them up to 3 slots (ggml's
one-row kernels), fewer beyond (its batched kernels round differently; native/llamacpp/batched.py).

`against="plain"`: both sides are the batched loop with the same jobs, slots, stop tokens (the
rules' turn end) and prompts (the rules' template); the baseline's chain has no samplers of ours
in front, the other side's has the rules' (`shape`, `probe`), so the ratio is the whole live cost
of the rules: the shaper's trigger state and phrase matching, and the copies of each step's
logits. `phrases=N` compiles N banned phrases drawn (seeded) from the model's own word tokens
(bench/shape_compile.py's `draw_phrases`) in the run, instead of a `rules` file. Besides the best
of each side it keeps every repeat's time and the median of the ratios within each repeat: on a
shared machine one run of the same work varies by more than the 5% asked of the rules.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit.native.llamacpp.engine import EngineError
from exactedit.native.llamacpp.sample import DEFAULT_SLOTS

Progress = Callable[[int, int], None]

PROMPTS = ("How do I read a CSV file in Python?", "Explain what a hash map is in two sentences.",
           "Write a short poem about the sea.", "How can I reverse a string in JavaScript?",
           "What is the difference between a list and a tuple?", "Give me three tips for writing clear emails.",
           "How do I find the largest file in a directory on Linux?", "What does a compiler do?",
           "Summarize the plot of a detective story in one paragraph.", "How do I sort a dictionary by value?",
           "Name three uses of a binary search tree.", "How can I measure how long a function takes to run?")
AGAINST = ("one-at-a-time", "plain")    # the baseline: the one-at-a-time loop, or batched without the rules
TARGET_COST = 0.05                      # the rules may cost at most 5% of batched tokens/s


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
    rules: str | None = None    # compiled shaping rules (JSON), run live on both sides (one-at-a-time)
    against: str = "one-at-a-time"
    phrases: int = 0            # > 0: compile this many drawn phrases in the run (instead of `rules`)
    phrase_seed: int = 0        # which of the model's words make them

    def __post_init__(self):
        for key in ("prompts", "seeds", "max_new", "slots", "repeats", "top_k"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise EngineError("bench generate", key, f"expected a positive integer, got {v!r}")
        if not 1 <= self.prompts <= len(PROMPTS):
            raise EngineError("bench generate", "prompts", f"expected 1..{len(PROMPTS)} (the bench's own prompts)")
        if self.against not in AGAINST:
            raise EngineError("bench generate", "against", f"expected one of {', '.join(AGAINST)}, got {self.against!r}")
        if not isinstance(self.phrases, int) or isinstance(self.phrases, bool) or self.phrases < 0:
            raise EngineError("bench generate", "phrases", f"expected an integer >= 0, got {self.phrases!r}")
        if self.phrases and self.rules is not None:
            raise EngineError("bench generate", "phrases", "give compiled rules or a number of phrases, not both")
        if self.against == "plain" and self.rules is None and not self.phrases:
            raise EngineError("bench generate", "against", "plain (the rules' cost) needs rules or phrases")


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


@dataclass(frozen=True)
class RulesCostResult:
    """`against="plain"`: batched with the rules live against batched without them."""

    config: GenerateBenchConfig
    replies: int
    phrases: int                # banned phrases of the rules' prefix penalty (0: none)
    pieces: int                 # token pieces their matches can use
    rules: tuple[str, ...]      # the rules' kinds, in order
    compile_s: float            # shape compile of the drawn phrases (0 with a rules file)
    tokens_plain: int
    tokens_rules: int
    plain_s: float
    rules_s: float
    plain_tps: float
    rules_tps: float
    ratio: float                # rules tokens/s over plain tokens/s
    cost: float                 # 1 - ratio
    target_cost: float
    meets_target: bool          # cost <= target_cost
    fired_steps: int            # steps where any rule changed the logits
    fired_replies: int
    identical_replies: int      # replies token for token the same on both sides
    cpus: int
    plain_runs_s: tuple[float, ...]   # every repeat's time, in order (their spread: the machine's noise)
    rules_runs_s: tuple[float, ...]
    paired_ratio: float               # the median over repeats of the ratio within each repeat (robust to drift)

    def to_dict(self) -> dict:
        return {"bench": "generate", **asdict(self)}


def _drawn_rules(cfg: GenerateBenchConfig, workdir: Path) -> tuple[str, float]:
    """Compile cfg.phrases phrases of the model's own words into workdir; (rules path, seconds)."""
    from exactedit.bench.shape_compile import draw_phrases
    from exactedit.native.shaping.compile import compile_file
    from exactedit.quant import gguf
    from exactedit.solvers.shaping.rules_file import matcher_bytes
    from exactedit.solvers.tail.model import load_tokens

    table = load_tokens(gguf.open(cfg.model))
    text_bytes = matcher_bytes([table.token_bytes(i) for i in range(len(table))], table.types or (0,) * len(table))
    phrases = draw_phrases(text_bytes, cfg.phrases, cfg.phrase_seed)
    out = workdir / "rules.json"
    t = time.perf_counter()
    compile_file(None, cfg.model, out, phrases=phrases)
    return str(out), time.perf_counter() - t


def run_generate_bench(cfg: GenerateBenchConfig, progress: Progress | None = None):
    """A GenerateBenchResult (against the one-at-a-time loop) or a RulesCostResult (against plain)."""
    if not cfg.phrases:
        return _run(cfg, cfg.rules, 0.0, progress)
    with tempfile.TemporaryDirectory(prefix="exactedit-bench-") as d:
        rules, compile_s = _drawn_rules(cfg, Path(d))
        return _run(cfg, rules, compile_s, progress)


def _run(cfg: GenerateBenchConfig, rules_path, compile_s: float, progress: Progress | None):
    from exactedit.native.llamacpp.chat import model_chat
    from exactedit.native.llamacpp.engine import LlamaEngine
    from exactedit.native.llamacpp.generate import Sampling
    from exactedit.native.llamacpp.sample import sample_replies
    from exactedit.native.llamacpp.chat import prompt_tokens, render_prompt
    from exactedit.native.shaping.live import open_rules, shaper_for

    path = Path(cfg.model)
    compiled = tpl = None
    if rules_path is not None:
        compiled, tpl = open_rules(path, rules_path)
    chat = model_chat(path) if tpl is None else None
    stop = tuple(compiled.vocab.turn_end) if compiled is not None else None
    shapers = (lambda: shaper_for(compiled)) if compiled is not None else None
    plain = cfg.against == "plain"
    names = ("plain", "rules") if plain else ("one", "batched")
    total, done = 2 * cfg.repeats, [0]

    def tick():
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    def one_side(engine, side, jobs):
        # "one": the one-at-a-time loop (one shaper, reset per reply); else the batched loop, the
        # rules' samplers in each chain or (the plain baseline) none
        return sample_replies(engine, jobs, stop_ids=stop, slots=cfg.slots, sequential=side == "one",
                              shapers=None if side == "plain" else shapers)

    with LlamaEngine(path) as engine:
        if tpl is not None:
            ptoks = [prompt_tokens(engine, render_prompt(tpl, p)) for p in PROMPTS[:cfg.prompts]]
        elif chat.template is not None:     # the rules' template wins; else the GGUF's own
            ptoks = [engine.tokenize(chat.prompt(p)) for p in PROMPTS[:cfg.prompts]]
        else:                               # no chat template in the GGUF: the questions as plain text
            ptoks = [engine.tokenize(f"Question: {p}\nAnswer:") for p in PROMPTS[:cfg.prompts]]
        jobs = [(p, Sampling(cfg.max_new, cfg.temperature, cfg.top_k, seed))
                for p in ptoks for seed in range(cfg.seeds)]
        sample_replies(engine, [(jobs[0][0], Sampling(1, cfg.temperature, cfg.top_k, 0))],
                       sequential=True)                                           # warm the weights' pages
        runs: dict[str, list[float]] = {side: [] for side in names}
        out = {}
        for rep in range(cfg.repeats):
            for side in (names if rep % 2 == 0 else names[::-1]):
                t = time.perf_counter()
                gens = one_side(engine, side, jobs)
                runs[side].append(time.perf_counter() - t)
                out[side] = gens
                tick()
    best = {side: min(ts) for side, ts in runs.items()}
    a, b = (out[side] for side in names)
    n_a, n_b = (int(sum(g.tokens.size for g in gens)) for gens in (a, b))
    same = int(sum(np.array_equal(x.tokens, y.tokens) for x, y in zip(a, b)))
    tps_a, tps_b = n_a / best[names[0]], n_b / best[names[1]]
    cpus = len(os.sched_getaffinity(0))
    if not plain:
        return GenerateBenchResult(cfg, len(jobs), n_b, n_a, best["one"], best["batched"], tps_a, tps_b,
                                   tps_b / tps_a, same, cpus)
    penalty = compiled.rule("prefix-penalty")
    fired = [g.fired.any(axis=1) for g in b]
    ratio = tps_b / tps_a
    return RulesCostResult(cfg, len(jobs), len(penalty.phrases) if penalty is not None else 0,
                           len(getattr(penalty, "pieces", ())), tuple(r.name for r in compiled.rules), compile_s,
                           n_a, n_b, best["plain"], best["rules"], tps_a, tps_b, ratio, 1.0 - ratio, TARGET_COST,
                           1.0 - ratio <= TARGET_COST, int(sum(int(f.sum()) for f in fired)),
                           int(sum(bool(f.any()) for f in fired)), same, cpus, tuple(runs["plain"]),
                           tuple(runs["rules"]), float(np.median([(n_b / r) / (n_a / p)
                                                                  for p, r in zip(runs["plain"], runs["rules"])])))


def render_generate_bench(r) -> str:
    c = r.config
    if isinstance(r, RulesCostResult):
        return _render_cost(r)
    return "\n".join([
        f"bench generate: {Path(c.model).name}, {r.replies} replies ({c.prompts} prompts x {c.seeds} seeds), "
        f"max_new {c.max_new}, T {c.temperature}, top-k {c.top_k}{', rules live' if c.rules or c.phrases else ''}; "
        f"{r.cpus} cpus, best of {c.repeats}",
        f"  one at a time (baseline)  {r.tokens_one_at_a_time:6} tokens  {r.one_at_a_time_s:8.2f} s  "
        f"{r.one_at_a_time_tps:7.2f} tok/s",
        f"  batched, {c.slots} slots        {r.tokens:6} tokens  {r.batched_s:8.2f} s  {r.batched_tps:7.2f} tok/s",
        f"  ratio (batched / one at a time, tokens/s): {r.ratio:.2f}x; replies token for token the same: "
        f"{r.identical_replies}/{r.replies}" + (" (expected all up to 3 slots)" if c.slots <= 3 else ""),
    ])


def _render_cost(r: RulesCostResult) -> str:
    c = r.config
    source = (f"{r.phrases} drawn phrases compiled in {r.compile_s:.1f} s" if c.phrases
              else f"{Path(c.rules).name}: {r.phrases} phrases")
    mark = "ok" if r.meets_target else "ABOVE"
    return "\n".join([
        f"bench generate --against plain: {Path(c.model).name}, {r.replies} replies ({c.prompts} prompts x "
        f"{c.seeds} seeds), max_new {c.max_new}, T {c.temperature}, top-k {c.top_k}, {c.slots} slots; "
        f"{r.cpus} cpus, best of {c.repeats}",
        f"  rules: {', '.join(r.rules)} ({source}, {r.pieces} token pieces)",
        f"  batched, no rules (baseline)  {r.tokens_plain:6} tokens  {r.plain_s:8.2f} s  {r.plain_tps:7.2f} tok/s"
        f"{_spread(r.plain_runs_s)}",
        f"  batched, rules live           {r.tokens_rules:6} tokens  {r.rules_s:8.2f} s  {r.rules_tps:7.2f} tok/s"
        f"{_spread(r.rules_runs_s)}",
        f"  ratio (rules / no rules, tokens/s): {r.ratio:.3f}; cost {100 * r.cost:.1f}% "
        f"(target <= {100 * r.target_cost:g}%: {mark})",
        f"  the rules fired at {r.fired_steps} steps of {r.fired_replies} replies; replies token for token the "
        f"same: {r.identical_replies}/{r.replies}",
        f"  within each repeat (median of {len(r.plain_runs_s)}): ratio {r.paired_ratio:.3f}, cost "
        f"{100 * (1 - r.paired_ratio):.1f}%",
    ])


def _spread(runs) -> str:
    return f"  (runs {min(runs):.2f}..{max(runs):.2f} s)" if len(runs) > 1 else ""
