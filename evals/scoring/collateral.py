"""Bar (d) use by use: each legitimate use of a banned word in the collateral documents, with its
base probability, its change and where it stands, so a reader can tell a lost use (a likely word
the edit pushed down) from drift on a word the model barely gave there.

Reported beside the bar, never instead of it: the bar's pass stays SPEC's (mean dlogp and share
below `collateral_low`). The split by base probability uses `rare_below` (default 0.2, the level
below which docs/real-model.md found every failing " an" use of the Qwen demo to lie) only to
count; it changes no verdict.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from exactedit.evals.scoring.bars import chat_docs
from exactedit.solvers.tail.scores import RowScores, slop_positions, word_positions


def collateral_uses(s: RowScores, phrases: Sequence[Sequence[int]], words: Sequence[int], name,
                    vocab: Sequence[str] = (), *, low: float = -0.10, rare_below: float = 0.2,
                    context: int = 6) -> list[dict]:
    """Per word (in `words`' order): its uses in `collateral` documents, worst first, and counts of
    low uses (dlogp < `low`) among likely and rare ones (base p >= or < `rare_below`), by domain.
    `name(id)` labels a token; `vocab[id]` (when given) decodes the context."""
    slop = slop_positions(s, phrases)
    at = word_positions(s, words, slop)
    coll = np.isin(s.doc_roles(), ["collateral"])
    first_docs, first_rows = np.unique(s.doc, return_index=True)
    starts = {int(d): int(r) for d, r in zip(first_docs, first_rows)}
    dl, pb, chat = s.dlogp, np.exp(s.logp_base), chat_docs(s)
    out = []
    for wi, w in enumerate(words):
        rows = np.flatnonzero(coll & (at == wi))
        uses = []
        for r in rows[np.argsort(dl[rows], kind="stable")]:
            d = int(s.doc[r])
            lo = max(starts[d], int(r) - context + 1)
            ctx_text = "".join(vocab[int(t)] for t in s.tokens[lo:r + 1]) if len(vocab) else ""
            uses.append({"doc": s.docs[d].name, "row": int(r) - starts[d], "chat": bool(chat[d]),
                         "p_base": float(pb[r]), "dlogp": float(dl[r]), "context": ctx_text})
        counts = {}
        for kind, pick in (("likely", lambda u: u["p_base"] >= rare_below), ("rare", lambda u: u["p_base"] < rare_below)):
            sel = [u for u in uses if pick(u)]
            counts[kind] = {"uses": len(sel), "low": sum(u["dlogp"] < low for u in sel),
                            "low_chat": sum(u["dlogp"] < low and u["chat"] for u in sel),
                            "mean_dlogp": float(np.mean([u["dlogp"] for u in sel])) if sel else None}
        out.append({"word": name(int(w)), "id": int(w), "low": low, "rare_below": rare_below,
                    "by_base_p": counts, "uses": uses})
    return out


def collateral_lines(table: Sequence[dict], worst: int = 5) -> list[str]:
    """A heading, then each word's summary and its worst uses, for a text report (none for no words)."""
    lines = ["bar (d) use by use (collateral documents, worst first):"] if table else []
    for t in table:
        c = t["by_base_p"]
        lines.append(f"  {t['word']}: {len(t['uses'])} uses; below {t['low']}: {c['likely']['low']} of "
                     f"{c['likely']['uses']} with base p >= {t['rare_below']}, {c['rare']['low']} of "
                     f"{c['rare']['uses']} rarer ({c['rare']['low_chat']} of those in chat)")
        for u in t["uses"][:worst]:
            where = "chat" if u["chat"] else "plain"
            lines.append(f"    dlogp {u['dlogp']:+.3f}  p {u['p_base']:.3f}  {where:5} {u['context']!r}")
    return lines
