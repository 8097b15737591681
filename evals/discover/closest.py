"""With nothing listed: the gram that came closest, what it misses and what would list it.

    closest(stream, levels, scores, cfg, words, shapes) -> dict | None

Every gram of order 1..max_n of a listable shape that the model wrote is checked against the listing
rules (ranking.py): min_count, min_docs and an evidence (against the user's text: z >= min_z and the
log-odds floor; against the language: the ratio's bound and the cohesion >= min_ratio, the user's
own rate at most the model's over exp(floor)). The closest misses the fewest rules; among those, a
gram of two tokens or more comes before a single word (a ban needs a prefix), then the highest score
(the larger lower bound). Its entry names each rule it misses with its value, and the settings that
would let it through.
"""
from __future__ import annotations

import math

import numpy as np

from exactedit.evals.discover.ngrams import occurrences, written_form


def _down(x: float) -> str:
    """x rounded down to 2 decimals (a threshold at it lets x through)."""
    return f"{math.floor(x * 100) / 100:g}"


def closest(stream, levels, scores, cfg, words, shapes) -> dict | None:
    """The nearest miss as a dict (phrase, its numbers, `misses`, `changes`, `summary`); None when the
    model wrote no gram of a listable shape."""
    best = None
    for lv, sc, shape in zip(levels[:cfg.max_n], scores, shapes):
        seen = np.flatnonzero((lv.model >= 1) & shape)
        if seen.size == 0:
            continue
        fails = ((lv.model[seen] < cfg.min_count).astype(int) + (lv.model_docs[seen] < cfg.min_docs)
                 + ~(sc.user[seen] | sc.language[seen]))
        score = sc.score(seen)
        i = np.lexsort((-score, fails))[0]
        key = (int(fails[i]), lv.n == 1, -float(score[i]))
        if best is None or key < best[0]:
            best = (key, lv, sc, int(seen[i]))
    if best is None:
        return None
    _, lv, sc, g = best
    return _describe(stream, lv, sc, g, cfg, words)


def _evidence(sc, g: int, cfg, words) -> tuple[str, str]:
    """What the gram misses of both evidences, and the settings that would give it one."""
    z, delta, floor = float(sc.z[g]), float(sc.delta[g]), float(sc.floor[g])
    name = "function_log_odds" if sc.function[g] else "min_log_odds"
    user = [f"z {z:.2f} under --min-z {cfg.min_z:g}"] if z < cfg.min_z else []
    user += [f"log-odds {delta:.2f} under {name} {floor:g}"] if delta < floor else []
    ways = []
    if delta >= floor:
        ways.append(f"--min-z {_down(z)}" if z > 0 else f"more of your own text ({words[1]} words now)")
    if cfg.min_ratio is None:
        lang = ["no evidence against the language asked (min_ratio None)"]
    elif math.isnan(sc.lang[g]):
        lang = [f"punctuation alone has no rate in wordfreq's {cfg.lang}"]
    else:
        low, coh = float(sc.lang_low[g]), float(sc.cohesion[g])
        lang = [f"its rate at least {low:.2f}x {cfg.lang}'s, under --min-ratio {cfg.min_ratio:g}"] \
            if low < cfg.min_ratio else []
        lang += [f"its cohesion {coh:.2f} (an end word after the rest over its own rate) under --min-ratio "
                 f"{cfg.min_ratio:g}"] if coh < cfg.min_ratio else []
        lang += [f"you write it at more than the model's rate over {math.exp(floor):.1f}"] if not sc.yours[g] else []
        if sc.yours[g] and min(low, coh) > 0:
            ways.append(f"--min-ratio {_down(min(low, coh))}")
    miss = "against your text: " + (", ".join(user) or "holds") + "; against the language: " + ", ".join(lang)
    return miss, " or ".join(ways) or "more of the model's text"


def _describe(stream, lv, sc, g: int, cfg, words) -> dict:
    pos = occurrences(stream, lv, [g])[g]
    phrase = written_form(stream, lv.n, pos)
    count, docs = int(lv.model[g]), int(lv.model_docs[g])
    misses, changes = [], []
    if count < cfg.min_count:
        misses.append(f"the model wrote it {count} times, under --min-count {cfg.min_count}")
        changes.append(f"--min-count {count}")
    if docs < cfg.min_docs:
        misses.append(f"it is in {docs} of the model's texts, under min_docs {cfg.min_docs}")
        changes.append(f"min_docs {docs} (DiscoverConfig)")
    if not (sc.user[g] or sc.language[g]):
        miss, change = _evidence(sc, g, cfg, words)
        misses.append(miss)
        changes.append(change)
    summary = (f"no phrase is listed at these settings; the closest is {phrase!r} ({count} uses in {docs} texts): "
               + "; ".join(misses) + ". It would be listed with " + " and ".join(changes) + ".")
    low = None if math.isnan(sc.lang[g]) else float(sc.lang_low[g])
    return {"phrase": phrase, "n": lv.n, "z": float(sc.z[g]), "log_odds": float(sc.delta[g]), "lang_ratio_low": low,
            "model_count": count, "model_docs": docs, "misses": misses, "changes": changes, "summary": summary}
