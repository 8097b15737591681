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


def _without_meta(report):
    from exactedit.evals.scoring.report import report_to_json

    out = report_to_json(report)
    out.pop("meta")
    return out


def _close(a, b, path=""):
    """Equal structure and strings; numbers within ROW_TOL relative or 1e-6 absolute (a bar that is a
    difference of two means, a cut near 0, has no relative resolution)."""
    import math

    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(a, bool):
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=ROW_TOL, abs_tol=1e-6), (path, a, b)
    else:
        assert a == b, (path, a, b)


# The solve's rescore and `eval score` make the same pass (tail forward, one numba KL pass over the
# head) over different row batches: the vocabulary is tiled by the batch's size (vocab_pass.tile_size)
# and OpenBLAS rounds a row by its position in the product, so the float64 sums of float32 logits
# differ in their last bits (3e-7 relative here): the tolerance is float32's resolution, with room.
ROW_TOL = 1e-5


def test_eval_score_reads_the_solves_rows_with_the_same_result(solved, tmp_path):
    """`eval score` of the bundle with the rows its solve's rescore scored (KnownRows, what
    `exactedit antislop` hands on) gives the rows and the report of its own pass, within float32's
    rounding, with the same verdicts and counts; the report says where its rows came from."""
    import numpy as np

    from exactedit.evals.protocol.ledger import Ledger
    from exactedit.evals.protocol.protocol import load_protocol
    from exactedit.evals.scoring.evaluate import protocol_traces, score_traces
    from exactedit.runs.eval.workflow import _splits_or_error, edited_model
    from exactedit.solvers.tail.scores import RowScores

    res, dev = solved["res"], solved["dev"]
    ws = solved["w"]["model"].parent / "ws"
    assert res.known is not None and res.known.bundle_sha256 == res.bundle_sha256
    again = workflow.score(solved["protocol"].path, ws, solved["w"]["model"], tmp_path / "dev", "score",
                           bundle=res.bundle, config=ScoreConfig(heldout_role="dev", bars="anti-slop"),
                           known=res.known)
    assert "rows_from" in again.report.meta and "rows_from" not in dev.report.meta
    assert again.report.verdict == dev.report.verdict
    assert [(r.key, r.n, r.passed) for r in again.report.rows] == [(r.key, r.n, r.passed) for r in dev.report.rows]
    _close(_without_meta(dev.report), _without_meta(again.report))
    # the rows themselves, field by field
    protocol = load_protocol(solved["protocol"].path)
    with Ledger.open(ws) as ledger:
        splits = _splits_or_error(ledger, protocol)
    traces = protocol_traces(protocol, splits, "dev")
    with edited_model(solved["w"]["model"], res.bundle, tmp_path / "w2") as (path, _):
        own = score_traces(protocol, solved["w"]["model"], traces, ScoreConfig(), edited=path).scores
        read = score_traces(protocol, solved["w"]["model"], traces, ScoreConfig(), edited=path,
                            known=res.known).scores
    assert own.rows == read.rows > 0
    for f in RowScores.__dataclass_fields__:
        x, y = getattr(own, f), getattr(read, f)
        if f in ("logp_base", "logp_edit", "kl", "p_special_base", "p_special_edit"):
            np.testing.assert_allclose(y, x, rtol=ROW_TOL, atol=1e-9, err_msg=f)
        elif isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y, err_msg=f)
        else:
            assert x == y, f


def test_eval_score_refuses_rows_of_another_bundle_or_dump(solved, tmp_path):
    import dataclasses

    import numpy as np

    from exactedit.evals.scoring.evaluate import EvalError

    res = solved["res"]
    ws = solved["w"]["model"].parent / "ws"
    run = lambda known: workflow.score(solved["protocol"].path, ws, solved["w"]["model"], tmp_path / "o", "score",  # noqa: E731
                                       bundle=res.bundle, known=known)
    with pytest.raises(EvalError, match="not of"):
        run(dataclasses.replace(res.known, bundle_sha256="0" * 64))
    with pytest.raises(EvalError, match="another model"):
        run(dataclasses.replace(res.known, model_sha256="0" * 64))
    sha, rows = next(iter(res.known.dumps.items()))
    short = rows.take(np.arange(rows.rows - 1), rows.doc[:-1], rows.docs)
    with pytest.raises(EvalError, match="not its rows"):
        run(dataclasses.replace(res.known, dumps={**res.known.dumps, sha: short}))
