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

from exactedit.dumps import ROLE_REPLY, VerifyCache, read_dump
from exactedit.evals.scoring.bars import BarContext, anti_slop_bars, verdict
from exactedit.evals.scoring.collateral import collateral_lines, collateral_uses
from exactedit.evals.scoring.evaluate import KnownRows, token_texts
from exactedit.evals.protocol.ledger import DEFAULT_WORKSPACE, Ledger, head_json, require_registered
from exactedit.evals.protocol.protocol import Bars, ResolvedTokens, load_protocol, resolve_tokens
from exactedit.evals.protocol.splits import Splits, same_doc_heldout
from exactedit.quant import gguf
from exactedit.files import file_sha256
from exactedit.quant.model.specials import model_specials
from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle
from exactedit.solvers.l47 import gauss_newton as wfld
from exactedit.solvers.l47.config import WfldConfig, WfldError
from exactedit.solvers.l47.jacobian import with_weights
from exactedit.solvers.phrases import PhraseError
from exactedit.solvers.phrases import load_phrases
from exactedit.solvers.l47.mining import Mining, mine
from exactedit.solvers.l47.frontier import BarD
from exactedit.solvers.l47.problem import ftpo_rows, uses_by_word
from exactedit.solvers.l47.report import build_report, gated_lines
from exactedit.solvers.l47.rescore import ScoredTrace, rescore_parts
from exactedit.solvers.tail.scores import concat
from exactedit.solvers.l47.solve import DenseInputs, solve_dense, summaries
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
    known: KnownRows | None = None    # the rows per dump, for `eval score` of this bundle (dense edits)


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

    def within(self, done: int, total: int) -> None:
        """Progress inside the current stage (the strength search's dev points): shown as that
        many more steps of a total grown by the stage's own, without marking a stage."""
        if self.progress is not None:
            self.progress(self.done + done, self.total + total)


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
    own (quant.model.specials: its control tokens that its template, its *_token_id keys or the chat
    tags name; its end-of-turn token). A chat template that is refused or fails stops the run
    unless --turn-end names the turn end."""
    if protocol is not None:
        return (_special_ids(tail.tokens, tuple(protocol.tokens.specials)),
                _special_ids(tail.tokens, [protocol.tokens.turn_end])[0])
    own = model_specials(g)
    if own.template_error and not cfg.turn_end:   # no silent fallback to the eos / source-scanned framing
        raise WfldError(g.path, "tokenizer.chat_template", f"{own.template_error}; so the turn end and the "
                        "specials to hold cannot be read off the model's template: pass --turn-end (and --special) "
                        "to name them")
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


def _mine(protocol, tail, dumps: dict, phrases, cfg: WfldConfig) -> Mining:
    """The FTPO positions and legitimate uses: with a protocol that lists phrase tuples, those
    tuples and its collateral words, resolved as `eval score` resolves them (so both see the same
    tuples, positions and words; the phrases file only names each tuple's phrase); else whatever
    the matcher finds of the phrases in every dump."""
    if protocol is None or not protocol.tokens.phrases:
        return mine(dumps, phrases, tail.tokens, capitalized=cfg.capitalized)
    tokens = resolve_tokens(protocol, token_texts(tail))
    try:
        return mine(dumps, phrases, tail.tokens, capitalized=cfg.capitalized, tuples=tokens.phrases,
                    words=tokens.collateral_words)
    except PhraseError as exc:
        raise WfldError(protocol.path, "tokens.phrases", str(exc)) from None


def _solve_wfld(cfg: WfldConfig, inputs: WfldInputs, out, *, overwrite: bool = False,
               workspace=DEFAULT_WORKSPACE, command: str = "exactedit solve wfld", device=None,
               progress: Progress | None = None) -> WfldResult:
    """Mine, solve, re-score and write the bundle at `out`. With a protocol, its bars' thresholds,
    special tokens and phrase tuples (`_mine`) are used, and it must be registered in the workspace's ledger (or the run
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
        from exactedit.solvers.tail.passes.device_pass import to_device

        dhead = to_device(tail.head, device)
    by_role = {r: [t for t in traces if t.role == r] for r in ROLES}
    st.mark("open")

    mining = _mine(protocol, tail, {t.name: t.dump for t in traces}, phrases, cfg)
    held = {t.name: _heldout_mask(t, mining.trace(t.name), mining.tuples, cfg) for t in by_role["train"]}
    named = {r: [(t.name, t.dump) for t in by_role[r]] for r in ROLES}
    ftpo = ftpo_rows(named["train"], mining, held)
    st.mark("mine")

    bg_roles = ("anchors", "train") if cfg.background == "anchors+train" else ("anchors",)
    bars_cfg = protocol.bars if protocol else Bars()
    bar_d = BarD(bars_cfg.collateral_low, bars_cfg.collateral_min_mean, bars_cfg.collateral_max_low_share,
                 bars_cfg.collateral_min_uses)
    gated = None
    if cfg.key == "gated":
        gated = _solve_gated(cfg, g, tail, mining, named, held, specials, phrases, bg_roles, bar_d, dhead, st,
                             max_kl={"dev chat": bars_cfg.chat_max_kld, "anchors": bars_cfg.engine_max_kld})
        dense = gated.dense
    else:
        dense = solve_dense(DenseInputs(
            tail, mining, ftpo, specials, phrases, anchors=named["anchors"], held_from=named["train"] + named["null"],
            background_from=[x for r in bg_roles for x in named[r]], dev=named["heldout"],
            collateral=named["collateral"], raw0=g.read_raw(tensor), type_name=info.type_name, cols=info.cols,
            bar_d=bar_d, device_head=dhead), cfg, mark=st.mark, progress=lambda i, n: st.mark("gauss_newton", 1),
            searched=st.within)
    problem, gn, strength = dense.problem, dense.gn, dense.strength
    w0 = problem.w0
    st.done = 4 + cfg.gn_iters
    seen = {} if gated is None else {n: d for v in gated.named.values() for n, d in v}
    scored = [ScoredTrace(t.name, t.dump, tuple(_split_role(t, cfg) for _ in t.dump.docs),
                          Path(t.path).name if t.role == "anchors" else "", seen.get(t.name))
              for t in traces if t.role != "null"]
    parts = rescore_parts(tail, with_weights(tail, gn.w_new), scored, specials, tile_rows=cfg.tile_rows,
                          device_head=dhead)
    scores = concat(parts, chunks=False)
    heldout_b = np.concatenate([_rows_mask(t, mining, held) for t in traces if t.role != "null"])
    tokens = ResolvedTokens(specials, turn_end, (), mining.tuples, mining.words, ())
    ctx = BarContext(tokens, bars_cfg, cfg.heldout_role, heldout_b,
                     _Vocab(tail.tokens))
    bars = anti_slop_bars(scores, ctx)
    sums = summaries(problem, gn, cfg, collateral_by_word=uses_by_word(named["collateral"], mining, w0.shape[1]),
                     word_names=[tail.tokens.piece(int(w)) for w in mining.words], phrases=phrases,
                     piece=tail.tokens.piece)
    st.mark("score")

    report = build_report(cfg=cfg, bars=bars, verdict=verdict(bars), scores=scores, ctx=ctx, mining=mining,
                          gn=gn, cond=problem.cond, null=sums.null, w0=w0, tensor=tensor,
                          timings=st.timings, phrases=phrases, heldout=held, marker=marker,
                          warnings=_warnings(by_role, mining, tail.tokens) + list(sums.warnings),
                          shipping=sums.shipping, raised=sums.raised)
    report["key"] = problem.key.summary()
    if gated is not None:
        report["gated"] = gated.summary
    report["strength"] = strength if strength is not None else {
        "chosen": {p: cfg.strength for p in mining.phrases}, "on": "config"}
    report["collateral"] = collateral_uses(scores, mining.tuples, mining.words, ctx.name, ctx.vocab,
                                           low=ctx.bars.collateral_low)
    refs = [InputRef("model", str(inputs.model), g.sha256()),
            InputRef("phrases", str(inputs.phrases), file_sha256(inputs.phrases))]
    refs += [InputRef(f"dump:{t.name}", t.path, t.dump.sha256()) for t in traces]
    if protocol:
        refs.append(InputRef("protocol", str(protocol.path), protocol.sha256))
    edits = [TensorEdit(tensor, "tensor", info.type_name, (int(info.rows), int(info.cols)), gn.raw)]
    if gated is not None:
        order = np.argsort(gated.units)
        for name, raw in ((_ffn_name(tail, "ffn_gate"), gated.gate_raw), (_ffn_name(tail, "ffn_up"), gated.up_raw)):
            ti = g.tensor(name)
            edits.append(TensorEdit(name, "rows", ti.type_name, (int(ti.rows), int(ti.cols)), raw[order],
                                    np.asarray(gated.units, dtype=np.int64)[order]))
    record = {"marker": marker, "dw_rel": report["edit"]["dw_rel"], "verdict": report["verdict"],
              "iterations": report["iterations"], "conditions": report["conditions"]}
    bundle = write_bundle(out, solver="wfld", inputs=refs, config=cfg.to_json(), edits=edits,
                          files={"report.json": json.dumps(report, indent=1, allow_nan=False).encode("utf-8")},
                          record=record, ledger_head=ledger_head, overwrite=overwrite)
    st.mark("write")
    # `eval score` of this bundle would repeat the rescore's pass row for row; a gated edit's rows come
    # from its rewritten unit (GatedDump), which `eval score` recomputes from the edited model itself
    known = None if gated is not None else KnownRows(
        g.sha256(), bundle.sha256, {t.dump.sha256(): p for t, p in zip(scored, parts)})
    return WfldResult(bundle.path, bundle.sha256, report, report["verdict"], bars, mining, gn, scores,
                      dict(st.timings), known)


def _ffn_name(tail, part: str) -> str:
    """The last layer's `part` tensor (ffn_gate, ffn_up, ffn_norm) of an rmsnorm tail."""
    return tail.spec.names["ffn_down"].replace("ffn_down", part)


def gated_engine(g, tail):
    """(x_of, quantize_row, activation, act) of an rmsnorm tail's last FFN, as the engine computes
    them: x = ffn_norm(R) as ggml computes it, a row quantized to the gate / up tensors' type, a
    unit's activation from the dump's R with given gate and up rows (the rows' products in the
    kernel each micro-batch takes, the fused swiglu, or geglu for Gemma: the architecture's
    activation, solvers.tail.forward.ffn_hidden.activation_of), the activation's name."""
    from exactedit import quant
    from exactedit.errors import QuantError
    from exactedit.solvers.tail.forward.ffn_hidden import last_ffn

    if tail.kind != "rmsnorm":
        raise WfldError("model", "tail", f"the gated edit rewrites a unit of an rmsnorm tail's FFN, not {tail.kind}")
    ffn = last_ffn(g, _ffn_name(tail, "ffn_down"), tail.spec.architecture, float(tail.spec.rms_eps))
    try:
        act = ffn.act
    except QuantError as exc:
        raise WfldError("model", "general.architecture", str(exc)) from None
    try:
        qtype = ffn.type_name
    except QuantError as exc:
        raise WfldError("model", "ffn_gate / ffn_up", str(exc)) from None
    gate_raw, up_raw = np.array(ffn.gate_raw), np.array(ffn.up_raw)

    def activation(dump, g_row, u_row, j):
        """Unit j with rows g_row, u_row, as llama.cpp computes it on the dump's rows (its micro-batches)."""
        old = gate_raw[j].copy(), up_raw[j].copy()
        gate_raw[j], up_raw[j] = g_row, u_row          # the tensors with row j rewritten, then restored
        try:
            sizes = dump.manifest.meta.get("ubatch_sizes") if isinstance(dump.manifest.meta, dict) else None
            return ffn.hidden(dump.R, [j], gate_raw=gate_raw, up_raw=up_raw, ubatch_sizes=sizes)[:, 0]
        finally:
            gate_raw[j], up_raw[j] = old

    return (lambda d: ffn.x(d.R), lambda row: quant.quantize(row[None, :], qtype)[0], activation, act)


def _solve_gated(cfg: WfldConfig, g, tail, mining: Mining, named: dict, held: dict, specials, phrases, bg_roles,
                 bar_d, dhead, st, *, max_kl: dict | None = None):
    """The gated edit (solvers.l47.gated.edit) with the engine's own arithmetic for the rewritten
    unit (`gated_engine`)."""
    from exactedit.solvers.l47.gated.config import DesignConfig
    from exactedit.solvers.l47.gated.edit import GatedInputs, solve_gated

    x_of, quantize_row, activation, act = gated_engine(g, tail)
    info = g.tensor(tail.spec.names["ffn_down"])
    inputs = GatedInputs(
        tail, mining, named, held, tuple(specials), phrases, tuple(bg_roles), g.read_raw(info.name), info.type_name,
        int(info.cols), bar_d, x_of=x_of, quantize_row=quantize_row, activation=activation,
        headroom=cfg.gated_headroom, gate_lams=tuple(cfg.gated_ridges), max_kl=max_kl, device_head=dhead,
        design=DesignConfig(act=act))
    return solve_gated(inputs, cfg, mark=st.mark, progress=st.within)


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
    matmul in exact float32 (HIGHEST): TF32 / bf16 are opt-in (solvers.tail.forward.device), never a GPU's
    silent default. `device` ("cpu", "gpu", "auto" or a jax.Device; `pass_device`): on "cpu", and on
    "auto" without a GPU, the full-vocab passes are the host ones; else they run on the device."""
    from exactedit.solvers.tail.forward.device import DeviceConfig, pass_device, scope

    dev = pass_device(device)
    with scope(DeviceConfig(), device=dev):
        return _solve_wfld(cfg, inputs, out, overwrite=overwrite, workspace=workspace, command=command,
                           device=dev, progress=progress)


def wfld_solve_report(r: WfldResult) -> tuple[dict, str]:
    """What `solve wfld` prints: (JSON, text) of the report and the bundle."""
    from exactedit.solvers.l47.report import format_report

    return ({**r.report, "bundle": {"path": str(r.bundle), "sha256": r.bundle_sha256}},
            format_report(r.report) + _gated_text(r.report) + _collateral_text(r.report)
            + f"\nbundle {r.bundle} (sha256 {r.bundle_sha256})")


def _gated_text(report: dict) -> str:
    lines = gated_lines(report.get("gated"))
    return "\n" + "\n".join(lines) if lines else ""


def _collateral_text(report: dict) -> str:
    lines = collateral_lines(report.get("collateral") or ())
    return "\n" + "\n".join(lines) if lines else ""
