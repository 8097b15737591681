"""The run's `rates` stage: four arms (base, rules, weights, both) answer the held-out rate prompts
with the same seeds and sampler chain (native/shaping/rates.py, `shape rates`), and what the
report reads from them: per arm against base the phrase rates with bootstrap intervals over
prompts, each reply's text (DIR/replies.json, the records `exactedit discover` reads), the
replies that ended at the turn end, and the variant artefacts of the phrases (a case or spacing
variant of a banned word after its prefix). With `rules_mode` "rewind" the arms with rules also roll
back the rules' phrases and their variants (native/llamacpp/rewind.py); each of their replies
records its rewinds."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from exactedit.files import atomic_write_text
from exactedit.files import write_png

ARM_LABELS = {"base": "base", "rules": "rules only", "weights": "edited weights", "both": "weights + rules"}

__all__ = ["ARM_LABELS", "arms_png", "rate_arms"]


def rate_arms(model, rules, edited, prompts: Sequence[str], phrases: Sequence[str], seeds: Sequence[int], *,
              max_new: int, n_boot: int, out, progress: Callable[[int, int], None] | None = None,
              rules_mode: str = "penalty", settings=None) -> dict:
    """Generate the four arms, write out/rates.json, out/replies.json, out/phrase-rates.png (base
    against the edited weights) and out/arms.png (every arm's continuation at each phrase's prefix);
    return the record the report reads. `settings`: the engine's (native.llamacpp.EngineSettings; None: the
    default)."""
    from exactedit.evals.rates.artefacts import variant_artefacts
    from exactedit.evals.rates.report import plot_phrase_rates
    from exactedit.native.llamacpp.chat import reply_name
    from exactedit.native.llamacpp.generate import Sampling
    from exactedit.native.shaping.live import open_rules
    from exactedit.native.shaping.rates import shape_rates
    from exactedit.solvers.tail.model import load_tokens
    from exactedit.quant import gguf

    out = Path(out)
    sr = shape_rates(model, rules, prompts, phrases, edited=edited, config=Sampling(max_new=max_new), seeds=seeds,
                     n_boot=n_boot, progress=progress, rules_mode=rules_mode, settings=settings)
    g = gguf.open(model)
    compiled, _ = open_rules(model, rules, g)
    turn_end = tuple(compiled.vocab.turn_end)
    table = load_tokens(g)
    records, texts = [], {}
    for arm, run in sr.arms.items():
        texts[arm] = []
        for k, (x, stop) in enumerate(zip(run.replies, run.stops, strict=True)):
            body = [int(t) for t in x.tokens if int(t) not in turn_end]
            text = table.decode(body)
            texts[arm].append(text)
            records.append({"side": arm, "name": reply_name(prompts[x.prompt], x.seed), "prompt": prompts[x.prompt],
                            "seed": int(x.seed), "tokens": int(x.tokens.size), "stop": stop,
                            "text": text})
            if run.rewinds is not None:
                records[-1]["rewinds"] = run.rewinds["per_reply"][k]
    atomic_write_text(out / "replies.json", json.dumps(records, indent=1, ensure_ascii=False) + "\n")
    obj = sr.to_dict()
    atomic_write_text(out / "rates.json", json.dumps(obj, indent=1, default=str) + "\n")
    plot_phrase_rates(sr.vs_base["weights"], out / "phrase-rates.png",
                      title=f"{Path(str(model)).name}: held-out prompts, base vs edited weights")
    vs = {a: r.to_dict() for a, r in sr.vs_base.items()}
    arms_png(vs, out / "arms.png", title=f"{Path(str(model)).name}: held-out prompts")
    return {"vs_base": vs, "arms": {a: run.to_dict() for a, run in sr.arms.items()}, "config": sr.config,
            "prompts": len(prompts), "seeds": list(seeds),
            "turn_ends": {a: sum(r["stop"] == "turn_end" for r in records if r["side"] == a) for a in sr.arms},
            "replies": {a: len(run.replies) for a, run in sr.arms.items()},
            "artefacts": {a: [vars(x) for x in variant_artefacts(texts[a], phrases)] for a in sr.arms}}


def arms_png(vs_base: dict, path, title: str = "") -> Path:
    """PNG: per phrase, the continuation rate at its prefix in each arm, with the bootstrap
    interval over prompts (base's from any comparison: all share base's replies)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure


    arms = ["base"] + [a for a in ("rules", "weights", "both") if a in vs_base]
    first = next(iter(vs_base.values()))["phrase_rates"]
    phrases = [p["phrase"] for p in first]
    fig = Figure(figsize=(max(5.0, 1.4 * len(phrases) + 2), 4.2), dpi=110)
    ax = fig.add_subplot()
    width = 0.8 / len(arms)
    for k, arm in enumerate(arms):
        src = first if arm == "base" else vs_base[arm]["phrase_rates"]
        side = [p["base"] if arm == "base" else p["edited"] for p in src]
        ys = [s["continuation"] if s["continuation"] is not None else 0.0 for s in side]
        cis = [[y if v is None else v for v in (s["ci"].get("continuation") or (y, y))] for y, s in zip(ys, side)]
        lo = [max(y - c[0], 0.0) for y, c in zip(ys, cis)]
        hi = [max(c[1] - y, 0.0) for y, c in zip(ys, cis)]
        xs = [i + (k - (len(arms) - 1) / 2) * width for i in range(len(phrases))]
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=ARM_LABELS[arm])
    ax.set_xticks(range(len(phrases)), [repr(p) for p in phrases], rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("continuation at the prefix")
    ax.set_ylim(0, 1.05)
    ax.set_title(title or "phrase continuation per arm", fontsize=9)
    ax.legend(fontsize=7)
    return write_png(fig, path)
