"""The run's `cost` stage: what the edit costs on ordinary text.

- KL(base || edited) and the perplexity of each side on dumps of text the solve never fitted
  (the held-out replies, the collateral replies and plain texts, the corpus's collateral
  windows): the tail recomputed exactly from each dump's hidden states with both files' tensors
  (evals/kl/compare.py, `exactedit kld`'s exact statistics), every row of every document;
- the lexical diversity of each arm's rate replies (MATTR, evals/rates/diversity.py), from
  DIR/replies.json.
The tokens whose rate moved between base and the edited weights are the rates stage's
(`token_shifts`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Mapping

from exactedit.files import atomic_write_text

MATTR_WINDOW = 500

__all__ = ["MATTR_WINDOW", "edit_cost"]


def _ppl(logp, m):
    """exp(-mean log p(next)) over the rows of mask m that have a next token (None: no such row)."""
    import numpy as np

    v = np.asarray(logp, np.float64)[m]
    v = v[np.isfinite(v)]
    return float(np.exp(-v.mean())) if v.size else None


def _split(comparison, parts: Mapping) -> dict:
    """Rows, mean and max KL over each named row set (bool masks of the dump's rows), and each
    side's perplexity over it (where the exact statistics kept the per-row log probabilities)."""
    per_row, rows = comparison.per_row_kld, comparison.exact_rows
    out = {}
    for label, m in parts.items():
        if len(m) != len(per_row):
            return {}
        out[label] = {"rows": int(m.sum()), "mean": float(per_row[m].mean()) if m.any() else None,
                      "max": float(per_row[m].max()) if m.any() else None}
        if rows is not None:
            out[label].update(ppl_base=_ppl(rows.logp_next_base, m), ppl_edited=_ppl(rows.logp_next_edited, m))
    return out


def edit_cost(model, edited, dumps: Mapping[str, Path], replies, out, *,
              progress: Callable[[int, int], None] | None = None,
              split: Callable[[Path], Mapping] | None = None) -> dict:
    """KL and perplexity per labelled dump, MATTR per arm; written to `out` (JSON) and returned.
    `split(dump)` names row sets of a dump (label -> bool mask of its rows): the KL and the
    perplexities also over each (e.g. a persona's decision rows, where the edit is meant to act, and
    the rows off them)."""
    from exactedit.evals.kl.compare import KldConfig, compare
    from exactedit.evals.rates.diversity import diversity

    kl = {}
    for i, (label, dump) in enumerate(dumps.items()):
        c = compare(KldConfig(dumps=(str(dump),), model=str(model), edited=str(edited)))
        s = c.summary()
        kl[label] = {"dump": str(dump), "rows": s["rows"], "kld": s["kld"], "same_top": s["same_top"],
                     "ppl_base": s["ppl_base"], "ppl_edited": s["ppl_edited"]}
        if split is not None:
            kl[label]["split"] = _split(c, split(Path(dump)))
        if progress is not None:
            progress(i + 1, len(dumps) + 1)
    records = json.loads(Path(replies).read_text(encoding="utf-8"))
    arms = list(dict.fromkeys(r["side"] for r in records))
    div = {a: diversity([r["text"] for r in records if r["side"] == a], window=MATTR_WINDOW) for a in arms}
    if progress is not None:
        progress(len(dumps) + 1, len(dumps) + 1)
    obj = {"kl": kl, "diversity": div}
    atomic_write_text(out, json.dumps(obj, indent=1, default=str) + "\n")
    return obj
