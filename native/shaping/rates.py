"""`exactedit shape rates`: weights only, rules only, both, against the base, in free generation.

Four arms answer the same prompts with the same seeds and the same sampler chain
(native/llamacpp/sample.py's door, batched): `base` (the model), `rules` (the model with the compiled rules live),
and with an edited GGUF `weights` (the edited model) and `both` (the edited model with the
rules). The phrase rates of each arm against `base` come from evals/rates/phrase_rates.py (replies with
the phrase, per 1,000 tokens, continuation at its prefix, bootstrap intervals over prompts). For
the arms with rules, the KL of the shaped against the unshaped distribution (temperature 1, full
vocabulary, each step of the arm's own generation) is reported at each rule's trigger steps and
over whole replies (the mean over every step, the steps where no rule fired counting 0), as
SPEC.md section 6 asks of a rule scored like an edit. With `rules_mode` "rewind" the arms with rules
also roll back the rules' phrases and their variants (native/llamacpp/rewind.py); each such arm
reports its rewinds (per phrase, the rollbacks made and the phrases kept past the bounds, and the
rollbacks of each reply).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from exactedit.native.llamacpp.engine import EngineError, EngineSettings, LlamaEngine
from exactedit.native.llamacpp.generate import Sampling
from exactedit.native.llamacpp.sample import DEFAULT_SLOTS, sample_replies
from exactedit.native.llamacpp.chat import prompt_tokens, render_prompt
from exactedit.native.llamacpp.rewind import summarize_rewinds
from exactedit.native.shaping.live import open_rules, rewind_for, same_tokenizer, shaper_for

ARMS = ("base", "rules", "weights", "both")


@dataclass(frozen=True)
class ArmRun:
    """One arm's replies (evals.rates.phrase_rates.Reply), why each stopped (the `Generation`'s
    stop: "turn_end" or "max_new"), and with rules its KL and firing counts."""

    name: str
    model: str
    replies: tuple
    stops: tuple = ()
    kl: dict = field(default_factory=dict)
    fired: dict = field(default_factory=dict)
    rewinds: dict | None = None        # rewind mode, arms with rules: rewind.summarize_rewinds + per reply

    def to_dict(self) -> dict:
        out = {"model": self.model, "replies": len(self.replies),
               "tokens": int(sum(r.tokens.size for r in self.replies)),
               "truncated": int(sum(r.truncated for r in self.replies)), "kl": self.kl, "fired": self.fired}
        if self.rewinds is not None:
            out["rewinds"] = self.rewinds
        return out


@dataclass(frozen=True)
class ShapeRates:
    arms: dict                 # name -> ArmRun
    vs_base: dict              # arm -> evals.rates.phrase_rates.PhraseRates (base vs that arm)
    config: dict
    info: dict

    def to_dict(self) -> dict:
        return {"arms": {k: a.to_dict() for k, a in self.arms.items()},
                "vs_base": {k: r.to_dict() for k, r in self.vs_base.items()}, "config": self.config, **self.info}


def kl_summary(names: Sequence[str], fired: np.ndarray, kl: np.ndarray, kl_rules: np.ndarray) -> dict:
    """KL(unshaped || shaped) at each rule's trigger steps (that rule applied alone: rules firing
    at one row are told apart), at any trigger and over all steps (all rules together)."""
    out = {}
    scopes = {f"triggers {n}": (fired[:, j], kl_rules[:, j]) for j, n in enumerate(names)}
    scopes["triggers any"] = (fired.any(axis=1) if fired.size else np.zeros(kl.size, bool), kl)
    scopes["replies"] = (np.ones(kl.size, bool), kl)
    for key, (m, vals) in scopes.items():
        v = vals[m]
        out[key] = {"steps": int(m.sum()), "mean": float(v.mean()) if v.size else None,
                    "median": float(np.median(v)) if v.size else None, "max": float(v.max()) if v.size else None}
    return out


def _run_arm(name, path, ptoks, seeds, cfg, compiled, settings, slots, progress, rewind=None) -> ArmRun:
    from exactedit.evals.rates.phrase_rates import Reply

    shapers = (lambda: shaper_for(compiled)) if name in ("rules", "both") else None
    rewind = rewind if shapers is not None else None
    jobs = [(i, int(seed)) for i in range(len(ptoks)) for seed in seeds]
    turn_end = tuple(compiled.vocab.turn_end)
    with LlamaEngine(path, settings) as engine:
        gens = sample_replies(engine, [(ptoks[i], Sampling(cfg.max_new, cfg.temperature, cfg.top_k, seed))
                                       for i, seed in jobs],
                              stop_ids=turn_end, turn_end=turn_end, slots=slots, shapers=shapers,
                              progress=None if progress is None else lambda *_: progress(), rewind=rewind)
    replies = tuple(Reply(i, g.seed, g.prompt, g.tokens, g.truncated) for g, (i, _) in zip(gens, jobs))
    stops = tuple(g.stop for g in gens)
    if shapers is None:
        return ArmRun(name, str(path), replies, stops)
    names = [r.name for r in compiled.rules]
    fired_all = np.concatenate([g.fired for g in gens])
    kl_all = np.concatenate([g.kl for g in gens])
    kl_alone = np.concatenate([g.kl_rules for g in gens])
    rewinds = None if rewind is None else {**summarize_rewinds([g.rewinds for g in gens]),
                                           "per_reply": [[e._asdict() for e in g.rewinds] for g in gens]}
    return ArmRun(name, str(path), replies, stops, kl_summary(names, fired_all, kl_all, kl_alone),
                  {n: int(fired_all[:, j].sum()) for j, n in enumerate(names)}, rewinds)


def shape_rates(model, rules_path, prompts: Sequence[str], phrases: Sequence[str] | None = None, *, edited=None,
                config: Sampling | None = None, seeds: Sequence[int] = (0,),
                settings: EngineSettings | None = None, n_boot: int = 1000, level: float = 0.95,
                slots: int = DEFAULT_SLOTS, progress: Callable[[int, int], None] | None = None,
                rules_mode: str = "penalty") -> ShapeRates:
    """Generate every arm and compare each with `base`. `phrases`: the rates' phrases (default:
    the compiled prefix penalty's). Every arm decodes `slots` replies at a time through the same
    loop (native/llamacpp/sample.py's door, batched; 1: one at a time, token for token the loop of
    `exactedit generate`). `rules_mode` "rewind": the arms with rules roll back the rules' phrases
    and their variants too (native/shaping/live.py `rewind_for`)."""
    from exactedit.evals.rates.phrase_rates import phrase_rates
    from exactedit.quant import gguf
    from exactedit.solvers.phrases import PhraseMatcher, TokenBytes, parse_phrases
    from exactedit.solvers.tail.model import load_tokens

    cfg = config or Sampling()
    if not prompts:
        raise EngineError(model, "prompts", "no prompts")
    g = gguf.open(model)
    compiled, tpl = open_rules(model, rules_path, g)
    rewind = rewind_for(compiled, rules_mode, rules_path)
    if edited is not None:
        same_tokenizer(g, gguf.open(edited), edited)
    pen = compiled.rule("prefix-penalty")
    if phrases is None:
        if pen is None:
            raise EngineError(rules_path, "phrases", "the rules have no prefix penalty; give the phrases to rate")
        phrases = [p.text for p in pen.phrases]
    phrases = parse_phrases(list(phrases), "phrases")
    with LlamaEngine(model, settings) as engine:
        ptoks = [prompt_tokens(engine, render_prompt(tpl, p)) for p in prompts]
    arms = ARMS if edited is not None else ARMS[:2]
    total, done = len(arms) * len(prompts) * len(seeds), [0]

    def tick():
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    runs = {a: _run_arm(a, edited if a in ("weights", "both") else model, ptoks, seeds, cfg, compiled, settings,
                        slots, tick, rewind) for a in arms}
    matcher = PhraseMatcher(phrases, TokenBytes(load_tokens(g)))
    vs = {a: phrase_rates(matcher, list(runs["base"].replies), list(runs[a].replies), n_boot=n_boot, level=level,
                          seed=int(seeds[0]) if seeds else 0) for a in arms if a != "base"}
    info = {"model": str(model), "model_sha256": compiled.model["sha256"], "edited": str(edited or ""),
            "rules": str(rules_path), "phrases": list(phrases), "prompts": len(prompts)}
    conf = {"max_new": cfg.max_new, "temperature": cfg.temperature, "top_k": cfg.top_k, "seeds": list(seeds),
            "slots": slots}
    if rules_mode != "penalty":
        conf["rules_mode"] = rules_mode
    return ShapeRates(runs, vs, conf, info)


def render_shape_rates(r: ShapeRates) -> str:
    """Per phrase and arm: replies with it, per 1k tokens, continuation at the prefix; then KL."""
    def f(x, spec="{:.2f}"):
        return "n/a" if x is None or not np.isfinite(x) else spec.format(x)

    arms = [a for a in ARMS if a in r.arms]
    head = ["phrase", *[f"{a}: with / per1k / cont" for a in arms]]
    rows = []
    first = next(iter(r.vs_base.values()))
    for pi, p in enumerate(first.phrases):
        cells = [p.phrase, f"{p.base.replies_with}/{p.base.replies} / {f(p.base.per_1k_tokens)} / {f(p.base.continuation)}"]
        for a in arms[1:]:
            e = r.vs_base[a].phrases[pi].edited
            cells.append(f"{e.replies_with}/{e.replies} / {f(e.per_1k_tokens)} / {f(e.continuation)}")
        rows.append(cells)
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    out = [f"shape rates: {r.info['prompts']} prompts x seeds {r.config['seeds']}, max_new {r.config['max_new']}, "
           f"T {r.config['temperature']}, top-k {r.config['top_k']}; tokens "
           + ", ".join(f"{a} {r.arms[a].to_dict()['tokens']}" for a in arms),
           "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    for a in arms:
        if r.arms[a].kl:
            out.append(f"KL(unshaped || shaped), arm {a} (fired: "
                       + ", ".join(f"{n} {k}" for n, k in r.arms[a].fired.items()) + "):")
            out += [f"  {k:28} steps {v['steps']:5}  mean {f(v['mean'], '{:.4g}')}  median {f(v['median'], '{:.4g}')}"
                    f"  max {f(v['max'], '{:.4g}')}" for k, v in r.arms[a].kl.items()]
        rw = r.arms[a].rewinds
        if rw is not None:
            out.append(f"rewinds, arm {a}: {rw['rewinds']} in {rw['replies_rewound']} replies"
                       + "".join(f", {p!r} x{n}" for p, n in rw["phrases"].items())
                       + (f"; kept past the bounds: {rw['kept']}" if rw["kept"] else ""))
    return "\n".join(out)
