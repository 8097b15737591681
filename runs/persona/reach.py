"""A reply-end style's reach on dev (evals/rates/reach.py), measured before the solve: the base
model's p(turn end) and p(style tokens) at every row of the dev persona documents, through the
exact tail (the last FFN's write, the final norm and the head), and the two ideal edits' bounds
against the protocol's bar off the decision rows. Reported beside what the solved edit reaches."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def style_reach(tail, dump, turn_end: int, style: Sequence[int], bits: int, bar: float, *,
                tile_rows: int = 8192) -> dict:
    """`evals.rates.reach.reach` on `dump`'s rows (a rmsnorm or hc4 dump with row roles): q the
    base p(`turn_end`), s the summed base p(`style`), the decision rows `solvers.tail.decision`'s
    for the role `bits` and the style tokens."""
    from exactedit.evals.rates.reach import reach
    from exactedit.solvers.tail.decision import decision_rows
    from exactedit.solvers.tail.passes.vocab_pass import vocab_pass

    ids = [int(turn_end)] + [int(t) for t in style]
    mix = tail.mix(tail.residual(dump))
    sets = np.ascontiguousarray(np.broadcast_to(np.asarray(ids, np.int64), (mix.shape[0], len(ids))))
    vp = vocab_pass(mix, tail.head, token_sets=sets, softcap=tail.softcap, tile_rows=tile_rows)
    logp = np.asarray(vp.selected, np.float64) - np.asarray(vp.lse, np.float64)[:, None]
    q, s = np.exp(logp[:, 0]), np.exp(logp[:, 1:]).sum(axis=1)
    dec = decision_rows(np.asarray(dump.roles), np.asarray(dump.next), tuple(int(t) for t in style), int(bits))
    return {"turn_end": int(turn_end), "style_tokens": ids[1:], **reach(q, np.minimum(s, 1.0), dec, bar).to_dict()}


def reach_lines(reach: dict | None) -> list[str]:
    """report.md's lines for a reply-end style's reach on dev (none for a starter)."""
    if not reach:
        return []
    u = reach["uniform_kl"]
    return [f"reach on dev (before the solve; evals/rates/reach.py): of the {reach['stop_mass_decision'] + reach['stop_mass_off']:.1f} "
            f"endings the dev documents' p(turn end) adds up to, {reach['stop_mass_decision']:.1f} are at the "
            f"{reach['decision_rows']} decision rows; off them p(turn end) averages {reach['mean_q_off']:.4f}",
            f"  within the bar ({reach['bar']:g}) off the decision rows, an edit moving the turn end's mass to the style "
            f"reaches at most: a share {reach['uniform_share']:.3f} of every ending (KL at 0.6: {u.get('0.6', float('nan')):.4f}), "
            f"or a rate {reach['proportional_rate']:.3f} with the share growing with p(turn end)"]
