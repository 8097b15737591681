"""The head solver's one entry, `solvers.head.solve_rows`, on its own: gathered rows in, the stopping
rule handed in as any object with `every`, `max_steps`, `metric` and `choose` (no protocol, no
ledger), the trajectory, the chosen step's shipped edit and its scores out."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from exactedit.evals.protocol.protocol import load_protocol, resolve_tokens
from exactedit.evals.protocol.splits import build_splits
from exactedit.quant import gguf
from exactedit.runs.solve.head_inputs import gather_inputs
from exactedit.solvers.head import (
    EditSet, HeadInputs, HeadRowsResult, HeadSolveConfig, gather_head_rows, load_head_rows, solve_rows,
)
from tests.solvers.head.test_solve import make_tiny, protocol_file


@dataclass
class _Rule:
    """A stopping rule that is not the protocol's: ship the step `pick` returns; records its calls."""

    pick: object
    every: int = 5
    max_steps: int = 10
    metric: str = "style"
    calls: list = field(default_factory=list)

    def choose(self, steps, train_gain, dev_gain, *, dev_kl_off=None):
        self.calls.append((list(steps), list(train_gain), list(dev_gain)))
        return self.pick(steps)


@pytest.fixture(scope="module")
def gathered(tmp_path_factory):
    """(tail's spec, inputs, dev rows), gathered once; the GGUF stays open for the module."""
    from exactedit.dumps.reader import load_manifest
    from exactedit.solvers.tail.model import load_tail

    root = make_tiny(tmp_path_factory.mktemp("tiny_rows"))
    proto = load_protocol(protocol_file(root, "rows", register=False))
    splits = build_splits(proto, {t.name: load_manifest(t.path).docs for t in proto.traces})
    with gguf.open(root / "model.gguf") as g:
        tail = load_tail(g)
        vocab = [tail.tokens.piece(i) for i in range(tail.spec.vocab)]
        tok = resolve_tokens(proto, vocab)
        given = gather_inputs(proto, splits, {"train": [root / "persona"], "dev": [root / "persona"]},
                              tail.dump_expect())
        edit = EditSet(tok.style[:4], "explicit")
        sel = tuple(dict.fromkeys([*tok.specials, tok.turn_end]))

        def rows(role_rows):
            return gather_head_rows(tail, role_rows, edit.ids, sel, 64, lambda size: None)

        train, dev = rows(given["train"]), rows(given["dev"])
        anchors = tuple((rr.trace, rows([rr])) for rr in given["anchors"])
        head = load_head_rows(g, tail.spec.names["head"], edit.ids, runtime=tail.head.runtime)
        yield HeadInputs(tail=tail, train=train, dev=dev, anchors=anchors, edit=edit, style=tok.style,
                         specials=tok.specials, turn_end=tok.turn_end, openers=(), closers=(), head=head)


CFG = HeadSolveConfig(rank=1, null_k=8, lr=0.01)


def test_the_handed_in_rule_picks_the_shipped_step(gathered):
    rule, ticks = _Rule(lambda steps: steps[-1]), []
    r = solve_rows(gathered, CFG, stopping=rule, progress=lambda done, total: ticks.append((done, total)))
    assert isinstance(r, HeadRowsResult)
    assert [c.step for c in r.trajectory] == [0, 5, 10] and len(r.losses) == 10 and ticks[-1] == (10, 10)
    (steps, train, dev), = rule.calls
    assert steps == [0, 5, 10] and train == [c.train.style for c in r.trajectory]
    assert dev == [c.dev.style for c in r.trajectory]
    assert r.chosen_step == 10 and r.has_edit and int(r.shipped.changed.sum()) == r.trajectory[-1].rows_changed
    assert r.splits[0].gains.style == pytest.approx(r.trajectory[-1].train.style)
    assert [s.name for s in r.splits] == ["train", "dev"] and [s.name for s in r.anchors] == ["plain"]
    assert len(r.row_scores) == 3 and r.term_rows["anchor"] > 0 and 0 < r.anchor_energy_kept <= 1
    report, part = r.score_rows("dev", gathered.dev)
    assert report == r.splits[1] and np.array_equal(part.kl, r.row_scores[1].kl)


def test_no_step_chosen_ships_the_zero_edit(gathered):
    r = solve_rows(gathered, CFG, stopping=_Rule(lambda steps: None))
    assert r.chosen_step is None and not r.has_edit and not r.shipped.dw.any() and r.edit_norm_ratio == 0.0
    assert all(s.kl_mean == 0.0 for s in (*r.splits, *r.anchors))
