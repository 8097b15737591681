"""The run's report, from its stages' records: DIR/report.json, DIR/report.md and the PNGs.

report.json: `model`, `shipped` (edited.gguf and rules.json with their sha256), `preflight`,
`dataset`, `corpus`, `key`, `strength`, `bars`, `collateral`, `shipping`, `alternatives`,
`verify`, `dev_verdict`, `phrase_rates` (base against the edited weights), `arms` (per phrase and
arm: base, rules, weights, both, with bootstrap intervals over prompts), `rules`, `cost` (KL and
perplexity on text the solve never fitted, MATTR per arm, token shifts), `artefacts`, `targets`,
`new_slop` (discover on the edited weights' replies against base's), `unmeasured` (the banned
words bar (d) could not measure, the strength their phrases were held to and what text would
measure them; report.md lists them under the shipped files), `seconds`, `stages`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from exactedit.evals.scoring.collateral import collateral_lines
from exactedit.runs.antislop.arms import ARM_LABELS
from exactedit.files import atomic_write_text, write_png
from exactedit.solvers.l47.report import gated_lines, strength_lines

NEW_SLOP_TOP = 15
REPORTS = ("report.json", "report.md", "collateral.png", "frontier.png")     # write_reports' files in DIR
CONTINUATION_CUT = 0.70      # the target: continuation at the prefix down >= 70% per solved phrase

__all__ = ["CONTINUATION_CUT", "REPORTS", "demo_targets", "frontier_png", "new_slop_of", "unmeasured_md",
           "unmeasured_words", "write_reports"]


def new_slop_of(edited: Sequence[str], base: Sequence[str]):
    """What took the banned phrases' place: `exactedit discover` on the edited model's rate replies
    against the base model's (same prompts and seeds), both corpora pooled as the prior's background
    (the reference is the same model's own text, not English at large: no evidence against the
    language, `min_ratio` None); the prior's weight is a tenth of the smaller side's words, so a
    phrase needs the evidence of several replies. None when either side has no words."""
    from exactedit.evals.discover import DiscoverError, Text, discover

    def texts(side, replies):
        return [Text(x, side, f"{side} reply {i}") for i, x in enumerate(replies)]

    e, b = texts("edited", edited), texts("base", base)
    words = min(sum(len(t.text.split()) for t in side) for side in (e, b)) if e and b else 0
    if words == 0:
        return None
    try:
        return discover(e, b, top=NEW_SLOP_TOP, background="human", alpha0=max(10.0, words / 10), min_ratio=None)
    except DiscoverError:
        return None


def _collateral_png(bars: Sequence[dict], path: Path) -> Path:
    """PNG: bar (d) per word, mean dlogp on its legitimate uses, with the bar's threshold."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [b for b in bars if b.get("bar") == "(d)" and "mean" in b.get("name", "")]
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.45 * max(len(rows), 1)))
    labels = [b.get("label", b["name"]) for b in rows]
    vals = [b["value"] if b["value"] is not None else 0.0 for b in rows]
    ax.barh(range(len(rows)), vals, color=["tab:green" if b["pass"] else "tab:red" for b in rows])
    if rows:
        ax.axvline(rows[0]["threshold"], color="k", ls="--", lw=1, label=f"bar {rows[0]['threshold']}")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_xlabel("mean dlogp on legitimate uses (nats)")
    ax.set_title("per-word collateral, bar (d)", fontsize=9)
    return write_png(fig, path)


def frontier_png(strength: dict, path: Path) -> Path:
    """PNG: per phrase (the others at their chosen strength), its continuation cut against the
    worst word's share of uses below -0.1, one point per strength (dev: solid; the held-out
    collateral, never chosen on: dashed); the chosen strength circled."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from exactedit.solvers.l47.report import frontier_slices

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = {}
    for label, key, ls in (("dev", "frontier", "-"), ("collateral", "collateral_frontier", "--")):
        for ph, rows in frontier_slices(strength, key).items():
            pts = [(max(v["low"] for v in r["collateral"].values()), r["cut"][ph], r["strength"][ph])
                   for r in rows if ph in r["cut"] and r["collateral"]]
            if not pts:
                continue
            xs, ys, ss = zip(*pts)
            line, = ax.plot(xs, ys, ls, marker="o", ms=3, color=colors.get(ph), label=f"{label}: {ph!r}")
            colors[ph] = line.get_color()
            for x, y, st in pts:
                if st == strength["chosen"][ph]:
                    ax.plot([x], [y], "o", ms=9, mfc="none", color=colors[ph])
    ax.axvline(0.10, color="k", ls=":", lw=1, label="bar (d): 10% of uses")
    ax.axhline(0.70, color="grey", ls=":", lw=1, label="target cut 70%")
    ax.set_xlabel("worst word's share of legitimate uses below -0.1 nats")
    ax.set_ylabel("continuation cut at the phrase's prefix")
    ax.set_title("strength frontier per phrase (circled: chosen on dev)", fontsize=9)
    ax.legend(fontsize=6, loc="lower right")
    return write_png(fig, path)


def demo_targets(vs_base: dict, solved: Sequence[str], bars: Sequence[dict], verify_passed: bool,
                 artefacts: dict, stops: dict) -> list[dict]:
    """The run's targets, each {name, value, target, pass}: per solved phrase the continuation cut
    at its prefix (1 - arm / base, held-out prompts) by the edited weights and, where measured, by
    weights + rules; every bar; verify live; the edited replies' variant artefacts; and the
    turn-end rate (replies that reached the model's turn end, base vs edited: unchanged means within
    one reply). `vs_base`: arm -> that arm's phrase rates against base (`PhraseRates.to_dict()`'s
    `phrase_rates` list); `stops`: arm -> each reply's stop reason."""
    out = []
    for arm, suffix in (("weights", ""), ("both", ", weights + rules")):
        for p in vs_base.get(arm, ()):
            if p["phrase"] not in solved or not p.get("edited"):
                continue
            b, e = p["base"].get("continuation"), p["edited"].get("continuation")
            cut = None if not b or e is None else 1.0 - e / b
            out.append({"name": f"continuation cut {p['phrase']!r}{suffix}", "value": cut,
                        "target": f">= {CONTINUATION_CUT}", "pass": cut is not None and cut >= CONTINUATION_CUT})
    failed = [f"{x['bar']} {x.get('label', x['name'])}{'' if x['pass'] is False else ' (n/a: no rows to stand on)'}"
              for x in bars if not x["pass"]]
    out.append({"name": "bars (a)-(g)", "value": f"{len(bars) - len(failed)}/{len(bars)} pass",
                "target": "all pass", "pass": not failed, "failed": failed})
    out.append({"name": "verify live (bitwise)", "value": verify_passed, "target": True, "pass": bool(verify_passed)})
    n_art = len(artefacts.get("weights", ()))
    out.append({"name": "variant artefacts, edited replies", "value": n_art, "target": 0, "pass": n_art == 0})
    ends = {k: sum(s == "turn_end" for s in v) for k, v in stops.items()}
    n = max(len(stops.get("base", ())), 1)
    out.append({"name": "turn-end rate (replies ending at the turn end)",
                "value": f"{ends.get('base', 0)}/{n} -> {ends.get('weights', 0)}/{n}", "target": "within 1 reply",
                "pass": abs(ends.get("base", 0) - ends.get("weights", 0)) <= 1})
    return out


def unmeasured_words(wf: dict, preflight: dict | None = None) -> dict:
    """The banned words bar (d) could not measure (fewer than the bars' minimum of legitimate uses):
    per word (as the bars name it), its uses on dev (where the strength was chosen) and in the
    collateral (where (d) is judged) when short, the strength its phrases were held to, what the
    preflight count foresaw, and what text would measure it. {} when every word was measured."""
    from exactedit.evals.protocol.protocol import Bars

    st = wf.get("strength") or {}
    need = st.get("min_uses") or Bars().collateral_min_uses
    names = {str(w["id"]): w["word"] for w in wf.get("words", ())}
    ends = {w["word"]: list(w.get("phrases", ())) for w in wf.get("words", ())}
    out: dict = {}
    for w, n in (st.get("unmeasured") or {}).items():
        out.setdefault(repr(w), {})["dev_uses"] = n
    for b in wf.get("bars", ()):
        key, _, wid = b["name"].partition(":")
        if key == "d_mean" and b["pass"] is False and b["n"] < need:
            out.setdefault(names.get(wid, wid), {})["collateral_uses"] = b["n"]
    foreseen = {repr(u["word"]): u for u in ((preflight or {}).get("uses") or {}).get("words", ())}
    for word, row in out.items():
        row["min_uses"] = need
        row["limited_to"] = {p: s for p, s in (st.get("limited") or {}).items() if p in ends.get(word, ())} or None
        if word in foreseen:
            row["foreseen"] = {k: foreseen[word][k] for k in ("dev", "collateral", "texts")}
        fixes = []
        if "collateral_uses" in row:
            fixes.append(f"--texts with ordinary uses of {word} (about {3 * need}: a third of the texts' uses "
                         "reach the collateral)")
        if "dev_uses" in row:
            fixes.append(f"data prompts whose held-out replies use {word} ordinarily, or a larger --corpus-tokens "
                         "where the corpus has it")
        row["measure_with"] = " and ".join(fixes)
    return out


def unmeasured_md(words: dict) -> list[str]:
    """report.md's lines on the words (d) did not measure (`unmeasured_words`)."""
    if not words:
        return []
    lines = ["NOT MEASURED: bar (d) could not judge these banned words (too few ordinary uses); the edit and the "
             "rules ship, with these words flagged:"]
    for word, row in words.items():
        where = ", ".join(f"{n} uses {k.split('_')[0]}" for k, n in row.items() if k in ("dev_uses", "collateral_uses"))
        held = ", ".join(f"{p!r} at most {s:g}" for p, s in (row.get("limited_to") or {}).items())
        lines.append(f"  {word}: {where} (fewer than {row['min_uses']})" + (f"; strength held: {held}" if held else "")
                     + f"; to measure it, give {row['measure_with']}")
    return lines


def _arms_table(vs: dict) -> list[dict]:
    """Per phrase, every arm's rates (base from any comparison: all share base's replies)."""
    first = next(iter(vs.values()))["phrase_rates"]
    rows = []
    for i, p in enumerate(first):
        row = {"phrase": p["phrase"], "base": p["base"]}
        for arm, r in vs.items():
            row[arm] = r["phrase_rates"][i]["edited"]
            row[f"{arm}_change_ci"] = r["phrase_rates"][i].get("change_ci")
        rows.append(row)
    return rows


def _f(x, spec="{:.2f}") -> str:
    return "n/a" if x is None else spec.format(x)


def _ci(s: dict, key: str = "continuation") -> str:
    lo, hi = (s.get("ci") or {}).get(key) or (None, None)
    return "" if lo is None or hi is None else f" [{lo:.2f}, {hi:.2f}]"


def corpus_md(corpus: dict) -> list[str]:
    """The corpus stage in report.md: its sources by kind, and per part its token budget, windows and
    rows, and per word the windows taken for it and its uses inside them by source kind."""
    kinds = corpus["corpus"].get("kinds") or {}
    lines = ["", "corpus (teacher-forced windows, split by source document; "
             f"{corpus['corpus']['sources']} sources" + "".join(f", {kinds[k]} {k}" for k in kinds if kinds[k]) + "):",
             "", "| part | budget (tokens) | windows | rows | per word: uses (windows taken; uses by source) |",
             "|---|---|---|---|---|"]
    for part in corpus["parts"]:
        by_kind = part.get("by_kind") or {}
        words = "; ".join(f"{w!r} {n} ({part['taken'].get(w, 0)}"
                          + "".join(f"; {k} {by_kind[k].get(w, 0)}" for k in by_kind) + ")"
                          for w, n in part["uses"].items())
        lines.append(f"| {part['name']} | {part['budget']} | {part['windows']} | {part['rows']} | {words} |")
    return lines + [f"warning: {w}" for w in corpus["warnings"]]


def _status(passed: bool | None) -> str:
    """A bar's verdict as the tables write it: a bar with no rows to stand on (None) is n/a, not FAIL."""
    return "n/a" if passed is None else "pass" if passed else "FAIL"


def report_text(obj: dict, rec: dict) -> str:
    """report.md's text."""
    model = Path(obj["model"]).name
    data = rec["data"]
    lines = [f"# exactedit antislop: {model}", "",
             f"shipped: `edited.gguf` (sha256 {obj['shipped']['edited.gguf'][:12]}) and `rules.json` (sha256 "
             f"{obj['shipped']['rules.json'][:12]}), side by side"]
    found = unmeasured_md(obj.get("unmeasured") or {})
    found += [f"preflight: {w}" for w in ((rec.get("preflight") or {}).get("uses") or {}).get("warnings", ())]
    lines += ([""] + found if found else []) + ["",
             f"data: {sum(s['docs'] for s in data['sets'])} documents in {len(data['sets'])} sets "
             f"({', '.join(str(s['name']) + ' ' + str(s['docs']) for s in data['sets'])})"]
    lines += [f"warning: {w}" for w in data["warnings"]]
    if rec["corpus"] is not None:
        lines += corpus_md(rec["corpus"])
    wf = rec["solve"]["report"]
    key = wf.get("key") or {}
    lines += ["", f"## solve wfld: {rec['solve']['verdict']} (key {key.get('kind', 'dense')}, "
              f"{wf['conditions'].get('word@plausible', 0)} word holds, {len(obj['solved'])} phrases, "
              f"{rec['solve']['solve_seconds']:.0f} s)", ""]
    choice = rec["solve"].get("key_choice")
    if choice:
        lines.append(f"edit kind chosen on dev: {choice['why']}")
        lines += [f"  {k:<6} (d) on dev {'pass' if v['passed_d'] else 'FAIL'}, mean dev cut "
                  f"{'n/a' if v['dev_cut'] is None else round(v['dev_cut'], 3)} at {v['strength']}"
                  for k, v in choice["kinds"].items()]
    lines += ["  " + x for x in gated_lines(wf.get("gated"))]
    lines += strength_lines(wf.get("strength"))
    lines += [f"  {b['bar']:<4} {b.get('label', b['name'])[:60]:<60} "
              f"{b['value'] if b['value'] is None else round(b['value'], 5)!s:>10}"
              f"  {b['op']} {b['threshold']}  {_status(b['pass'])}" for b in obj["bars"]]
    coll = collateral_lines(wf.get("collateral") or ())
    if coll:
        lines += [""] + coll
    v = rec["verify"]
    lines += ["", f"## verify live: {'PASS' if v['passed'] else 'FAIL'} ({v['tokens']} tokens)"]
    lines += [f"  {c['name']}: bitwise {c['stats']['bitwise']}, max |diff| {c['stats']['max_abs']:.3g}, KL mean "
              f"{c['stats']['kl_mean']:.3g}, top-1 {c['stats']['top1']:.4f}" for c in v["checks"]]
    lines += ["", f"## dev score: {rec['solve']['dev_verdict']} ({rec['solve']['dev_report']})"]
    rules = rec["rules"]
    pen = [x for x in rules.get("rules", ()) if x.get("kind") == "prefix-penalty"]
    lines += ["", f"## rules: {rules['out']} (prefix penalty -{pen[0]['bias']:g} on {len(pen[0]['phrases'])} phrases, "
              f"{pen[0]['pieces']} token pieces)" if pen else f"## rules: {rules['out']}"]
    lines += [f"  skipped {s['phrase']!r}: {s['why']}" for s in rules.get("skipped", ())]
    rates = rec["rates"]
    arms = ["base"] + list(rates["vs_base"])
    lines += ["", f"## phrase rates, held-out prompts ({rates['prompts']} prompts x {len(rates['seeds'])} seeds; "
              "replies with the phrase / continuation at its prefix [95% bootstrap over prompts])", "",
              "| phrase | " + " | ".join(ARM_LABELS[a] for a in arms) + " |", "|---" * (len(arms) + 1) + "|"]
    for row in obj["arms"]:
        lines.append(f"| {row['phrase']!r} | " + " | ".join(
            f"{row[a]['replies_with']}/{row[a]['replies']}, cont {_f(row[a]['continuation'])}{_ci(row[a])}"
            for a in arms) + " |")
    lines += ["", "variant artefacts: " + ", ".join(f"{ARM_LABELS[a]} {len(x)}" for a, x in rates["artefacts"].items())]
    lines += [f"  {a['found']!r} ({ARM_LABELS[arm]} reply {a['reply']})" for arm, xs in rates["artefacts"].items()
              if arm != "base" for a in xs]
    cost = rec["cost"]
    lines += ["", "## cost on ordinary text", "", "KL(base || edited weights) and perplexity, exact tail, every row:", ""]
    for label, k in cost["kl"].items():
        lines.append(f"  {label}: {k['rows']} rows, KL mean {k['kld']['mean']:.3g} (p99 {k['kld']['p99']:.3g}, "
                     f"max {k['kld']['max']:.3g}), same top-1 {k['same_top']:.4f}, perplexity {k['ppl_base']:.4f} -> "
                     f"{k['ppl_edited']:.4f}")
    lines += ["", "lexical diversity of the replies (MATTR, window "
              f"{next(iter(cost['diversity'].values()))['window']} words, replies concatenated):"]
    lines += [f"  {ARM_LABELS[a]:<16} {_f(d['mattr'], '{:.4f}')}  ({d['words']} words, {d['types']} types)"
              for a, d in cost["diversity"].items()]
    shifts = obj["cost"]["token_shifts"]
    if shifts:
        lines += ["", "tokens whose rate moved most, base -> edited weights (per 1k tokens):"]
        lines += [f"  {s['text']!r:<18} {_f(s['base_per_1k'])} -> {_f(s['edited_per_1k'])}" for s in shifts]
    lines += ["", "## targets"]
    shown = lambda x: f"{x:.3f}" if isinstance(x, float) else str(x)   # noqa: E731
    lines += [f"  {t['name']:<60} {shown(t['value']):>14}  target {t['target']!s:<12} {'pass' if t['pass'] else 'FAIL'}"
              + (f"  ({'; '.join(t['failed'])})" if t.get("failed") else "") for t in obj["targets"]]
    lines += ["", "## new slop: the edited weights' replies' phrases against the base replies' (same prompts and seeds)"]
    ns = obj["new_slop"]
    if ns is None or not ns["phrases"]:
        c = ns["settings"] if ns is not None else None
        lines.append("  none over-used" + (f" (z >= {c['min_z']:g}, log-odds >= {c['min_log_odds']:g}, in "
                                           f"{c['min_docs']}+ replies)" if c else " (no words on one side)"))
    lines += [f"  {p['phrase']!r:<40} z {p['z']:6.2f}  edited {p['model_count']} ({p['model_per_1k']:.2f}/1k words)  "
              f"base {p['human_count']} ({p['human_per_1k']:.2f}/1k)" for p in (ns["phrases"] if ns else ())]
    st = obj["stages"]
    lines += ["", "time: " + ", ".join(f"{k} {v:.0f} s" for k, v in obj["seconds"].items())
              + (f" (resumed: {', '.join(st['resumed'])})" if st["resumed"] else "")]
    return "\n".join(lines)


def write_reports(out: Path, model: str, rec: dict, seconds: dict, *, ran: Sequence[str] = (),
                  resumed: Sequence[str] = (), progress: Callable[[int, int], None] | None = None
                  ) -> tuple[dict, dict, str]:
    """(files, report.json's object, report.md's text), written into `out`."""
    out = Path(out)
    replies = json.loads((out / "replies.json").read_text(encoding="utf-8"))
    by_arm: dict[str, list] = {}
    for x in replies:
        by_arm.setdefault(x["side"], []).append(x)
    wf = rec["solve"]["report"]
    bars = wf["bars"]
    solved = [p["phrase"] for p in wf.get("phrases", []) if isinstance(p, dict) and "phrase" in p]
    vs = {a: r["phrase_rates"] for a, r in rec["rates"]["vs_base"].items()}
    targets = demo_targets(vs, solved, bars, rec["verify"]["passed"], rec["rates"]["artefacts"],
                           {a: [x["stop"] for x in xs] for a, xs in by_arm.items()})
    ns = new_slop_of([x["text"] for x in by_arm.get("weights", ())], [x["text"] for x in by_arm.get("base", ())])
    files = {"json": out / "report.json", "md": out / "report.md", "rates_png": out / "phrase-rates.png",
             "arms_png": out / "arms.png", "collateral_png": out / "collateral.png", "replies": out / "replies.json",
             "edited": out / "edited.gguf", "rules": out / "rules.json"}
    _collateral_png(bars, files["collateral_png"])
    strength = wf.get("strength") or {}
    if strength.get("frontier"):
        files["frontier_png"] = out / "frontier.png"
        frontier_png(strength, files["frontier_png"])
    weights = rec["rates"]["vs_base"]["weights"]
    obj = {"model": model, "out": str(out), "solved": solved,
           "shipped": {"edited.gguf": rec["apply"]["sha256"], "rules.json": rec["rules"]["out_sha256"]},
           "preflight": rec["preflight"], "protocol": rec["solve"]["protocol"],
           "dataset": {k: v for k, v in rec["data"].items() if k != "tuples"}, "corpus": rec["corpus"],
           "key": wf.get("key"), "key_choice": rec["solve"].get("key_choice"), "gated": wf.get("gated"),
           "strength": wf.get("strength"), "wfld_bundle": rec["solve"]["bundle"],
           "wfld_verdict": rec["solve"]["verdict"], "bars": bars, "collateral": wf.get("collateral"),
           "shipping": wf.get("shipping"), "alternatives": wf.get("alternatives"),
           "edited": rec["apply"]["edited"], "edited_sha256": rec["apply"]["sha256"], "verify": rec["verify"],
           "dev_verdict": rec["solve"]["dev_verdict"], "dev_report": rec["solve"]["dev_report"],
           "phrase_rates": weights["phrase_rates"], "rates_run": weights, "arms": _arms_table(rec["rates"]["vs_base"]),
           "arms_run": rec["rates"]["arms"], "rules": rec["rules"],
           "cost": {**rec["cost"], "token_shifts": weights.get("token_shifts", [])},
           "artefacts": {"base": rec["rates"]["artefacts"].get("base", []),
                         "edited": rec["rates"]["artefacts"].get("weights", []),
                         **{a: x for a, x in rec["rates"]["artefacts"].items() if a not in ("base", "weights")}},
           "targets": targets, "unmeasured": unmeasured_words(wf, rec.get("preflight")),
           "new_slop": ns.to_dict() if ns is not None else None,
           "seconds": {k: round(v, 2) for k, v in seconds.items()},
           "stages": {"ran": list(ran), "resumed": list(resumed)}}
    text = report_text(obj, rec)
    obj["files"] = {k: str(v) for k, v in files.items()}
    atomic_write_text(files["json"], json.dumps(obj, indent=1, default=str) + "\n")
    atomic_write_text(files["md"], text + "\n\n![phrase rates per arm](arms.png)\n\n![base vs edited weights]"
                      "(phrase-rates.png)\n\n![collateral](collateral.png)\n"
                      + ("\n![frontier](frontier.png)\n" if "frontier_png" in files else ""))
    if progress is not None:
        progress(1, 1)
    return files, obj, text
