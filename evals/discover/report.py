"""A Discovery as a text table, a PNG and a JSON file (the files written atomically).

    render_discovery(d) -> str
    plot_discovery(d, path, top=30) -> Path      z per phrase | model vs human per 1,000 words
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


def render_discovery(d: Discovery) -> str:
    """The ranked phrases as a table, under the two corpora's sizes and the settings."""
    c = d.config
    k = len(d.model.sources)
    out = [f"model text: {d.model.texts} texts, {d.model.words} words ({k} source{'s' if k != 1 else ''}); "
           f"human text: {d.human.texts} texts, {d.human.words} words",
           f"log-odds with a {c.background} prior (alpha0 {c.alpha0:g}, floor {c.alpha_min:g}); grams of 1-{c.max_n} "
           f"tokens (extended to {c.max_len}) seen {c.min_count}+ times, z >= {c.min_z:g}"]
    out += [f"note: {n}" for n in d.notes]
    if not d.phrases:
        out.append("no phrase is over-used at these settings")
        return "\n".join(out)
    head = ["#", "phrase", "z", "log-odds", "model", "/1k", "human", "/1k", "sources"]
    rows = [[str(i), repr(_cut(p.phrase, 48)), f"{p.z:.1f}", f"{p.log_odds:.2f}", str(p.model_count),
             f"{p.model_per_1k:.2f}", str(p.human_count), f"{p.human_per_1k:.2f}", _sources(p.sources)]
            for i, p in enumerate(d.phrases, 1)]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    right = {0, 2, 3, 4, 5, 6, 7}
    line = lambda cells: "  ".join(x.rjust(w) if i in right else x.ljust(w)  # noqa: E731
                                   for i, (x, w) in enumerate(zip(cells, widths))).rstrip()
    out += ["", line(head)] + [line(r) for r in rows]
    return "\n".join(out)


def plot_discovery(d: Discovery, path, top: int = 30) -> Path:
    """PNG of the first `top` phrases: their z (left) and their rates per 1,000 words, model beside
    human (right)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    path = Path(path)
    shown = d.phrases[:top]
    labels = [_cut(p.phrase, 40) for p in shown][::-1]
    ys = list(range(len(shown)))
    fig = Figure(figsize=(11.0, 1.5 + 0.28 * max(len(shown), 1)), dpi=110)
    ax_z, ax_r = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    ax_z.barh(ys, [p.z for p in shown][::-1], color="tab:red")
    ax_z.set_yticks(ys, labels, fontsize=7)
    ax_z.set_xlabel("z (log-odds / its standard error)", fontsize=8)
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
    text = d.to_json() if isinstance(d, Discovery) else json.dumps(d, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    atomic_write_text(path, text)
    return Path(path)
