"""One source of truth for the phrase tuples: under a protocol that lists them, `solve wfld` solves
on exactly the protocol's tuples (not what the matcher finds of the phrases file in every dump), and
`eval score` of its bundle reads the same tuples and finds the same positions."""
from __future__ import annotations

import json

import pytest

from exactedit.dumps import read_dump
from exactedit.evals.protocol.protocol import SplitRule, TokenSets, Trace, resolve_tokens, write_protocol
from exactedit.runs.eval import workflow
from exactedit.runs.solve.wfld import WfldInputs, solve_wfld
from exactedit.evals.scoring.evaluate import ScoreConfig
from exactedit.quant import gguf
from exactedit.solvers.tail.model import load_tail
from exactedit.solvers.l47.config import WfldConfig, WfldError
from exactedit.solvers.phrases import load_phrases
from exactedit.solvers.l47.mining import mine
from tests.solvers.l47.synth import SPECIALS, Ids, build_world

CFG = WfldConfig(gn_iters=1, special_rows=32, tile_rows=64)


def _protocol(path, w, tuples):
    ids = Ids()
    traces = [Trace(name, w[name].resolve(), role, domain) for name, role, domain in
              (("train", "train", ""), ("heldout", "dev", ""), ("collateral", "collateral", ""),
               ("anchors", "anchors", "anchors"))]
    return write_protocol(path, "wfld-tuples", traces, split=SplitRule(),
                          tokens=TokenSets(specials=tuple(ids(*SPECIALS)), turn_end=ids("<|im_end|>")[0],
                                           phrases=tuple(tuples)))


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    root = tmp_path_factory.mktemp("tuples")
    w = build_world(root)
    tail = load_tail(gguf.open(w["model"]))
    phrases = load_phrases(w["phrases"])
    everything = mine({n: read_dump(w[n]) for n in ("train", "heldout", "collateral", "anchors")}, phrases,
                      tail.tokens)
    # the protocol lists fewer tuples than the matcher finds ("right away" left out), in reverse order
    tuples = tuple(t for t, p in zip(everything.tuples, everything.tuple_phrase) if p != 2)[::-1]
    assert 0 < len(tuples) < len(everything.tuples)
    protocol = _protocol(root / "protocol.toml", w, tuples)
    ws = root / "ws"
    workflow.register(protocol.path, ws, "register")
    workflow.split(protocol.path, ws, "split")
    inputs = WfldInputs(str(w["model"]), str(w["phrases"]), (str(w["train"]),), (str(w["heldout"]),),
                        (str(w["collateral"]),), (str(w["anchors"]),), protocol=str(protocol.path))
    res = solve_wfld(CFG, inputs, root / "wfld", workspace=ws, command="solve")
    dev = workflow.score(protocol.path, ws, w["model"], root / "dev", "score", bundle=res.bundle,
                         config=ScoreConfig(heldout_role="dev", bars="anti-slop"))
    return dict(w=w, tail=tail, protocol=protocol, tuples=tuples, everything=everything, res=res, dev=dev)


def test_solve_and_score_see_the_same_tuples(solved):
    res, dev, protocol = solved["res"], solved["dev"], solved["protocol"]
    want = resolve_tokens(protocol, [solved["tail"].tokens.piece(i) for i in range(solved["tail"].spec.vocab)])
    assert want.phrases == solved["tuples"]
    assert res.mining.tuples == want.phrases                                     # solve: the protocol's
    assert tuple(p.tokens for p in dev.report.phrases) == want.phrases          # score: the same, same order
    assert set(res.mining.words) == set(want.collateral_words)
    report = json.loads((res.bundle / "report.json").read_text())
    assert [tuple(t) for t in report["mining"]["tuples"]] == list(want.phrases)
    assert not any(p == 2 for tm in res.mining.traces.values() for p in tm.phrase)   # no "right away" target


def test_solve_and_score_find_the_same_positions(solved):
    """Same tuples, same positions: the bars both compute on them count the same rows (train
    positions solved on, the same-document held-out share, the dev documents)."""
    res, dev = solved["res"], solved["dev"]
    solve_bars = {b.key: b for b in res.bars}
    for key in ("a_reduction", "b_reduction", "c_reduction"):
        assert solve_bars[key].n == dev.report.row(key).n, key
    assert solve_bars["c_reduction"].n > 0
    heldout = res.mining.trace("heldout:heldout")
    assert heldout.rows.size == sum(p.n for p in dev.report.phrases)


def test_a_protocol_tuple_outside_the_phrases_file_is_refused(solved, tmp_path):
    w = solved["w"]
    ids = Ids()
    protocol = _protocol(tmp_path / "p.toml", w, solved["tuples"] + (tuple(ids(" the", " end")),))
    ws = tmp_path / "ws"
    workflow.register(protocol.path, ws, "register")
    inputs = WfldInputs(str(w["model"]), str(w["phrases"]), (str(w["train"]),), (str(w["heldout"]),),
                        (str(w["collateral"]),), (str(w["anchors"]),), protocol=str(protocol.path))
    with pytest.raises(WfldError, match=r"tokens\.phrases.*no form of the phrases"):
        solve_wfld(CFG, inputs, tmp_path / "wfld", workspace=ws, command="solve")



def test_the_strength_search_shows_progress_inside_its_stage():
    """solve wfld's stage counter: a search's dev points show as more steps of a grown total,
    without marking a stage (a 21-phrase gated search sat at "9/9" for most of an hour)."""
    from exactedit.runs.solve.wfld import _Stages

    seen = []
    st = _Stages(9, lambda d, t: seen.append((d, t)))
    st.mark("open")
    st.within(4, 61)
    st.within(9, 58)
    st.mark("strength")
    assert seen == [(1, 9), (5, 70), (10, 67), (2, 9)] and set(st.timings) == {"open", "strength"}
