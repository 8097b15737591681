"""The protocol shipped with the bundled fixture: it parses, its tokens exist in the model's table,
its split follows the dumps' roles, and a scoring run gives the planted positions their bars."""
from __future__ import annotations

from pathlib import Path

import pytest

from exactedit.runs.eval import workflow
from exactedit.evals.scoring.evaluate import ScoreConfig
from exactedit.evals.protocol.protocol import load_protocol, resolve_tokens

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "default"
pytestmark = pytest.mark.skipif(not (FIXTURE / "model.gguf").exists(), reason="the default fixture is not built")


def test_protocol_matches_the_fixture():
    from exactedit.quant import gguf
    from exactedit.solvers.tail.model import load_tail

    p = load_protocol(FIXTURE / "protocol.toml")
    assert all(t.path.is_dir() for t in p.traces)
    with gguf.open(FIXTURE / "model.gguf") as g:
        tail = load_tail(g)
        texts = [tail.tokens.piece(i) for i in range(tail.spec.vocab)]
    r = resolve_tokens(p, texts)
    phrases = [line for line in (FIXTURE / "phrases.txt").read_text().splitlines() if line.strip()]
    assert ["".join(texts[t] for t in ph).strip() for ph in r.phrases] == phrases
    assert len(r.style) == 16 and r.turn_end in r.specials


def test_split_and_prefix_penalty_on_the_fixture(tmp_path):
    ws = tmp_path / "ws"
    workflow.register(FIXTURE / "protocol.toml", ws, "register")
    sp = workflow.split(FIXTURE / "protocol.toml", ws, "split")
    assert {d.trace for d in sp.splits.docs if d.role == "dev"} == {"dev"}
    assert sp.splits.counts() == {"train": 4, "dev": 2, "test": 2, "blind": 1, "anchors": 2, "collateral": 1}
    r = workflow.score(FIXTURE / "protocol.toml", ws, FIXTURE / "model.gguf", tmp_path / "out", "score",
                       config=ScoreConfig(shapes=("prefix-penalty=6",))).report
    a, b = r.row("a_reduction"), r.row("b_reduction")
    assert (a.n, b.n) == (4, 2)  # six planted train positions, a third held out for (b)
    assert a.number > 0.98 and b.number > 0.98  # p e^-6 / (1 - p + p e^-6) for p ~ 0.5-0.77
    d_rows = [x for x in r.rows if x.key.startswith("d_mean:")]
    assert len(d_rows) == 3 and all(x.n == 2 and x.number == 0.0 for x in d_rows)  # legit uses untouched
    c = r.row("c_reduction")  # the dev assistant chat plants each phrase once
    assert c.n == 3 and c.number > 0.98 and c.passed is True
    assert r.row("c_new_special").number == 0
    assert r.row("g_kld").passed and r.row("f_flips").number == 0
