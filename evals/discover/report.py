"""A Discovery as a text table, a PNG and a JSON file (the files written atomically).

    render_discovery(d) -> str
    plot_discovery(d, path, top=30) -> Path      excess uses per phrase (by kind) | model vs human per 1,000 words
    write_discovery(d, path) -> Path             d.to_json()
"""
from __future__ import annotations

import json
from pathlib import Path

from exactedit.evals.discover.ranking import Discovery
from exactedit.files import atomic_write_text, write_png


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _sources(sources: dict[str, int], shown: int = 3) -> str:
    items = [f"{tag} {n}" for tag, n in list(sources.items())[:shown]]
    return ", ".join(items) + (f", +{len(sources) - shown} more" if len(sources) > shown else "")


def _num(x, digits: int = 1) -> str:
    """A ratio for the table: '-' for none, no decimals from 100 up."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.{digits}f}"


def render_discovery(d: Discovery) -> str:
    """The ranked phrases as a table, under the two corpora's sizes, the listing rule and the kinds;
    with no phrase, the one that came closest and what would list it."""
    c = d.config
    k = len(d.model.sources)
    lang = (f"or at least {c.min_ratio:g}x {c.lang}'s rate (Poisson bound at {c.confidence:g}, its rarest word's wordfreq "
            f"rate; a phrase, not a neighbour) with yours at most half the model's" if c.min_ratio is not None
            else f"(no {c.lang} evidence)")
    out = [f"model text: {d.model.texts} texts, {d.model.words} words ({k} source{'s' if k != 1 else ''}, "
           f"{d.prompts} prompts); human text: {d.human.texts} texts, {d.human.words} words",
           f"listed: z >= {c.min_z:g} and log-odds >= {c.min_log_odds:g} against your text ({c.background} prior, "
           f"alpha0 {c.alpha0:g}), {lang}; seen {c.min_count}+ times in {c.min_docs}+ texts; grams of 1-{c.max_n} "
           f"tokens (extended to {c.max_len})"]
    out += [f"note: {n}" for n in d.notes if not (d.closest and n == d.closest["summary"])]
    if not d.phrases:
        out.append("no phrase is over-used at these settings")
        if d.closest:
            out.append(f"closest: {d.closest['phrase']!r} ({d.closest['model_count']} uses in "
                       f"{d.closest['model_docs']} texts)")
            out += [f"  misses: {m}" for m in d.closest["misses"]]
            out.append(f"  listed with: {' and '.join(d.closest['changes'])}")
        return "\n".join(out)
    counts = ", ".join(f"{d.listed.get(kind, 0)} {kind}" for kind in ("style", "mixed", "topic"))
    out.append(f"kinds: {counts} passed (style first, then mixed, then topic, each by excess uses; the first "
               f"{c.top} shown); topic phrases are the prompts' subject and stay out of `--phrases F.json` lists "
               "unless --kind asks")
    head = ["#", "phrase", "kind", "evidence", "excess", "score", "z", "log-odds", f"x{c.lang}>=", "model", "/1k",
            "human", "/1k", "prompts", "D", "func", "sources"]
    rows = [[str(i), repr(_cut(p.phrase, 40)), p.kind if p.kind != "topic" else "TOPIC", p.evidence, f"{p.excess:.1f}",
             _num(p.score), f"{p.z:.1f}", f"{p.log_odds:.2f}", _num(p.lang_ratio_low), str(p.model_count),
             f"{p.model_per_1k:.2f}", str(p.human_count), f"{p.human_per_1k:.2f}", f"{p.prompts}/{d.prompts}",
             "-" if p.dispersion is None else f"{p.dispersion:.2f}", f"{p.function_share:.2f}", _sources(p.sources)]
            for i, p in enumerate(d.phrases, 1)]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    right = {0, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
    line = lambda cells: "  ".join(x.rjust(w) if i in right else x.ljust(w)  # noqa: E731
                                   for i, (x, w) in enumerate(zip(cells, widths))).rstrip()
    out += ["", line(head)] + [line(r) for r in rows]
    return "\n".join(out)


def plot_discovery(d: Discovery, path, top: int = 30) -> Path:
    """PNG of the first `top` phrases: their excess uses (the ranking key), colored by kind (left), and
    their rates per 1,000 words, model beside human (right)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    path = Path(path)
    shown = d.phrases[:top]
    labels = [_cut(p.phrase, 40) for p in shown][::-1]
    ys = list(range(len(shown)))
    fig = Figure(figsize=(11.0, 1.5 + 0.28 * max(len(shown), 1)), dpi=110)
    ax_z, ax_r = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    colors = {"style": "tab:red", "mixed": "tab:orange", "topic": "tab:gray"}
    ax_z.barh(ys, [p.excess for p in shown][::-1], color=[colors[p.kind] for p in shown][::-1])
    ax_z.set_yticks(ys, labels, fontsize=7)
    ax_z.set_xlabel("excess uses: beyond the reference's rate bound (red: style, orange: mixed, gray: topic)",
                    fontsize=8)
    h = 0.4
    ax_r.barh([y + h / 2 for y in ys], [p.model_per_1k for p in shown][::-1], height=h, label="model")
    ax_r.barh([y - h / 2 for y in ys], [p.human_per_1k for p in shown][::-1], height=h, label="human")
    ax_r.set_yticks(ys, [""] * len(ys))
    ax_r.set_xlabel("per 1,000 words", fontsize=8)
    ax_r.legend(fontsize=7)
    fig.suptitle(f"over-used phrases: {d.model.words} model words against {d.human.words} of yours "
                 f"({d.config.background} prior)", fontsize=9)
    return write_png(fig, path)


def write_discovery(d: Discovery | dict, path) -> Path:
    """The Discovery's JSON (or a JSON object built from one, e.g. with ban points added), written
    through `path.tmp` + fsync + rename."""
    from exactedit.solvers.phrases import MAX_PHRASES_FILE, PhraseError

    text = d.to_json() if isinstance(d, Discovery) else json.dumps(d, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    if len(text.encode("utf-8")) > MAX_PHRASES_FILE:      # --phrases F.json would refuse to read it back
        raise PhraseError(path, "out", f"{len(text.encode('utf-8'))} bytes, over the {MAX_PHRASES_FILE} bytes a "
                          "phrases file may hold (--phrases would refuse it): give a smaller --top")
    atomic_write_text(path, text)
    return Path(path)
