"""`exactedit verify shaping`: the rules the sampler ran are the rules scored offline, bitwise.

For each prompt (rendered with the chat template the rules were compiled with) and seed, llama.cpp
generates with the compiled rules live (native/llamacpp/sample.py's door, `record`: the one-at-a-time
loop of native/llamacpp/generate.py) and records, per step, the raw
logits llama.cpp handed the sampler chain, the engine's own logits row, and the logits the chain
received after the rules. Then, offline, from the finished token sequence alone:
- the trigger state is recomputed over the whole sequence (`solvers.shaping.triggers.trigger_state`) and
  `solvers.shaping.rules.shape_logits` shapes the raw logits of every sampled row;
- each rule's `trigger_mask` is read at those rows.
The check passes when, at every step, the received logits equal the offline shaping bit for bit,
each rule fired exactly where its offline mask says, the raw logits are the engine's row
(llama_get_logits_ith), and the sampled token lies in the top-k of the received logits.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from exactedit.native.llamacpp.engine import EngineSettings, LlamaEngine
from exactedit.native.llamacpp.generate import Sampling
from exactedit.native.llamacpp.sample import sample_replies
from exactedit.native.llamacpp.chat import prompt_tokens, render_prompt
from exactedit.native.shaping.live import offline_rules, open_rules, shaper_for


@dataclass(frozen=True)
class StepCheck:
    """One generation (prompt, seed): steps, per-rule firings, and what matched."""

    prompt: int
    seed: int
    steps: int
    truncated: bool
    fired: dict[str, int]
    logits_bitwise: bool
    masks_equal: bool
    raw_is_engine: bool
    sampled_in_top_k: bool
    bad_steps: tuple[int, ...] = ()
    max_abs_diff: float = 0.0
    text: str = ""

    @property
    def passed(self) -> bool:
        return self.logits_bitwise and self.masks_equal and self.raw_is_engine and self.sampled_in_top_k


@dataclass(frozen=True)
class ShapingVerify:
    model: str
    model_sha256: str
    rules: str
    config: dict
    checks: tuple[StepCheck, ...]
    rule_names: tuple[str, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def to_dict(self) -> dict:
        fired = {n: sum(c.fired[n] for c in self.checks) for n in self.rule_names}
        return {"passed": self.passed, "model": self.model, "model_sha256": self.model_sha256, "rules": self.rules,
                "config": self.config, "steps": sum(c.steps for c in self.checks), "fired": fired,
                "checks": [{**asdict(c), "passed": c.passed} for c in self.checks]}


def check_generation(gen, compiled, persona: bool, top_k: int) -> dict:
    """The offline side of the check for one recorded `Generation`."""
    from exactedit.solvers.shaping.rules import shape_logits, trigger_mask, trigger_state

    seq = gen.sequence
    rows = np.arange(gen.prompt.size - 1, gen.prompt.size - 1 + gen.tokens.size)
    doc = np.zeros(seq.size, np.int32)
    state = trigger_state(seq, [0], compiled.vocab)
    rules = offline_rules(compiled, persona)
    offline = shape_logits(rules, gen.raw, rows, seq, doc, state, dtype=None)
    same = np.all(offline.view(np.uint32) == gen.received.view(np.uint32), axis=1)
    masks = np.stack([trigger_mask(r, seq, doc, state)[rows] for r in rules], axis=1) if rules else gen.fired
    mask_rows = np.all(masks == gen.fired, axis=1)
    raw_rows = np.all(gen.raw.view(np.uint32) == gen.engine_rows.view(np.uint32), axis=1)
    kth = -np.sort(-gen.received, axis=1)[:, min(top_k, gen.received.shape[1]) - 1]
    in_top = gen.received[np.arange(gen.tokens.size), gen.tokens] >= kth
    bad = np.flatnonzero(~(same & mask_rows & raw_rows & in_top))
    diff = np.abs(offline.astype(np.float64) - gen.received.astype(np.float64))
    return {"logits_bitwise": bool(same.all()), "masks_equal": bool(mask_rows.all()), "raw_is_engine": bool(raw_rows.all()),
            "sampled_in_top_k": bool(in_top.all()), "bad_steps": tuple(int(b) for b in bad),
            "max_abs_diff": float(np.nan_to_num(diff, nan=np.inf).max()) if diff.size else 0.0}


def verify_shaping(model, rules_path, prompts: Sequence[str], *, config: Sampling | None = None,
                   seeds: Sequence[int] = (0,), settings: EngineSettings | None = None, persona: bool | None = None,
                   live=None, progress: Callable[[int, int], None] | None = None) -> ShapingVerify:
    """Generate with the compiled rules live and check every step against the offline shaping.
    `live`: other compiled rules to run in the engine instead (tests: a changed rule must fail)."""
    from exactedit.quant import gguf

    cfg = config or Sampling()
    g = gguf.open(model)
    compiled, tpl = open_rules(model, rules_path, g)
    act = compiled.persona if persona is None else persona
    shaper = shaper_for(live or compiled, persona=act)
    names = tuple(r.name for r in compiled.rules)
    checks, total = [], len(prompts) * len(seeds)
    with LlamaEngine(model, settings) as engine:
        for i, p in enumerate(prompts):
            ptoks = prompt_tokens(engine, render_prompt(tpl, p))
            for seed in seeds:
                c = Sampling(cfg.max_new, cfg.temperature, cfg.top_k, int(seed))
                gen, = sample_replies(engine, [(ptoks, c)], processor=shaper, record=True)
                res = check_generation(gen, compiled, act, cfg.top_k)
                text = b"".join(engine.piece(int(t)) for t in gen.tokens).decode("utf-8", "replace")
                fired = {n: int(gen.fired[:, j].sum()) for j, n in enumerate(names)}
                checks.append(StepCheck(i, int(seed), int(gen.tokens.size), gen.truncated, fired, text=text, **res))
                if progress is not None:
                    progress(len(checks), total)
    return ShapingVerify(str(model), compiled.model["sha256"], str(rules_path),
                         {**asdict(cfg), "seeds": list(seeds), "persona": act}, tuple(checks), names)


def render_shaping_verify(r: ShapingVerify) -> str:
    d = r.to_dict()
    out = [f"verify shaping: {'PASS' if r.passed else 'FAIL'}  ({d['steps']} steps, {len(r.checks)} generations; "
           f"model {r.model_sha256[:12]}, rules {r.rules})",
           "fired: " + ", ".join(f"{n} {k}" for n, k in d["fired"].items())]
    for c in r.checks:
        flags = [name for name, ok in (("logits", c.logits_bitwise), ("trigger masks", c.masks_equal),
                                       ("raw = engine row", c.raw_is_engine), ("sampled in top-k", c.sampled_in_top_k))
                 if not ok]
        verdict = "ok" if c.passed else "DIFFERS: " + ", ".join(flags) + f" at steps {list(c.bad_steps[:8])}"
        out.append(f"  prompt {c.prompt} seed {c.seed}: {c.steps} steps{' (cut)' if c.truncated else ''}, fired "
                   + ", ".join(f"{n} {k}" for n, k in c.fired.items()) + f"; {verdict}"
                   + (f" (max |diff| {c.max_abs_diff:.3g})" if not c.logits_bitwise else ""))
    return "\n".join(out)
