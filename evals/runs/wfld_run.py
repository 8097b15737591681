"""`solve wfld` driver: model + dumps + phrases -> mined targets -> WFLD solve -> bars -> bundle.

Traces by role (each one or more dump directories):
- train: FTPO targets (minus the same-document held-out share, bar (b)) and the legitimate uses of
  the banned words that the edit must not move (the per-word null space);
- heldout: separate documents, scored only (bars (c), (f), (g); their split role is `heldout_role`);
- collateral: legitimate uses of the words, scored only (bar (d)): never in the null space;
- anchors: plain and chat background: the metric C (without the anchors' own slop contexts), the
  special-token holds, bar (e);
- null (optional): more legitimate uses for the null space, never scored.
The bundle holds the new bytes of the edited tensor, the report (bars, per phrase, per word, the
Gauss-Newton log, where the time went) and a manifest with every input's sha256.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit import quant
from exactedit.dumps import ROLE_REPLY, VerifyCache, read_dump
from exactedit.evals.scoring.bars import BarContext, anti_slop_bars, verdict
from exactedit.evals.scoring.collateral import collateral_lines, collateral_uses
from exactedit.evals.protocol.ledger import DEFAULT_WORKSPACE, Ledger, head_json, require_registered
from exactedit.evals.protocol.protocol import Bars, ResolvedTokens, load_protocol
from exactedit.evals.protocol.splits import Splits, same_doc_heldout
from exactedit.quant import gguf
from exactedit.quant.files import file_sha256
from exactedit.quant.specials import model_specials
from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle
from exactedit.solvers.tail.vocab_pass import vocab_pass
from exactedit.solvers.wfld import gauss_newton as wfld
from exactedit.solvers.wfld.config import WfldConfig, WfldError
from exactedit.solvers.wfld.jacobian import editable_weight, gather_rows, linearize, token_rows, with_weights
from exactedit.solvers.wfld import alternatives as alt_mod
from exactedit.solvers.wfld import ship as ship_mod
from exactedit.solvers.wfld.mining import Mining, load_phrases, mine
from exactedit.solvers.phrases import TokenBytes
from exactedit.solvers.wfld.report import build_report
from exactedit.solvers.wfld.rescore import ScoredTrace, score_traces
from exactedit.solvers.tail.logits import tail_mix
from exactedit.solvers.tail.model import load_tail

Progress = Callable[[int, int], None]
ROLES = ("train", "heldout", "collateral", "anchors", "null")


@dataclass(frozen=True)
class WfldInputs:
    """Paths of everything a solve reads (each dump list may hold several directories)."""

    model: str
    phrases: str
    train: tuple[str, ...]
    heldout: tuple[str, ...] = ()
    collateral: tuple[str, ...] = ()
    anchors: tuple[str, ...] = ()
    null: tuple[str, ...] = ()
    protocol: str | None = None

    def __post_init__(self):
        if not self.train:
            raise WfldError("inputs", "train", "at least one train dump is needed (the FTPO targets)")
        if not self.anchors:
            raise WfldError("inputs", "anchors", "at least one anchor dump is needed (the background metric)")


@dataclass(frozen=True, eq=False)
class Trace:
    name: str
    role: str
    path: str
    dump: object


@dataclass(frozen=True, eq=False)
class WfldResult:
    """What `solve_wfld` wrote and what it measured."""

    bundle: Path
    bundle_sha256: str
    report: dict
    verdict: str
    bars: tuple
    mining: Mining
    gn: wfld.GaussNewton
    scores: object            # solvers.tail.scores.RowScores of every scored row
    timings: dict = field(default_factory=dict)


class _Stages:
    def __init__(self, total: int, progress: Progress | None):
        self.total, self.done, self.progress = total, 0, progress
        self.t = time.perf_counter()
        self.timings: dict[str, float] = {}

    def mark(self, name: str, steps: int = 1) -> None:
        now = time.perf_counter()
        self.timings[name] = self.timings.get(name, 0.0) + now - self.t
        self.t = now
        self.done = min(self.total, self.done + steps)
        if self.progress is not None:
            self.progress(self.done, self.total)


def _open_traces(inputs: WfldInputs, tail) -> list[Trace]:
    """Every dump, its field hashes verified once (a dump given for several roles is not re-hashed)."""
    out, names, cache = [], set(), VerifyCache()
    for role in ROLES:
        for path in getattr(inputs, role):
            base = f"{role}:{Path(path).name}"
            name, i = base, 1
            while name in names:
                i += 1
                name = f"{base}#{i}"
            names.add(name)
            out.append(Trace(name, role, str(path), read_dump(path, expect=tail.dump_expect(), cache=cache)))
    return out


def _resolve_specials(g, tail, protocol, cfg: WfldConfig) -> tuple[tuple[int, ...], int]:
    """The special tokens held and the turn end: the protocol's, else the flags', else the model's
    own (quant.specials: its control tokens that its template, its *_token_id keys or the chat
    tags name; its end-of-turn token)."""
    if protocol is not None:
        return (_special_ids(tail.tokens, tuple(protocol.tokens.specials)),
                _special_ids(tail.tokens, [protocol.tokens.turn_end])[0])
    own = model_specials(g)
    specials = _special_ids(tail.tokens, cfg.specials) if cfg.specials else own.guards
    if cfg.turn_end:
        turn_end = _special_ids(tail.tokens, [cfg.turn_end])[0]
    elif own.turn_end is not None:
        turn_end = own.turn_end
    else:
        raise WfldError(g.path, "turn_end", "the model names no end-of-turn token (no eot / eos id, no "
                        "chat template): pass --turn-end")
    if not specials:
        raise WfldError(g.path, "specials", "the model names no special token to hold: pass --special")
    if turn_end not in specials:
        if cfg.specials:
            raise WfldError(g.path, "turn_end", f"the turn end {tail.tokens.tokens[turn_end]!r} is not "
                            f"one of --special {list(cfg.specials)}")
        specials = tuple(specials) + (turn_end,)
    return tuple(int(x) for x in specials), int(turn_end)


def _special_ids(table, names) -> tuple[int, ...]:
    """Special tokens by name (or id, as a protocol may give them) -> ids of the model's table."""
    index = {t: i for i, t in enumerate(table.tokens) if table.is_special(i)}
    missing = [s for s in names if (s not in index if isinstance(s, str) else not 0 <= s < len(table))]
    if missing:
        raise WfldError("model", "specials", f"{missing} are not special tokens of the model's table "
                        "(pass --special for each special token the model has)")
    return tuple(dict.fromkeys(index[s] if isinstance(s, str) else int(s) for s in names))


def _heldout_mask(trace: Trace, tm, tuples, cfg: WfldConfig) -> np.ndarray:
    """bool [P]: the FTPO positions of a train trace held out for bar (b): per document and per
    banned word, seeded (evals/splits.same_doc_heldout), keyed by the dump's sha256 as `eval score`'s
    bars are, so both hold out the same positions."""
    splits = Splits("", cfg.seed, cfg.same_doc_heldout, ())
    key = trace.dump.sha256()  # the dump's identity, not where it lies: a moved dump splits the same
    names = [trace.dump.docs[int(di)].name for di in tm.doc]
    starts = np.array([trace.dump.docs[int(di)].first_row for di in tm.doc], dtype=np.int64)
    words = [int(tuples[int(t)][-1]) for t in tm.tuple_id]
    return same_doc_heldout(splits, key, names, np.asarray(tm.rows, np.int64) - starts, words)


def _anchor_rows(tail, anchors: list[Trace], specials, count: int) -> list[tuple[object, np.ndarray]]:
    """The `count` anchor rows where a special token is closest to (or above) the actual next
    token's logit: the rows where holding the specials matters most."""
    if count == 0:
        return []
    cands = []
    w_sp = token_rows(tail.head, specials)
    for ai, t in enumerate(anchors):
        nxt = np.asarray(t.dump.next, dtype=np.int64)
        rows = np.flatnonzero(nxt >= 0)
        if rows.size == 0:
            continue
        mix = np.asarray(tail_mix(tail, t.dump), dtype=np.float64)[rows]
        uniq, inv = np.unique(nxt[rows], return_inverse=True)
        l_next = np.einsum("tn,tn->t", mix, token_rows(tail.head, uniq)[inv])
        risk = (mix @ w_sp.T).max(axis=1) - l_next
        cands += [(float(r), ai, int(row)) for r, row in zip(risk, rows)]
    cands.sort(key=lambda c: (-c[0], c[1], c[2]))
    picked = cands[:count]
    return [(anchors[ai].dump, np.array(sorted(row for _, a, row in picked if a == ai), dtype=np.int64))
            for ai in range(len(anchors)) if any(a == ai for _, a, _ in picked)]


def _solve_wfld(cfg: WfldConfig, inputs: WfldInputs, out, *, overwrite: bool = False,
               workspace=DEFAULT_WORKSPACE, command: str = "exactedit solve wfld", device=None,
               progress: Progress | None = None) -> WfldResult:
    """Mine, solve, re-score and write the bundle at `out`. With a protocol, its bars' thresholds
    and special tokens are used, and it must be registered in the workspace's ledger (or the run
    is marked `unregistered` in every report). `device`: None for the host passes, or a jax.Device
    for the device ones (`vocab_pass_jax`, `kl_pass_jax`, exact mode; the head goes up once)."""
    st = _Stages(5 + cfg.gn_iters, progress)
    protocol = load_protocol(inputs.protocol) if inputs.protocol else None
    marker, ledger_head = "", None
    if protocol is not None:
        with Ledger.open(workspace) as ledger:
            marker = require_registered(ledger, protocol, command, cfg.unregistered).marker
            ledger_head = head_json(ledger)  # a wfld solve appends nothing: this is the head at writing
    g = gguf.open(inputs.model)
    tail = load_tail(g)
    w0 = editable_weight(tail)
    tensor = tail.spec.names["ffn_down"]
    info = g.tensor(tensor)
    specials, turn_end = _resolve_specials(g, tail, protocol, cfg)
    phrases = load_phrases(inputs.phrases)
    unknown = [p for p, _ in cfg.same_sense if p not in phrases]
    if unknown:
        raise WfldError(inputs.phrases, "same_sense", f"{unknown} are not phrases of the file")
    unknown = [p for p, _ in cfg.phrase_margins if p not in phrases]
    if unknown:
        raise WfldError(inputs.phrases, "phrase_margins", f"{unknown} are not phrases of the file")
    traces = _open_traces(inputs, tail)
    dhead = None
    if device is not None:
        from exactedit.solvers.tail.device_pass import to_device

        dhead = to_device(tail.head, device)
    by_role = {r: [t for t in traces if t.role == r] for r in ROLES}
    st.mark("open")

    mining = mine({t.name: t.dump for t in traces}, phrases, tail.tokens, capitalized=cfg.capitalized)
    held = {t.name: _heldout_mask(t, mining.trace(t.name), mining.tuples, cfg) for t in by_role["train"]}
    blocks, rej, phr, where = [], [], [], []
    for t in by_role["train"]:
        tm = mining.trace(t.name)
        keep = ~held[t.name]
        blocks.append((t.dump, tm.rows[keep]))
        where += [(t.name, int(r)) for r in tm.rows[keep]]
        rej.append(np.asarray(t.dump.next)[tm.rows[keep]])
        phr.append(tm.phrase[keep])
    rej, phr = np.concatenate(rej).astype(np.int64), np.concatenate(phr)
    if rej.size == 0:
        raise WfldError("train", "ftpo", f"no FTPO position of {list(phrases)} outside the held-out share "
                        "in the train dumps")
    rs_t = gather_rows(blocks)
    st.mark("mine")

    mix_t = tail.mix(tail.residual(rs_t))
    pool = max(cfg.alt_pool, cfg.alternatives + len(specials) + 1)
    if dhead is None:
        vp = vocab_pass(mix_t, tail.head, topk=pool, softcap=tail.softcap, tile_rows=cfg.tile_rows)
    else:
        from exactedit.solvers.tail.device_pass import vocab_pass_jax

        vp = vocab_pass_jax(mix_t, dhead, topk=pool, softcap=tail.softcap, tile_rows=cfg.tile_rows)
    tb = TokenBytes(tail.tokens)
    sense = {ph: alt_mod.same_sense_ids(ws, tb, tail.spec.vocab) for ph, ws in cfg.same_sense}
    alts = alt_mod.choose(vp.topk_ids, vp.topk_logits, vp.lse, rej, specials, cfg.alternatives, cfg.alt_floor,
                          tb, [sense.get(phrases[p], frozenset()) for p in phr] if sense else None)
    a_blocks = _anchor_rows(tail, by_role["anchors"], specials, cfg.special_rows)
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
    head_cache: dict = {}

    def evaluate(w):
        lin = linearize(with_weights(tail, w), rs, tok, backend=cfg.backend, head_cache=head_cache)
        return wfld.Evaluation(lin.logits[slot, col], lin.u[slot, col])

    base = evaluate(w0)
    base_tab = np.full(tok.shape, np.nan)
    base_tab[slot, col] = base.logits
    margins = np.array([cfg.margin_for(phrases[p]) for p in phr])
    d_rej, d_alt = wfld.ftpo_targets(base_tab[:P, 0], base_tab[:P, 1:1 + k], margins, cfg.delta_cho)
    target_tab = np.zeros(tok.shape)
    target_tab[:P, 0], target_tab[:P, 1:1 + k] = d_rej, d_alt
    target_tab[:P, 1 + k + s_n:] = d_rej[:, None]      # variants count as rejected: they move with it
    target = target_tab[slot, col]
    eps = np.where(np.isin(kind, wfld.HOLD_KINDS), cfg.hold_eps, cfg.target_eps)
    cond = wfld.Conditions(slot, tok[slot, col], kind.astype(np.int8), target, eps)
    st.mark("targets")

    groups = []
    for wi in range(len(mining.words)):
        hh = [np.asarray(t.dump.hh)[mining.trace(t.name).coll_rows[mining.trace(t.name).coll_word == wi]]
              for t in by_role["train"] + by_role["null"]]
        groups.append(np.concatenate(hh, axis=0))
    B = wfld.null_basis(groups, cfg.null_rank, cfg.null_tol, w0.shape[1])
    bg_roles = ("anchors", "train") if cfg.background == "anchors+train" else ("anchors",)
    hh_bg = np.concatenate([_background_rows(t, mining) for r in bg_roles for t in by_role[r]])
    C = wfld.background_metric(hh_bg, cfg.ridge)
    M = wfld.restricted_inverse(C, B)
    view = quant.runtime_view if tail.kind == "hc4" else quant.dequantize
    raw0 = g.read_raw(tensor)
    if ship_mod.uses_feedback(cfg.ship, info.type_name):
        kept = np.concatenate(groups + [np.asarray(rs.hh, np.float64)], axis=0)
        metric = ship_mod.shipping_metric(hh_bg, cfg.ridge, kept, w0, cfg.ship_hold_weight)
        shipper = ship_mod.FeedbackShipper(raw0, info.type_name, info.cols, view, metric, cfg.ship_sweeps)
    else:
        shipper = wfld.Shipper(raw0, info.type_name, info.cols, view)
    st.mark("metric")

    gn = wfld.gauss_newton(w0, cond, rs.hh[slot], M, evaluate, shipper, iters=cfg.gn_iters, tol=cfg.gn_tol,
                           base=base, progress=lambda i, n: st.mark("gauss_newton", 1))
    st.done = 4 + cfg.gn_iters
    scored = [ScoredTrace(t.name, t.dump, tuple(_split_role(t, cfg) for _ in t.dump.docs),
                          Path(t.path).name if t.role == "anchors" else "")
              for t in traces if t.role != "null"]
    scores = score_traces(tail, with_weights(tail, gn.w_new), scored, specials, tile_rows=cfg.tile_rows,
                          device_head=dhead)
    heldout_b = np.concatenate([_rows_mask(t, mining, held) for t in traces if t.role != "null"])
    tokens = ResolvedTokens(specials, turn_end, (), mining.tuples, mining.words, ())
    ctx = BarContext(tokens, protocol.bars if protocol else Bars(), cfg.heldout_role, heldout_b,
                     _Vocab(tail.tokens))
    bars = anti_slop_bars(scores, ctx)
    coll = [np.concatenate([np.zeros((0, w0.shape[1]))] + [
        np.asarray(t.dump.hh)[mining.trace(t.name).coll_rows[mining.trace(t.name).coll_word == wi]]
        for t in by_role["collateral"]], axis=0) for wi in range(len(mining.words))]
    shipping = ship_mod.shipping_summary(
        gn=gn, cond=cond, Hh=rs.hh[slot], w0=w0, held_by_word=groups, collateral_by_word=coll,
        word_names=[tail.tokens.piece(int(w)) for w in mining.words], raw0=raw0, type_name=info.type_name,
        cols=info.cols, view=view, mode=cfg.ship, hold_weight=cfg.ship_hold_weight, shipper=shipper, hh_bg=hh_bg)
    cidx = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(slot, col))}
    offset = {"rejected": 0, "raised": 1, "variants": 1 + k + s_n}
    raised = alt_mod.raised_table(alts, where, [phrases[p] for p in phr], rej,
                                  lambda p, key, j: cidx.get((p, offset[key] + j)), gn.base_logits, gn.logits,
                                  vp.lse, lambda i: tail.tokens.piece(i))
    st.mark("score")

    report = build_report(cfg=cfg, bars=bars, verdict=verdict(bars), scores=scores, ctx=ctx, mining=mining,
                          gn=gn, cond=cond, null=_null_summary(groups, B, w0, gn), w0=w0, tensor=tensor,
                          timings=st.timings, phrases=phrases, heldout=held, marker=marker,
                          warnings=_warnings(by_role, mining, tail.tokens)
                          + alt_mod.floor_warnings(alts, [phrases[p] for p in phr], cfg.alt_floor),
                          shipping=shipping, raised=raised)
    report["collateral"] = collateral_uses(scores, mining.tuples, mining.words, ctx.name, ctx.vocab,
                                           low=ctx.bars.collateral_low)
    refs = [InputRef("model", str(inputs.model), g.sha256()),
            InputRef("phrases", str(inputs.phrases), file_sha256(inputs.phrases))]
    refs += [InputRef(f"dump:{t.name}", t.path, t.dump.sha256()) for t in traces]
    if protocol:
        refs.append(InputRef("protocol", str(protocol.path), protocol.sha256))
    edit = TensorEdit(tensor, "tensor", info.type_name, (int(info.rows), int(info.cols)), gn.raw)
    record = {"marker": marker, "dw_rel": report["edit"]["dw_rel"], "verdict": report["verdict"],
              "iterations": report["iterations"], "conditions": report["conditions"]}
    bundle = write_bundle(out, solver="wfld", inputs=refs, config=cfg.to_json(), edits=[edit],
                          files={"report.json": json.dumps(report, indent=1, allow_nan=False).encode("utf-8")},
                          record=record, ledger_head=ledger_head, overwrite=overwrite)
    st.mark("write")
    return WfldResult(bundle.path, bundle.sha256, report, report["verdict"], bars, mining, gn, scores,
                      dict(st.timings))


def _background_rows(t: Trace, mining) -> np.ndarray:
    """A trace's hh rows for the background metric (anchors, and train with --background
    anchors+train), without its slop contexts (rows where a banned phrase's prefix is followed by
    its final token): those are where the edit must act, so they are not part of the background it
    must keep quiet on (bar (e) still scores every row)."""
    hh = np.asarray(t.dump.hh)
    keep = np.ones(hh.shape[0], dtype=bool)
    keep[np.asarray(mining.trace(t.name).rows, dtype=np.int64)] = False
    return hh[keep]


def _null_summary(groups, B, w0, gn: wfld.GaussNewton) -> dict:
    """How still the null anchors are: max over the held uses of ||dW h|| / ||W h||, for the
    solved edit and for the edit as shipped (the Q8_0 round trip's share)."""
    hh = np.concatenate([np.asarray(g, np.float64) for g in groups], axis=0) if groups else np.zeros((0, w0.shape[1]))
    out = {"rows": int(hh.shape[0]), "rank": int(B.shape[1]), "solved_max_rel": None, "shipped_max_rel": None}
    if hh.shape[0]:
        base = np.linalg.norm(hh @ np.asarray(w0, np.float64).T, axis=1)
        for key, dW in (("solved_max_rel", gn.last_solve.dW), ("shipped_max_rel", gn.dW)):
            out[key] = float(np.max(np.linalg.norm(hh @ dW.T, axis=1) / np.maximum(base, 1e-30)))
    return out


def _warnings(by_role, mining: Mining, table) -> list[str]:
    """What the inputs lack that the solve's guarantees lean on (the report prints these)."""
    out = []
    tags = [set(d.tags) for t in by_role["anchors"] for d in t.dump.docs]
    chat = any("chat" in tg for tg in tags) or any(
        t.dump.roles is not None and np.any(np.asarray(t.dump.roles) & ROLE_REPLY) for t in by_role["anchors"])
    if not chat:
        out.append("no chat-formatted anchor document: the background metric does not see open turns "
                   "(the edit may move the turn end in chat text)")
    if not any("plain" in tg for tg in tags):
        out.append("no anchor document tagged 'plain'")
    if not by_role["heldout"]:
        out.append("no held-out documents: bars (c), (f), (g) have nothing to stand on")
    if not by_role["collateral"]:
        out.append("no collateral dump: bar (d) has nothing to stand on")
    held_words = {int(w) for t in by_role["train"] + by_role["null"] for w in mining.trace(t.name).coll_word}
    for wi, w in enumerate(mining.words):
        if wi not in held_words:
            out.append(f"word {table.piece(int(w))!r}: no legitimate use in the train/null dumps, "
                       "so no null space holds it")
    return out


def _split_role(t: Trace, cfg: WfldConfig) -> str:
    return {"train": "train", "heldout": cfg.heldout_role, "collateral": "collateral", "anchors": "anchors"}[t.role]


def _rows_mask(t: Trace, mining: Mining, held: dict) -> np.ndarray:
    mask = np.zeros(t.dump.rows, dtype=bool)
    if t.name in held:
        mask[mining.trace(t.name).rows[held[t.name]]] = True
    return mask


class _Vocab:
    """Token id -> decoded text, on demand (labels of the bars)."""

    def __init__(self, table):
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int) -> str:
        return self.table.piece(int(i))


def solve_wfld(cfg: WfldConfig, inputs: WfldInputs, out, *, overwrite: bool = False,
               workspace=DEFAULT_WORKSPACE, command: str = "exactedit solve wfld", device="auto",
               progress: Progress | None = None) -> WfldResult:
    """Mine, solve, re-score and write the bundle at `out` (see `_solve_wfld`), with every JAX
    matmul in exact float32 (HIGHEST): TF32 / bf16 are opt-in (solvers.tail.device), never a GPU's
    silent default. `device` ("cpu", "gpu", "auto" or a jax.Device; `pass_device`): on "cpu", and on
    "auto" without a GPU, the full-vocab passes are the host ones; else they run on the device."""
    from exactedit.solvers.tail.device import DeviceConfig, pass_device, scope

    dev = pass_device(device)
    with scope(DeviceConfig(), device=dev):
        return _solve_wfld(cfg, inputs, out, overwrite=overwrite, workspace=workspace, command=command,
                           device=dev, progress=progress)


def solve_report(r: WfldResult) -> tuple[dict, str]:
    """What `solve wfld` prints: (JSON, text) of the report and the bundle."""
    from exactedit.solvers.wfld.report import format_report

    return ({**r.report, "bundle": {"path": str(r.bundle), "sha256": r.bundle_sha256}},
            format_report(r.report) + _collateral_text(r.report)
            + f"\nbundle {r.bundle} (sha256 {r.bundle_sha256})")


def _collateral_text(report: dict) -> str:
    lines = collateral_lines(report.get("collateral") or ())
    return "\n" + "\n".join(lines) if lines else ""
