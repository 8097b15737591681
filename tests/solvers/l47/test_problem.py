"""The WFLD problem (solvers/l47/problem.py) and its solve (solvers/l47/solve.py) against what
`solve wfld`'s driver computed inline before they were carved out of it: `_former_inline` below is
that code, kept as the reference; the problem must give the same arrays bit for bit, and solving it
the same bytes as the driver's bundle."""
from __future__ import annotations

import json

import numpy as np
import pytest

from exactedit.dumps import read_dump
from exactedit.runs.solve.wfld import WfldInputs, _heldout_mask, _open_traces, _resolve_specials, solve_wfld
from exactedit.quant import gguf
from exactedit.solvers.bundle import read_bundle
from exactedit.solvers.phrases import TokenBytes
from exactedit.solvers.tail.model import load_tail
from exactedit.solvers.tail.passes.vocab_pass import vocab_pass
from exactedit.solvers.l47 import alternatives as alt_mod
from exactedit.solvers.l47 import gauss_newton as wfld
from exactedit.solvers.l47 import ship as ship_mod
from exactedit.solvers.l47.config import WfldConfig, WfldError
from exactedit.solvers.l47.jacobian import editable_weight, gather_rows, linearize, with_weights
from exactedit.solvers.phrases import load_phrases
from exactedit.solvers.l47.mining import mine
from exactedit.solvers.l47.problem import anchor_rows, background_rows, build_problem, ftpo_rows, uses_by_word
from exactedit.solvers.l47.solve import null_summary, solve, summaries
from tests.solvers.l47.synth import build_world

CFG = WfldConfig(gn_iters=2, special_rows=48, tile_rows=64, background="anchors+train")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("problem")
    w = build_world(root)
    inputs = WfldInputs(str(w["model"]), str(w["phrases"]), (str(w["train"]),), (str(w["heldout"]),),
                        (str(w["collateral"]),), (str(w["anchors"]),))
    g = gguf.open(w["model"])
    tail = load_tail(g)
    traces = _open_traces(inputs, tail)
    specials, _ = _resolve_specials(g, tail, None, CFG)
    phrases = load_phrases(w["phrases"])
    mining = mine({t.name: t.dump for t in traces}, phrases, tail.tokens, capitalized=CFG.capitalized)
    by_role = {r: [t for t in traces if t.role == r] for r in ("train", "heldout", "collateral", "anchors", "null")}
    held = {t.name: _heldout_mask(t, mining.trace(t.name), mining.tuples, CFG) for t in by_role["train"]}
    named = {r: [(t.name, t.dump) for t in ts] for r, ts in by_role.items()}
    tensor = tail.spec.names["ffn_down"]
    info = g.tensor(tensor)
    ftpo = ftpo_rows(named["train"], mining, held)
    marks = []
    problem = build_problem(CFG, tail, ftpo, mining, specials=specials, phrases=phrases, anchors=named["anchors"],
                            held_from=named["train"] + named["null"],
                            background_from=named["anchors"] + named["train"], raw0=g.read_raw(tensor),
                            type_name=info.type_name, cols=info.cols, mark=marks.append)
    return dict(w=w, inputs=inputs, g=g, tail=tail, by_role=by_role, named=named, specials=specials, phrases=phrases,
                mining=mining, held=held, info=info, tensor=tensor, problem=problem, marks=marks, root=root)


def _former_inline(g, tail, by_role, mining, held, specials, phrases, cfg):
    """The driver's inline build, as it read before the carve (runs/solve/wfld.py)."""
    w0 = editable_weight(tail)
    tensor = tail.spec.names["ffn_down"]
    info = g.tensor(tensor)
    blocks, rej, phr = [], [], []
    for t in by_role["train"]:
        tm = mining.trace(t.name)
        keep = ~held[t.name]
        blocks.append((t.dump, tm.rows[keep]))
        rej.append(np.asarray(t.dump.next)[tm.rows[keep]])
        phr.append(tm.phrase[keep])
    rej, phr = np.concatenate(rej).astype(np.int64), np.concatenate(phr)
    rs_t = gather_rows(blocks)
    mix_t = tail.mix(tail.residual(rs_t))
    pool = max(cfg.alt_pool, cfg.alternatives + len(specials) + 1)
    vp = vocab_pass(mix_t, tail.head, topk=pool, softcap=tail.softcap, tile_rows=cfg.tile_rows)
    tb = TokenBytes(tail.tokens)
    sense = {ph: alt_mod.same_sense_ids(ws, tb, tail.spec.vocab) for ph, ws in cfg.same_sense}
    alts = alt_mod.choose(vp.topk_ids, vp.topk_logits, vp.lse, rej, specials, cfg.alternatives, cfg.alt_floor,
                          tb, [sense.get(phrases[p], frozenset()) for p in phr] if sense else None)
    a_blocks = anchor_rows(tail, [t.dump for t in by_role["anchors"]], specials, cfg.special_rows)
    rs = gather_rows(blocks + a_blocks)
    P, s_n, k, m = rej.size, len(specials), cfg.alternatives, alts.variants.shape[1]
    tok = np.full((rs.rows, 1 + k + s_n + m), -1, dtype=np.int64)
    tok[:P, 0], tok[:P, 1:1 + k], tok[:P, 1 + k:1 + k + s_n] = rej, alts.ids, specials
    tok[:P, 1 + k + s_n:] = alts.variants
    tok[P:, :s_n] = specials
    slot, col = wfld.condition_layout(tok)
    kind = np.where(slot >= P, wfld.SPECIAL_ANCHOR,
                    np.select([col == 0, col <= k, col <= k + s_n],
                              [wfld.REJECTED, wfld.ALTERNATIVE, wfld.SPECIAL_TARGET], wfld.VARIANT))
    lin = linearize(with_weights(tail, w0), rs, tok, backend=cfg.backend, head_cache={})
    base = wfld.Evaluation(lin.logits[slot, col], lin.u[slot, col])
    base_tab = np.full(tok.shape, np.nan)
    base_tab[slot, col] = base.logits
    margins = np.array([cfg.margin_for(phrases[p]) for p in phr])
    d_rej, d_alt = wfld.ftpo_targets(base_tab[:P, 0], base_tab[:P, 1:1 + k], margins, cfg.delta_cho)
    target_tab = np.zeros(tok.shape)
    target_tab[:P, 0], target_tab[:P, 1:1 + k] = d_rej, d_alt
    target_tab[:P, 1 + k + s_n:] = d_rej[:, None]
    target = target_tab[slot, col]
    eps = np.where(np.isin(kind, wfld.HOLD_KINDS), cfg.hold_eps, cfg.target_eps)
    cond = wfld.Conditions(slot, tok[slot, col], kind.astype(np.int8), target, eps)
    groups = []
    for wi in range(len(mining.words)):
        hh = [np.asarray(t.dump.hh)[mining.trace(t.name).coll_rows[mining.trace(t.name).coll_word == wi]]
              for t in by_role["train"] + by_role["null"]]
        groups.append(np.concatenate(hh, axis=0))
    B = wfld.null_basis(groups, cfg.null_rank, cfg.null_tol, w0.shape[1])
    bg_roles = ("anchors", "train") if cfg.background == "anchors+train" else ("anchors",)
    hh_bg = np.concatenate([background_rows(t.name, t.dump, mining) for r in bg_roles for t in by_role[r]])
    C = wfld.background_metric(hh_bg, cfg.ridge)
    M = wfld.restricted_inverse(C, B)
    return dict(tok=tok, slot=slot, col=col, cond=cond, base=base, groups=groups, B=B, hh_bg=hh_bg, C=C, M=M,
                info=info, alts=alts, lse=vp.lse)


def test_problem_is_the_former_inline_build(world):
    p = world["problem"]
    ref = _former_inline(world["g"], world["tail"], world["by_role"], world["mining"], world["held"],
                         world["specials"], world["phrases"], CFG)
    for name in ("tok", "slot", "col", "B", "hh_bg", "C", "M"):
        assert np.array_equal(getattr(p, name), ref[name]), name
    for f in wfld.Conditions._fields:
        assert np.array_equal(getattr(p.cond, f), getattr(ref["cond"], f)), f
    assert np.array_equal(p.base.logits, ref["base"].logits) and np.array_equal(p.base.U, ref["base"].U)
    assert len(p.held_by_word) == len(ref["groups"])
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(p.held_by_word, ref["groups"]))
    assert np.array_equal(p.alts.ids, ref["alts"].ids) and np.array_equal(p.vp.lse, ref["lse"])
    assert world["marks"] == ["targets", "metric"]
    assert p.type_name == ref["info"].type_name and isinstance(p.shipper, wfld.Shipper)
    assert not isinstance(p.shipper, ship_mod.FeedbackShipper)          # Q8_0: ggml's quantizer


def test_problem_layout(world):
    p, P = world["problem"], world["problem"].ftpo.rejected.size
    k, s_n = CFG.alternatives, len(world["specials"])
    assert p.k == k and p.tok.shape[1] == 1 + k + s_n + p.alts.variants.shape[1]
    assert np.array_equal(p.tok[:P, 0], p.ftpo.rejected) and p.rows.rows == P + min(CFG.special_rows, p.rows.rows - P)
    assert np.all(p.tok[P:, :s_n] == np.asarray(world["specials"])) and np.all(p.tok[P:, s_n:] == -1)
    assert (p.column("rejected"), p.column("raised", 2), p.column("variants")) == (0, 3, 1 + k + s_n)
    assert np.array_equal(p.hh, p.rows.hh[p.slot])
    kinds = p.cond.kind
    assert np.all(p.cond.target[np.isin(kinds, (wfld.SPECIAL_TARGET, wfld.SPECIAL_ANCHOR))] == 0)
    assert np.all(p.cond.target[kinds == wfld.ALTERNATIVE] == CFG.delta_cho)
    assert np.all(p.cond.target[kinds == wfld.REJECTED] <= 0)
    assert np.all(p.cond.eps[np.isin(kinds, wfld.HOLD_KINDS)] == CFG.hold_eps)
    assert np.allclose(p.B.T @ p.M, 0, atol=1e-8)                      # M is C restricted to dW B = 0
    assert len(world["mining"].words) == len(p.held_by_word)


def test_solving_the_problem_gives_the_drivers_bundle(world, tmp_path):
    """The same config through `solve_wfld` (the driver) and through build_problem + solve: the
    same shipped bytes, the same null and shipping summaries, the same raised table."""
    res = solve_wfld(CFG, world["inputs"], tmp_path / "bundle")
    p = world["problem"]
    gn = solve(p, CFG)
    (edit,) = read_bundle(res.bundle).edits
    assert np.array_equal(gn.raw, edit.raw) and np.array_equal(gn.raw, res.gn.raw)
    report = json.loads((res.bundle / "report.json").read_text())
    tail, mining = world["tail"], world["mining"]
    sums = summaries(p, gn, CFG, collateral_by_word=uses_by_word(world["named"]["collateral"], mining, p.w0.shape[1]),
                     word_names=[tail.tokens.piece(int(w)) for w in mining.words], phrases=world["phrases"],
                     piece=tail.tokens.piece)
    assert report["null"] == json.loads(json.dumps(sums.null))
    assert report["null"] == json.loads(json.dumps(null_summary(p.held_by_word, p.B, p.w0, res.gn)))
    assert report["shipping"]["words"] == json.loads(json.dumps(sums.shipping["words"]))
    assert report["shipping"]["holds"] == json.loads(json.dumps(sums.shipping["holds"]))
    assert report["alternatives"]["positions"] == json.loads(json.dumps(list(sums.raised)))
    assert all(w in report["warnings"] for w in sums.warnings)


def test_ftpo_rows_refuses_when_everything_is_held_out(world):
    mining = world["mining"]
    held = {n: np.ones(mining.trace(n).rows.size, bool) for n, _ in world["named"]["train"]}
    with pytest.raises(WfldError, match="no FTPO position"):
        ftpo_rows(world["named"]["train"], mining, held)


def test_uses_by_word_keeps_the_dtype_it_always_had(world):
    mining = world["mining"]
    held = uses_by_word(world["named"]["train"], mining)
    assert all(g.dtype == np.float32 for g in held)                         # the dumps' own rows
    coll = uses_by_word([], mining, width=7)
    assert all(g.shape == (0, 7) and g.dtype == np.float64 for g in coll)  # no trace: empty float64 blocks
    both = uses_by_word(world["named"]["collateral"], mining, width=held[0].shape[1])
    assert all(g.dtype == np.float64 for g in both)


def test_anchor_rows_are_the_riskiest(world):
    tail, specials = world["tail"], world["specials"]
    anchors = [d for _, d in world["named"]["anchors"]]
    assert anchor_rows(tail, anchors, specials, 0) == []
    picked = anchor_rows(tail, anchors, specials, 5)
    assert sum(rows.size for _, rows in picked) == 5
    assert all(np.all(np.diff(rows) > 0) for _, rows in picked)
    every = anchor_rows(tail, anchors, specials, 10 ** 6)
    d = read_dump(world["w"]["anchors"])
    assert sum(rows.size for _, rows in every) == int(np.count_nonzero(np.asarray(d.next) >= 0))


def test_background_rows_leave_out_the_slop_contexts(world):
    mining = world["mining"]
    name, d = world["named"]["train"][0]
    bg = background_rows(name, d, mining)
    assert bg.shape[0] == d.rows - mining.trace(name).rows.size
