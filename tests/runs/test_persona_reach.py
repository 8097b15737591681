"""A reply-end style's reach on dev (runs/persona/reach.py) on the synthetic gated world: p(turn end)
and p(style tokens) per row are the float64 reference forward's (the last FFN's write, the final
norm, the whole head, a softmax), the decision rows the KL bar's, and the bounds those of
evals/rates/reach.py on them; report.md's lines name them."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.dumps import read_dump
from exactedit.dumps.format import ROLE_REPLY_END
from exactedit.evals.rates.reach import reach
from exactedit.quant import gguf
from exactedit.runs.persona.reach import reach_lines, style_reach
from exactedit.solvers.tail.decision import decision_rows
from exactedit.solvers.tail.forward.head_ref import logits_ref
from exactedit.solvers.tail.model import load_tail
from tests.solvers.l47.synth import build_world


def test_style_reach_is_the_reference_forwards_bound(tmp_path):
    w = build_world(tmp_path, tail="gated")
    g = gguf.open(w["model"])            # open while the tail's head is read
    tail = load_tail(g)
    head = g.read_rows(tail.spec.names["head"])
    d = read_dump(w["heldout"])
    assert (np.asarray(d.roles) & ROLE_REPLY_END).any()
    turn_end = int(np.asarray(d.next)[np.flatnonzero(np.asarray(d.roles) & ROLE_REPLY_END)[0]])
    style = [t for t in range(tail.spec.vocab) if tail.tokens.piece(t).strip() in ("we", "go")]
    got = style_reach(tail, d, turn_end, style, ROLE_REPLY_END, 0.005, tile_rows=64)

    mix = tail.mix(tail.residual(d, reference=True), reference=True)
    logits = logits_ref(mix, head, tail.softcap)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dec = decision_rows(np.asarray(d.roles), np.asarray(d.next), tuple(style), ROLE_REPLY_END)
    want = reach(p[:, turn_end], p[:, style].sum(1), dec, 0.005)
    assert got["turn_end"] == turn_end and got["style_tokens"] == style
    assert got["decision_rows"] == want.decision_rows == int(dec.sum()) > 0
    for key in ("stop_mass_decision", "stop_mass_off", "mean_q_off", "uniform_share", "proportional_rate"):
        assert got[key] == pytest.approx(getattr(want, key), rel=1e-4, abs=1e-7), key
    text = "\n".join(reach_lines(got))
    assert f"{got['uniform_share']:.3f}" in text and f"{got['proportional_rate']:.3f}" in text
    assert reach_lines(None) == []
