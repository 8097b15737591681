"""The `solve wfld` report: one JSON-ready dict (report.json in the bundle) and a text table.

`bars` is a list of {name, value, threshold, pass, ...} (pass: true, false, or null when the bar
had no rows to stand on). Beside it: the edit's size, the conditions by kind, the Gauss-Newton
log scored exactly after each Q8_0 round trip, p(rejected) per phrase on the train positions
solved on, the same-document held-out positions and the separate held-out documents, what
mining found in each trace, and where the time went.
"""
from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np

from exactedit.solvers.tail.scores import slop_positions
from exactedit.solvers.l47.gauss_newton import KIND_NAMES


def _num(x):
    """JSON-safe number: NaN and infinities become None."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return _num(obj)
    return obj


def bar_json(r) -> dict:
    return {"name": r.key, "value": _num(r.number), "threshold": _num(r.threshold), "pass": r.passed,
            "bar": r.bar, "label": r.label, "op": r.op, "n": r.n, "scope": r.scope,
            "ci": [_num(c) for c in r.ci], "base": _num(r.base), "edited": _num(r.edited)}


def _phrase_table(scores, ctx, mining, cfg, phrases) -> list[dict]:
    slop = slop_positions(scores, mining.tuples)
    phrase_of = np.where(slop >= 0, np.asarray(mining.tuple_phrase + (-1,))[slop], -1)
    roles = scores.doc_roles()
    held = ctx.heldout_b if ctx.heldout_b is not None else np.zeros(scores.rows, dtype=bool)
    scopes = {"train": (roles == "train") & ~held, "same_doc_heldout": (roles == "train") & held,
              "heldout": roles == ctx.heldout_role}
    out = []
    for pi, text in enumerate(phrases):
        row = {"phrase": text, "margin": cfg.margin_for(text),
               "tuples": sum(1 for p in mining.tuple_phrase if p == pi),
               "canonical": None if mining.canonical[pi] is None else [ctx.name(t) for t in mining.canonical[pi]]}
        for name, m in scopes.items():
            sel = m & (phrase_of == pi)
            n = int(sel.sum())
            row[name] = {"n": n, "p_base": _num(np.exp(scores.logp_base[sel]).mean()) if n else None,
                         "p_edit": _num(np.exp(scores.logp_edit[sel]).mean()) if n else None}
        out.append(row)
    return out


def _raised_summary(raised) -> list[dict]:
    """Per phrase: how often each token was raised, how many positions kept a sub-floor one."""
    by: dict[str, dict] = {}
    for item in raised:
        row = by.setdefault(item["phrase"], {"phrase": item["phrase"], "positions": 0, "below_floor": 0,
                                             "raised": {}, "variants": {}})
        row["positions"] += 1
        row["below_floor"] += int(item["below_floor"])
        for key in ("raised", "variants"):
            for cell in item[key]:
                row[key][cell["token"]] = row[key].get(cell["token"], 0) + 1
    return [dict(r, raised=sorted(r["raised"].items(), key=lambda kv: -kv[1]),
                 variants=sorted(r["variants"].items(), key=lambda kv: -kv[1])) for r in by.values()]


def build_report(*, cfg, bars, verdict, scores, ctx, mining, gn, cond, null, w0, tensor, timings,
                 phrases, heldout, marker="", warnings=(), shipping=None, raised=None) -> dict:
    w_norm = float(np.linalg.norm(np.asarray(w0, dtype=np.float64)))
    positions = []
    for name, tm in mining.traces.items():
        h = heldout.get(name)
        for j, (row, pi, ti) in enumerate(zip(tm.rows, tm.phrase, tm.tuple_id)):
            positions.append([name, int(row), int(pi), int(ti), bool(h[j]) if h is not None else False])
    words = [{"word": ctx.name(w), "id": int(w), "phrases": [phrases[p] for p in ps],
              "uses": {name: int(np.sum(tm.coll_word == wi)) for name, tm in mining.traces.items()}}
             for wi, (w, ps) in enumerate(zip(mining.words, mining.word_phrases))]
    report = {
        "solver": "wfld",
        "verdict": verdict,
        "marker": marker,
        "warnings": list(warnings),
        "bars": [bar_json(r) for r in bars],
        "edit": {"tensor": tensor, "dw_rel": float(np.linalg.norm(gn.dW)) / w_norm,
                 "dw_fro": float(np.linalg.norm(gn.dW)), "w_fro": w_norm,
                 "rows_changed": int(np.sum(np.any(gn.dW != 0, axis=1))), "null_rank": int(null["rank"])},
        "null": dict(null),
        "conditions": {KIND_NAMES[k]: int(np.sum(cond.kind == k)) for k in range(len(KIND_NAMES))},
        "iterations": [asdict(it) for it in gn.iterations],
        "phrases": _phrase_table(scores, ctx, mining, cfg, phrases),
        "words": words,
        "mining": {"counts": mining.counts(), "phrases": mining.phrase_counts(),
                   "tuples": [[int(t) for t in tup] for tup in mining.tuples],
                   "positions": positions, "position_fields": ["trace", "row", "phrase", "tuple", "heldout"]},
        "timings": dict(timings),
        "config": cfg.to_json(),
        "shipping": shipping,
        "alternatives": {"positions": list(raised or ()), "summary": _raised_summary(raised or ())},
    }
    return _clean(report)


def _fmt(x, digits=4) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}g}"


def frontier_slices(strength: dict, key: str = "frontier") -> dict:
    """Per phrase, the frontier points where every other phrase is at its chosen strength, by
    that phrase's strength: {phrase: [point, ...]}."""
    chosen = strength["chosen"]
    out = {}
    for ph in chosen:
        rows = [r for r in strength.get(key) or () if all(r["strength"][q] == chosen[q] for q in chosen if q != ph)]
        out[ph] = sorted(rows, key=lambda r: r["strength"][ph])
    return out


def strength_lines(strength: dict | None) -> list[str]:
    """The strengths chosen on dev and, per phrase, the frontier they were read off (dev; and the
    held-out collateral's, reported only)."""
    if not strength or strength.get("on") != "dev":
        return []
    chosen = ", ".join(f"{p!r} {s:g}" for p, s in strength["chosen"].items())
    unmeasured = strength.get("unmeasured") or {}
    judged = strength.get("measured_passed_d", strength["passed_d"])
    if unmeasured and not strength.get("frontier"):
        how = "(no dev row to choose on: each phrase at its cautious limit)"
    elif judged:
        how = ("(the largest mean dev cut whose measured words' dev uses pass (d))" if unmeasured else
               "(the largest mean dev cut whose dev uses pass (d))")
    else:
        how = "(NO combination passes (d) on the dev uses: the weakest)"
    lines = [f"strength per phrase, chosen on dev: {chosen} {how}"]
    search = strength.get("search") or {}
    if search.get("kind") == "coordinate":
        lines.append(f"  (coordinate search: {search['points']} points measured of the grid's "
                     f"{search['combinations']} combinations; each phrase in turn from the best shared strength)")
    lines += unmeasured_lines(strength)
    for label, key in (("dev", "frontier"), ("collateral, held out, not chosen on", "collateral_frontier")):
        rows = strength.get(key) or ()
        if len(strength["chosen"]) > 1 and rows and all(len(set(r["strength"].values())) == 1 for r in rows):
            lines += _shared_lines(rows, label)
            continue
        for ph, rows in frontier_slices(strength, key).items():
            if not rows:
                continue
            lines.append(f"  frontier of {ph!r}, {label} (others at their chosen strength): "
                         "strength | its cut | per word mean dlogp / share below -0.1 (uses)")
            for r in rows:
                coll = ", ".join(f"{w!r} {v['mean']:+.3f}/{v['low']:.2f} ({v['uses']})" for w, v in r["collateral"].items())
                cut = r["cut"].get(ph)
                lines.append(f"    {r['strength'][ph]:5.2f} | {'-' if cut is None else f'{cut:.2f}'} | {coll or '-'}")
    return lines


def unmeasured_lines(strength: dict | None, more: str = "held-out text") -> list[str]:
    """The words dev could not measure (fewer than `min_uses` legitimate uses), what their phrases
    were limited to, and what would measure them (`more`: where such text goes)."""
    if not strength or not strength.get("unmeasured"):
        return []
    need = strength.get("min_uses")
    limited = ", ".join(f"{p!r} <= {s:g}" for p, s in (strength.get("limited") or {}).items())
    lines = [f"NOT MEASURED on dev (fewer than {need} legitimate uses, so (d) cannot judge them; "
             f"their phrases limited: {limited or 'none'}):"]
    lines += [f"  {w!r}: {n} uses on dev; to measure it, give {more} that uses {w.strip()!r} in ordinary "
              f"prose ({need} uses or more on dev)" for w, n in strength["unmeasured"].items()]
    return lines


def gated_lines(gated: dict | None) -> list[str]:
    """The gated edit's section of a report (solvers.l47.gated.edit's summary) as text: per phrase
    its unit, the gate's fit, the unit's activation on the contexts of the fit and of the held-out
    traces against every other row; each unit's removal cost (exact KL on the anchors); each
    down column's solve per strength."""
    if not gated:
        return []

    def act(a):
        if not a or a.get("pos_min") is None:
            return "no contexts"
        return (f"{a['n_pos']} contexts >= {a['pos_min']:.3g} (median {a['pos_median']:.3g}), elsewhere "
                f"|a| <= {_fmt(a['neg_max_abs'], 3)}")

    glu = {"silu": "SwiGLU", "gelu": "GEGLU"}.get(gated.get("activation", "silu"), gated.get("activation"))
    lines = [f"gated edit: units {gated['units']} ({glu}, activation target {gated['activation_target']:.3g})"]
    for p in gated["phrases"]:
        fit = p["gate"]["fit"]
        lines.append(f"  {p['phrase']!r}: unit {p['unit']}, gate AUC {fit['auc']:.3f}, gap {fit['gap']:.3g}")
        lines.append(f"    activation, fit: {act(p.get('fit_activation'))}")
        lines.append(f"    activation, held-out: {act(p.get('heldout_activation'))}")
    lines += [f"  removal of unit {c['unit']}: KL on the anchors mean {c['kl_mean']:.3g}, max {c['kl_max']:.3g}"
              for c in gated["removal"]["chosen"] if c["kl_mean"] is not None]
    if gated.get("columns"):
        lines.append("  down columns (solved at the contexts, per strength): unit | strength | mean log p(phrase's "
                     "token) base -> solved | KL to the target | rows at the codes' bound")
        lines += [f"    {c['unit']} | {c['strength']:.3g} | {c['rejected_logp'][0]:.3f} -> {c['rejected_logp'][1]:.3f} | "
                  f"{c['kl_to_target']:.3g} | {c['clamped']}" for c in gated["columns"]]
    return lines


def _shared_lines(rows, label: str) -> list[str]:
    """One strength shared by every phrase (solvers.l47.frontier, many phrases): the frontier once,
    with the mean cut over the phrases measured at each strength."""
    lines = [f"  frontier, one strength shared by all phrases, {label}: strength | mean cut (phrases measured) | "
             "per word mean dlogp / share below -0.1 (uses)"]
    for r in sorted(rows, key=lambda r: next(iter(r["strength"].values()))):
        cuts = [c for c in r["cut"].values() if c is not None]
        mean = f"{sum(cuts) / len(cuts):.3f} ({len(cuts)})" if cuts else "-"
        coll = ", ".join(f"{w!r} {v['mean']:+.3f}/{v['low']:.2f} ({v['uses']})" for w, v in r["collateral"].items())
        lines.append(f"    {next(iter(r['strength'].values())):5.2f} | {mean} | {coll or '-'}")
    return lines


def format_report(report: dict) -> str:
    """A readable summary: bars, per-phrase p(rejected), the Gauss-Newton log, timings."""
    nl = report["null"]
    lines = [f"wfld: verdict {report['verdict']}, ||dW||/||W|| = {report['edit']['dw_rel']:.4g}, conditions "
             + ", ".join(f"{k} {v}" for k, v in report["conditions"].items() if v),
             f"null space: {nl['rows']} legitimate uses held, rank {nl['rank']}; max ||dW h||/||W h|| "
             f"{_fmt(nl['solved_max_rel'], 3)} solved, {_fmt(nl['shipped_max_rel'], 3)} as shipped "
             f"({(report.get('shipping') or {}).get('type', 'quantized')})"]
    key = report.get("key")
    if key and key["kind"] != "dense":
        lines.append(f"key: {key['kind']}, {key['dims']} directions (per word: slop rows {key['slop_rows']}, "
                     f"plausible rows {key['plausible_rows']})"
                     + (f"; units {key['units']}" if key["units"] else ""))
    lines += strength_lines(report.get("strength"))
    mined = report.get("mining", {}).get("phrases")
    if mined:
        lines.append("mining: prefix-exact contexts / whole-word occurrences in the text: "
                     + ", ".join(f"{m['phrase']!r} {m['contexts']}/{m['occurrences']}" for m in mined))
    if report.get("marker"):
        lines.insert(0, report["marker"])
    lines += [f"warning: {w}" for w in report.get("warnings", ())]
    lines.append("")
    lines.append(f"{'bar':<5} {'what':<48} {'value':>10} {'op':>2} {'threshold':>9} {'n':>6}  pass")
    for b in report["bars"]:
        status = {True: "PASS", False: "FAIL", None: "n/a"}[b["pass"]]
        lines.append(f"{b['bar']:<5} {b['label']:<48} {_fmt(b['value']):>10} {b['op']:>2} "
                     f"{_fmt(b['threshold']):>9} {b['n']:>6}  {status}")
    lines.append("")
    lines.append(f"{'phrase':<20} {'train p base->edit':>22} {'same-doc':>22} {'held-out docs':>22}")
    for p in report["phrases"]:
        cells = [f"{_fmt(p[s]['p_base'], 3)}->{_fmt(p[s]['p_edit'], 3)} ({p[s]['n']})"
                 for s in ("train", "same_doc_heldout", "heldout")]
        lines.append(f"{p['phrase'][:20]:<20} " + " ".join(f"{c:>22}" for c in cells))
    lines.append("")
    lines.append("gauss-newton: it  dw_rel  ship_rel  lin_resid  moved  max|exact change - target| by kind")
    for it in report["iterations"]:
        errs = ", ".join(f"{k} {_fmt(v, 3)}" for k, v in it["exact_err"].items())
        resid = max(it["linear_residual"].values(), default=0.0)
        lines.append(f"              {it['it']:>2}  {_fmt(it['dw_rel'], 3):>6}  {_fmt(it['ship_rel'], 3):>8}  "
                     f"{_fmt(resid, 3):>9}  {_fmt(it['moved'], 3):>5}  {errs}")
    lines += _shipping_lines(report.get("shipping"))
    lines += _raised_lines(report.get("alternatives"))
    lines.append("")
    lines.append("time: " + ", ".join(f"{k} {v:.2f}s" for k, v in report["timings"].items()))
    return "\n".join(lines)


def _shipping_lines(sh) -> list[str]:
    """Per word and per hold: the residual as solved, as shipped, and as ggml's rounding would ship it."""
    if not sh:
        return []
    how = "error feedback in the held directions" if sh["feedback"] else "ggml's quantizer, each weight on its own"
    bg = sh.get("background") or {}
    lines = ["", f"shipping ({sh['type']}, {how}): ||shipped - solved|| / ||solved|| = {_fmt(sh['ship_rel'], 3)} "
             f"(ggml rounding: {_fmt(sh['ship_rel_ggml'], 3)}); on the anchors, relative to the edit: "
             f"{_fmt(bg.get('shipped'), 3)} (ggml rounding: {_fmt(bg.get('ggml'), 3)})",
             f"{'word':<14} {'held':>5} {'max rel: solved':>16} {'shipped':>9} {'ggml':>9}   "
             f"{'collateral':>10} {'mean rel: solved':>16} {'shipped':>9} {'ggml':>9}"]
    for w in sh["words"]:
        h, c = w["held"], w["collateral"]
        lines.append(f"{w['word'][:14]!s:<14} {w['held_uses']:>5} {_fmt(h['solved']['max_rel'], 3):>16} "
                     f"{_fmt(h['shipped']['max_rel'], 3):>9} {_fmt(h['ggml']['max_rel'], 3):>9}   "
                     f"{w['collateral_uses']:>10} {_fmt(c['solved']['mean_rel'], 3):>16} "
                     f"{_fmt(c['shipped']['mean_rel'], 3):>9} {_fmt(c['ggml']['mean_rel'], 3):>9}")
    lines.append(f"{'condition':<16} {'n':>5} {'max |resid| solved':>19} {'shipped':>9} {'ggml':>9} {'exact':>9}")
    for kind, v in sh["holds"].items():
        lines.append(f"{kind:<16} {v['n']:>5} {_fmt(v['solved_linear'], 3):>19} {_fmt(v['shipped_linear'], 3):>9} "
                     f"{_fmt(v['ggml_linear'], 3):>9} {_fmt(v['shipped_exact'], 3):>9}")
    return lines


def _raised_lines(alts) -> list[str]:
    if not alts or not alts.get("summary"):
        return []
    lines = ["", "raised / moved with the rejected token (variants) at the FTPO positions (token x positions):"]
    for r in alts["summary"]:
        raised = ", ".join(f"{t!r} x{n}" for t, n in r["raised"][:8])
        held = ", ".join(f"{t!r} x{n}" for t, n in r["variants"][:6]) or "none"
        lines.append(f"  {r['phrase']}: {r['positions']} positions ({r['below_floor']} below the floor); "
                     f"raised {raised}; variants {held}")
    return lines
