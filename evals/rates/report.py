"""Phrase rates as a text table and a PNG (before / after bars per phrase, with their intervals)."""
from __future__ import annotations

import math
from pathlib import Path

from exactedit.evals.rates.phrase_rates import PhraseRates, SideRates
from exactedit.files import write_png


def _f(x: float, spec: str = "{:.3f}") -> str:
    return "n/a" if x is None or not math.isfinite(x) else spec.format(x)


def _ci(side: SideRates, key: str, spec: str) -> str:
    lo, hi = side.ci.get(key, (math.nan, math.nan))
    return "" if not (math.isfinite(lo) and math.isfinite(hi)) else f" [{_f(lo, spec)}, {_f(hi, spec)}]"


def _side(side: SideRates) -> list[str]:
    return [f"{side.replies_with}/{side.replies}{_ci(side, 'share', '{:.2f}')}",
            f"{_f(side.per_1k_tokens, '{:.2f}')}{_ci(side, 'per_1k_tokens', '{:.2f}')}",
            f"{side.continued}/{side.prefixes} = {_f(side.continuation, '{:.2f}')}{_ci(side, 'continuation', '{:.2f}')}",
            f"{side.occurrences} / {side.contexts}"]


def render_phrase_rates(r: PhraseRates) -> str:
    """A table per side (replies with the phrase, per 1k tokens, continuation at the prefix,
    text occurrences / prefix-exact contexts), then what follows each prefix and the tokens whose
    rate moved most."""
    lvl = f"{round(100 * r.level)}%"
    out = [f"phrase rates: {r.replies} replies to {r.prompts} prompts; generated tokens "
           + ", ".join(f"{k} {v}" for k, v in r.tokens.items())
           + "; cut at --max-new: " + ", ".join(f"{k} {v}" for k, v in r.truncated.items())
           + f"  ({lvl} bootstrap intervals over prompts)"]
    head = ["phrase", "side", "replies with", "per 1k tokens", "continuation", "occurrences / contexts"]
    rows = []
    for p in r.phrases:
        rows.append([p.phrase, "base", *_side(p.base)])
        if p.edited is not None:
            rows.append(["", "edited", *_side(p.edited)])
            ch = p.change
            rows.append(["", "change", f"{_f(ch.get('share'), '{:+.2f}')}", f"{_f(ch.get('per_1k_tokens'), '{:+.2f}')}",
                         f"{_f(ch.get('continuation'), '{:+.2f}')}", ""])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    out.append("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    out += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in rows]
    out.append("")
    out.append("after the prefix (top continuations):")
    for p in r.phrases:
        for name, side in (("base", p.base), ("edited", p.edited)):
            if side is not None and side.top_continuations:
                follow = ", ".join(f"{t!r} {n}" for t, n in side.top_continuations)
                out.append(f"  {p.phrase!r} {name}: {follow}")
    if r.token_shifts:
        out.append("")
        out.append("tokens whose generation rate changed most (per 1k tokens, base -> edited):")
        out += [f"  {s.text!r:16} {s.base_per_1k:7.2f} -> {s.edited_per_1k:7.2f}  ({s.base} -> {s.edited})"
                for s in r.token_shifts]
    return "\n".join(out)


def plot_phrase_rates(r: PhraseRates, path, title: str = "") -> Path:
    """PNG: per phrase, the share of replies containing it and the continuation rate at its
    prefix, base beside edited, with the bootstrap intervals as error bars. Written through
    `*.tmp` + fsync + rename."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    path = Path(path)
    sides = [("base", lambda p: p.base)] + ([("edited", lambda p: p.edited)] if any(p.edited for p in r.phrases) else [])
    fig = Figure(figsize=(max(5.0, 1.3 * len(r.phrases) + 2), 6.0), dpi=110)
    for k, (key, label) in enumerate((("share", "replies with the phrase"), ("continuation", "continuation at prefix"))):
        ax = fig.add_subplot(2, 1, k + 1)
        width = 0.8 / len(sides)
        for j, (name, get) in enumerate(sides):
            xs = [i + (j - (len(sides) - 1) / 2) * width for i in range(len(r.phrases))]
            vals = [getattr(get(p), key) for p in r.phrases]
            lo = [get(p).ci.get(key, (math.nan, math.nan))[0] for p in r.phrases]
            hi = [get(p).ci.get(key, (math.nan, math.nan))[1] for p in r.phrases]
            v = [x if math.isfinite(x) else 0.0 for x in vals]
            err = [[max(a - b, 0) if math.isfinite(b) else 0 for a, b in zip(v, lo)],
                   [max(b - a, 0) if math.isfinite(b) else 0 for a, b in zip(v, hi)]]
            ax.bar(xs, v, width=width, yerr=err, capsize=2, label=name)
        ax.set_xticks(range(len(r.phrases)), [p.phrase for p in r.phrases], fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(label, fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle(title or f"phrase rates in free generation ({r.replies} replies, {r.prompts} prompts)", fontsize=9)
    return write_png(fig, path)
