"""Issue item 9, on the bundled fixture (fixtures/default): the documented behaviour of head edits.

- A full-rank edit of S drives the train style loss far down while dev does not follow: the
  dev/train gain ratio falls as the steps go on (it fits the train contexts, not the voice).
- A rank-1 edit, stopped early by the protocol's rule, keeps the KL on the anchor traces and on dev
  <= 0.005 and flips no argmax to a special token.
The protocols here are written for the test (pre-registered in a temporary ledger); S is the train
split's most frequent style tokens (the fixture's kaomoji), as the protocol's rule says.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exactedit import fixtures
from exactedit.evals.protocol.ledger import Ledger, register_protocol
from exactedit.evals.protocol.protocol import load_protocol
from exactedit.evals.protocol.splits import build_splits, record_splits
from tests.fixturegen.vocab import KAOMOJI
from exactedit.solvers.head.config import HeadSolveConfig
from exactedit.runs.solve.head import solve_head

FIXTURE = Path(fixtures.__file__).parent / "default"


def _protocol(root: Path, name: str, max_steps: int, min_ratio: float) -> Path:
    traces = "".join(f'[[traces]]\nname = "{t}"\npath = "{FIXTURE / "dumps" / t}"\nrole = "{t}"\n'
                     for t in ("train", "dev", "test", "anchors"))
    text = (f'name = "{name}"\n{traces}[stopping]\nevery = 5\nmax_steps = {max_steps}\nmetric = "style"\n'
            f'min_ratio = {min_ratio}\n[edit_set]\nrule = "top-train-style"\ncount = 16\n'
            f'[tokens]\nstyle = {json.dumps(list(KAOMOJI), ensure_ascii=False)}\n')
    path = root / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    proto = load_protocol(path)
    from exactedit.dumps.reader import load_manifest

    with Ledger.open(root / "ws") as ledger:
        record = register_protocol(ledger, proto, "test")
        splits = build_splits(proto, {t.name: load_manifest(t.path).docs for t in proto.traces})
        record_splits(ledger, record, splits, "test", {})
    return path


def _solve(root: Path, proto: Path, **kw):
    d = FIXTURE / "dumps"
    return solve_head(HeadSolveConfig(lr=1e-3, null_k=32, **kw), model=FIXTURE / "model.gguf", train=[d / "train"],
                      dev=[d / "dev"], protocol=proto, workspace=root / "ws")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("fixture-head")


def test_full_rank_fits_train_while_dev_does_not_follow(root):
    r = _solve(root, _protocol(root, "full-rank", max_steps=120, min_ratio=0.75), rank=0)
    traj = r.trajectory
    assert r.config.rank == 0 and r.n_params == len(r.edit_set.ids) * 256
    first, last = traj[0], traj[-1]
    assert last.terms.nll < first.terms.nll                   # the train loss goes down ...
    assert last.train.style > 1.5                            # ... by > 1.5 nats per train style token
    assert last.dev.style < 0.1 * last.train.style           # dev does not follow
    ratios = [c.ratio for c in traj if np.isfinite(c.ratio)]
    assert max(ratios[:4]) > last.ratio + 0.1                # the ratio falls with the steps
    assert last.dev_kl > 0.005                               # and the long fit leaks into dev
    assert r.chosen_step is None and not r.shipped_edit      # the registered rule ships no edit


def test_rank1_early_stopped_keeps_kl_and_specials(root):
    r = _solve(root, _protocol(root, "rank1-early", max_steps=60, min_ratio=0.2), rank=1)
    assert r.chosen_step is not None and r.shipped_edit and r.rows_changed >= 1
    assert r.n_params == len(r.edit_set.ids) + 256
    chosen = next(c for c in r.trajectory if c.step == r.chosen_step)
    assert chosen.train.style > 0 and chosen.dev.style > 0 and chosen.ratio >= 0.2
    assert {s.name for s in r.anchors} == {"anchors"}
    for s in r.anchors:
        assert s.kl_mean <= 0.005 and s.special_flips == 0
    train, dev = r.splits
    assert dev.kl_mean <= 0.005
    assert train.special_flips == 0 and dev.special_flips == 0
    assert abs(dev.turn_end_p_edit - dev.turn_end_p_base) < 0.05   # p(<|im_end|>) at real turn ends kept
