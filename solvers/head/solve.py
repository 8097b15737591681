"""`solve head`: the exact output-head row solver (SPEC.md section 4), end to end.

1. The protocol must be registered (or the run is marked `--unregistered`); its split decides
   which documents of the given dumps are train, dev and test; S comes from train only.
2. One full-vocab pass over the train and dev rows (and the protocol's anchor traces) gives LSE,
   LSE_rest, the base logits of S and of every token a term names (`rowdata.gather`).
3. Adam steps on J at |rows| x |S| x n each (JAX float32, jitted once; or the numpy reference).
4. Every `stopping.every` steps: the edit is round-tripped through the head's type (`ship`) and
   scored exactly on train and dev: the gains per token class and the dev KL (`Checkpoint`; numpy
   float64 on the host, or the same in float64 on the device: `track`).
5. The protocol's stopping rule picks the step (or none: then no edit ships). Test rows are read
   only now, once per (protocol, edit) through the ledger; a repeat gets the recorded numbers.
6. The result carries everything a report needs; `write_head_bundle` writes the bundle.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from exactedit.evals.bars import BarContext, BarRow, persona_bars
from exactedit.evals.ledger import DEFAULT_WORKSPACE, Ledger, require_registered
from exactedit.evals.protocol import load_protocol, resolve_tokens as resolve_protocol_tokens
from exactedit.solvers.tail.scores import concat as concat_scores
from exactedit.quant import gguf
from exactedit.solvers.head import rowdata
from exactedit.solvers.head.adam import AdamState, adam_init, adam_update
from exactedit.solvers.head.batch import build_batch, rejected_openers
from exactedit.solvers.head.config import HeadSolveConfig, HeadSolveError
from exactedit.solvers.head.editset import EditSet, choose_edit_set, resolve_tokens
from exactedit.solvers.head.inputs import gather_inputs, solve_splits
from exactedit.solvers.head.objective import Terms, objective_grad
from exactedit.solvers.head.param import anchor_energy_kept, delta_w, init_params, n_params, null_basis, project, pullback
from exactedit.solvers.head.scores import ClassGains, SplitReport, class_masks, split_report
from exactedit.solvers.head.ship import HeadRows, Shipped, load_head_rows, ship, shipped_edit
from exactedit.solvers.head.testonce import TestOutcome, score_test_once
from exactedit.solvers.head.track import DeviceTracker, HostTracker

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Checkpoint:
    """The shipped edit at one step, scored exactly: J's terms on train, gains, dev KL, the ratio."""

    step: int
    terms: Terms
    train: ClassGains
    dev: ClassGains
    dev_kl: float
    ratio: float
    rows_changed: int


@dataclass(frozen=True, eq=False)
class HeadSolveResult:
    config: HeadSolveConfig
    protocol: str
    protocol_sha256: str
    protocol_path: Path
    marker: str                       # non-empty for an unregistered protocol: every report prints it
    model: str
    model_sha256: str
    inputs: tuple[tuple[str, str, str], ...]   # (role, path, sha256) of every dump read
    edit_set: EditSet
    edit_tokens: tuple[str, ...]
    n_params: int
    anchor_energy_kept: float
    term_rows: dict
    stopping: dict
    trajectory: tuple[Checkpoint, ...]
    losses: tuple[float, ...]         # J per Adam step (float32 path, before the round trip)
    chosen_step: int | None
    rows_changed: int
    quant_rel_error: float
    edit_norm_ratio: float            # ||dW shipped|| / ||W_S||
    splits: tuple[SplitReport, ...]   # train, dev at the chosen step (zero edit when none)
    anchors: tuple[SplitReport, ...]  # each anchor trace
    test: TestOutcome
    bars: tuple[BarRow, ...]
    seconds: dict
    bundle_sha256: str                # identity of the bundle `write_head_bundle` writes (test-once key)
    head: HeadRows | None = field(default=None, repr=False)
    shipped: Shipped | None = field(default=None, repr=False)

    @property
    def shipped_edit(self) -> bool:
        return self.chosen_step is not None and self.rows_changed > 0


class _Ticker:
    """One progress bar over several phases of known size."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.done = progress, max(total, 1), 0

    def phase(self, size: int) -> Progress:
        base = self.done
        self.done += size

        def tick(done: int, total: int) -> None:
            if self.progress is not None:
                self.progress(base + int(size * done / max(total, 1)), self.total)
        return tick


def _check_tail(tail) -> str:
    if tail.softcap is not None:
        raise HeadSolveError(tail.path, "logit softcap", "solve head needs logits linear in the head rows; "
                             "this model applies a final softcap")
    if tail.spec.tied:
        raise HeadSolveError(tail.path, "token_embd.weight", "the head is tied to the input embeddings; "
                             "editing its rows would change the inputs too")
    return tail.spec.names["head"]


def _gather(tail, role_rows, edit_ids, sel_ids, tile_rows, tick: _Ticker, device_head=None):
    parts = [rowdata.gather(tail, rr.dump, rr.spans, rr.docs, edit_ids, sel_ids, tile_rows=tile_rows,
                            device_head=device_head, progress=tick.phase(tail.spec.vocab)) for rr in role_rows]
    return rowdata.concat(parts)


class _Scorer:
    """Scores a shipped edit on fixed RowData sets."""

    def __init__(self, edit_ids, style, specials, turn_end):
        self.ids, self.style, self.specials, self.turn_end = edit_ids, style, specials, turn_end

    def effect(self, rd, dw):
        return rowdata.effect(rd, dw, self.ids)

    def report(self, name, rd, eff) -> SplitReport:
        return split_report(name, rd, eff, class_masks(rd, self.style, self.specials), self.specials, self.turn_end)


def _optimize(cfg: HeadSolveConfig, batch, q, head: HeadRows, track, stopping, tick: Progress):
    """Adam from the zero edit; a scored Checkpoint every `stopping.every` steps (`track`: a
    track.HostTracker or DeviceTracker of the train and dev rows). Returns
    (checkpoints, {step: dW}, per-step losses, n_params, seconds per step)."""
    w = cfg.weights
    _, g0 = objective_grad(batch, np.zeros(batch.base_s.shape[1:2] + batch.z.shape[1:]), w)
    params = init_params(cfg.rank, g0, q)
    checkpoints, saved = [], {}

    def check(step, p):
        dw = delta_w(p, q)
        shipped, changed = shipped_edit(head, dw)
        sc = track(shipped)
        a, b = sc.dev.of(stopping.metric), sc.train.of(stopping.metric)
        ratio = a / b if np.isfinite(a) and np.isfinite(b) and b > 0 else float("nan")
        checkpoints.append(Checkpoint(step, sc.terms, sc.train, sc.dev, sc.dev_kl, float(ratio), changed))
        saved[step] = dw

    check(0, params)
    stepper = _JaxStepper(cfg, batch, q, params) if cfg.backend == "jax" else _NumpyStepper(cfg, batch, q, params)
    timed = 0.0
    for step in range(1, stopping.max_steps + 1):
        t0 = time.perf_counter()
        stepper.step()
        if step > 1:  # the first step includes the jit compile
            stepper.sync()
            timed += time.perf_counter() - t0
        if step % stopping.every == 0:
            check(step, stepper.params())
        tick(step, stopping.max_steps)
    per_step = timed / (stopping.max_steps - 1) if stopping.max_steps > 1 else float("nan")
    return tuple(checkpoints), saved, stepper.losses(), n_params(params), per_step


class _NumpyStepper:
    """The float64 reference loop: analytic gradient, chain rule, Adam, re-projection."""

    def __init__(self, cfg, batch, q, params):
        self.cfg, self.batch, self.q, self.p = cfg, batch, q, params
        self.state, self._losses = adam_init(params), []

    def step(self):
        terms, gw = objective_grad(self.batch, delta_w(self.p, self.q), self.cfg.weights)
        self.p, self.state = adam_update(pullback(self.p, self.q, gw), self.state, self.p, self.cfg.adam)
        self.p = project(self.p, self.q)
        self._losses.append(terms.total)

    def params(self):
        return self.p

    def sync(self):
        pass

    def losses(self):
        return tuple(self._losses)


class _JaxStepper:
    """The fast path: float32, `objective_jax.train_step` jitted once."""

    def __init__(self, cfg, batch, q, params):
        import jax
        import jax.numpy as jnp

        from exactedit.solvers.head import objective_jax as oj

        self.jax = jax
        self.data = oj.to_device(batch, q)
        self.scfg = oj.StepConfig(cfg.weights, cfg.adam)
        self.fn = jax.jit(oj.train_step, static_argnames="cfg")
        self.p = type(params)(*(jnp.asarray(x, jnp.float32) for x in params))
        zeros = type(params)(*(jnp.zeros_like(x) for x in self.p))
        self.state = AdamState(jnp.zeros((), jnp.int32), zeros, zeros)
        self._losses = []

    def step(self):
        self.p, self.state, terms = self.fn(self.p, self.state, self.data, cfg=self.scfg)
        self._losses.append(terms.total)

    def params(self):
        return type(self.p)(*(np.asarray(x, dtype=np.float64) for x in self.p))

    def sync(self):
        self.jax.block_until_ready(self.p)

    def losses(self):
        return tuple(float(x) for x in self._losses)


@dataclass(frozen=True, eq=False)
class _Setup:
    """What a solve reads before any pass: the tail, the protocol's tokens, the rows, S."""

    tail: object
    head_name: str
    vocab: list
    resolved: object              # evals.protocol.ResolvedTokens
    given: dict                   # role -> [RoleRows]
    edit: EditSet
    openers: tuple[int, ...]
    closers: tuple[int, ...]
    sel_ids: tuple[int, ...]      # tokens whose base logits every pass keeps
    device_head: object = None    # the head on the solve's JAX device (stream_jax.DeviceRows), or None: host passes


def _setup(cfg: HeadSolveConfig, proto, splits, g, train, dev, test, device=None) -> _Setup:
    from exactedit.solvers.tail.model import load_tail

    tail = load_tail(g)
    head_name = _check_tail(tail)
    vocab = [tail.tokens.piece(i) for i in range(tail.spec.vocab)]
    resolved = resolve_protocol_tokens(proto, vocab)
    given = gather_inputs(proto, splits, {"train": train, "dev": dev, "test": test}, tail.dump_expect())
    openers = resolve_tokens(cfg.openers, vocab, "--opener")
    closers = resolve_tokens(cfg.closers, vocab, "--closer")
    spans = [(rr.dump, a, b) for rr in given["train"] for a, b, _ in rr.spans]
    edit = choose_edit_set(proto.edit_set.rule, proto.edit_set.count, resolved.edit_set, resolved.style,
                           resolved.specials, np.concatenate([np.asarray(d.next[a:b]) for d, a, b in spans]),
                           np.concatenate([np.asarray(d.roles[a:b]) for d, a, b in spans]))
    if cfg.rank > len(edit.ids):
        raise HeadSolveError("config", "rank", f"{cfg.rank} exceeds |S| = {len(edit.ids)}")
    rejected = rejected_openers([d for rr in given["train"] for d in rr.docs], tail.spec.vocab)
    sel_ids = tuple(dict.fromkeys([*resolved.specials, resolved.turn_end, *openers, *closers,
                                   *(int(r) for r in rejected if r >= 0)]))
    device_head = None
    if device is not None:
        from exactedit.solvers.tail.device_pass import to_device

        device_head = to_device(tail.head, device)
    return _Setup(tail, head_name, vocab, resolved, given, edit, openers, closers, sel_ids, device_head)


def _null_space(cfg: HeadSolveConfig, z_anchor: np.ndarray, n: int) -> np.ndarray:
    if cfg.null_k == 0:
        return np.zeros((n, 0))
    if len(z_anchor) == 0 or cfg.null_k >= n:
        raise HeadSolveError("train", "anchors", f"--null-k {cfg.null_k} needs anchor rows and must be below "
                             f"n = {n} (train has {len(z_anchor)} anchor rows)")
    return null_basis(z_anchor, cfg.null_k)


def _solve_head(cfg: HeadSolveConfig, *, model, train: Sequence, dev: Sequence, protocol, test: Sequence = (),
               workspace=DEFAULT_WORKSPACE, command: str = "exactedit solve head", device=None,
               progress: Progress | None = None) -> HeadSolveResult:
    """Run a head solve; nothing is written except ledger entries (see `write_head_bundle`).
    `device`: None for the host passes and float64 numpy tracking, or a jax.Device for the device
    passes (`vocab_pass_jax`, exact mode) and the float64 DeviceTracker there."""
    clock = {"start": time.perf_counter()}
    proto = load_protocol(protocol)
    with Ledger.open(workspace) as ledger, gguf.open(model) as g:
        record = require_registered(ledger, proto, command, cfg.unregistered)
        su = _setup(cfg, proto, solve_splits(proto, ledger, cfg.unregistered), g, train, dev, test, device)
        tail, resolved, given, edit, V = su.tail, su.resolved, su.given, su.edit, su.tail.spec.vocab
        passes = len(given["train"]) + len(given["dev"]) + len(given["anchors"]) + len(given["test"])
        tick = _Ticker(progress, passes * V + proto.stopping.max_steps)

        gather = lambda rows: _gather(tail, rows, edit.ids, su.sel_ids, cfg.tile_rows, tick, su.device_head)  # noqa: E731
        train_rd, dev_rd = gather(given["train"]), gather(given["dev"])
        anchor_rds = [gather([rr]) for rr in given["anchors"]]
        clock["pass"] = time.perf_counter()

        batch, counts = build_batch(train_rd, edit.ids, resolved.specials, su.openers, su.closers, V)
        z_anchor = train_rd.z[batch.anchor]
        q = _null_space(cfg, z_anchor, tail.spec.n)
        head = load_head_rows(g, su.head_name, edit.ids, runtime=tail.head.runtime)
        scorer = _Scorer(edit.ids, resolved.style, resolved.specials, resolved.turn_end)
        tracking = (resolved.style, resolved.specials)
        track = (HostTracker(batch, cfg.weights, train_rd, dev_rd, edit.ids, *tracking) if device is None else
                 DeviceTracker(batch, cfg.weights, train_rd, dev_rd, edit.ids, *tracking, device))
        checkpoints, saved, losses, n_par, per_step = _optimize(
            cfg, batch, q, head, track, proto.stopping, tick.phase(proto.stopping.max_steps))
        clock["steps"] = time.perf_counter()

        metric = proto.stopping.metric
        chosen = proto.stopping.choose([c.step for c in checkpoints], [c.train.of(metric) for c in checkpoints],
                                       [c.dev.of(metric) for c in checkpoints])
        shipped = ship(head, saved[chosen] if chosen is not None else np.zeros_like(head.view))
        named = [("train", train_rd), ("dev", dev_rd)] + [(rr.trace, rd) for rr, rd in zip(given["anchors"], anchor_rds)]
        effects = [scorer.effect(rd, shipped.dw) for _, rd in named]
        reports = [scorer.report(name, rd, eff) for (name, rd), eff in zip(named, effects)]
        parts = [rowdata.row_scores(rd, eff, resolved.specials) for (_, rd), eff in zip(named, effects)]

        def bars_with(scores, role):
            return persona_bars(concat_scores(scores, chunks=False),
                                BarContext(tokens=resolved, bars=proto.bars, heldout_role=role))

        has_edit = chosen is not None and bool(shipped.changed.any())
        dumps = tuple((f"{rr.role}:{rr.trace}", str(rr.path), rr.dump.sha256())
                      for role in ("train", "dev", "test", "anchors") for rr in given[role])
        *_, identity = bundle_plan(model, g.sha256(), proto.path, proto.sha256, dumps, cfg, head,
                                   shipped if has_edit else None)
        outcome, bars = score_test_once(
            ledger, record, command, bool(given["test"]), has_edit, identity,
            lambda: _score_test(su, given["test"], cfg, scorer, shipped, parts, bars_with, tick),
            lambda: bars_with(parts, "dev"))
        clock["end"] = time.perf_counter()
        w_norm = float(np.linalg.norm(head.view))
        return HeadSolveResult(
            config=cfg, protocol=proto.name, protocol_sha256=proto.sha256, protocol_path=proto.path,
            marker=record.marker, model=str(model), model_sha256=g.sha256(), inputs=dumps, edit_set=edit,
            edit_tokens=tuple(su.vocab[i] for i in edit.ids), n_params=n_par,
            anchor_energy_kept=anchor_energy_kept(z_anchor, q) if len(z_anchor) else 0.0, term_rows=counts,
            stopping=dict(proto.stopping.__dict__), trajectory=checkpoints, losses=losses, chosen_step=chosen,
            rows_changed=int(shipped.changed.sum()), quant_rel_error=shipped.rel_error,
            edit_norm_ratio=float(np.linalg.norm(shipped.dw)) / w_norm if w_norm > 0 else 0.0,
            splits=tuple(reports[:2]), anchors=tuple(reports[2:]), test=outcome, bars=tuple(bars),
            seconds={"vocab_pass": clock["pass"] - clock["start"], "adam_step": per_step,
                     "steps": clock["steps"] - clock["pass"], "total": clock["end"] - clock["start"]},
            bundle_sha256=identity, head=head, shipped=shipped)


def _score_test(su: _Setup, test_rows, cfg, scorer, shipped, parts, bars_with, tick: _Ticker):
    """Test rows: one pass each, the exact effect, the split report and the bars with test held out."""
    rd = _gather(su.tail, test_rows, su.edit.ids, su.sel_ids, cfg.tile_rows, tick, su.device_head)
    eff = scorer.effect(rd, shipped.dw)
    return scorer.report("test", rd, eff), bars_with([*parts, rowdata.row_scores(rd, eff, su.resolved.specials)], "test")


def bundle_plan(model: str, model_sha: str, protocol_path, protocol_sha: str, dumps, config: HeadSolveConfig,
                head: HeadRows, shipped: Shipped | None):
    """(inputs, config JSON, edits) of a solve's bundle, and its identity (`solvers.bundle`)."""
    from exactedit.solvers.bundle import InputRef, TensorEdit, bundle_identity

    edits = []
    if shipped is not None and shipped.changed.any():
        ch = shipped.changed
        edits.append(TensorEdit(head.tensor, "rows", head.type_name, head.shape, shipped.raw[ch], head.ids[ch]))
    inputs = [InputRef("model", str(model), model_sha), InputRef("protocol", str(protocol_path), protocol_sha)]
    inputs += [InputRef(f"dump:{role}", path, sha) for role, path, sha in dumps]
    cfg = config.to_json()
    return inputs, cfg, edits, bundle_identity("head", inputs, cfg, edits)


def write_head_bundle(r: HeadSolveResult, out, *, overwrite: bool = False):
    """The bundle of a solve: the row patch of the shipped edit (none when no step qualified),
    report.json, report.txt, trajectory.png, and the manifest (inputs' sha256, config, trajectory).
    Its identity is `r.bundle_sha256`, the key test was scored under."""
    from exactedit.solvers.bundle import write_bundle
    from exactedit.solvers.head import report

    inputs, cfg, edits, ident = bundle_plan(r.model, r.model_sha256, r.protocol_path, r.protocol_sha256, r.inputs,
                                            r.config, r.head, r.shipped if r.shipped_edit else None)
    full = report.result_json(r)
    record = {k: full[k] for k in ("marker", "edit_set", "stopping", "chosen_step", "shipped_edit", "rows_changed",
                                   "quant_rel_error", "trajectory", "test")}
    files = {"report.json": json.dumps(full, indent=1).encode(), "report.txt": report.summary_table(r).encode(),
             "trajectory.png": report.trajectory_png(r)}
    b = write_bundle(out, solver="head", inputs=inputs, config=cfg, edits=edits, files=files, record=record,
                     overwrite=overwrite)
    if b.sha256 != r.bundle_sha256 or ident != r.bundle_sha256:
        raise HeadSolveError(out, "identity", f"bundle identity {b.sha256} differs from the solve's {r.bundle_sha256}")
    return b


def solve_head(*args, device="auto", **kwargs):
    """Run a head solve (see `_solve_head`) with every JAX matmul in exact float32 (HIGHEST):
    TF32 / bf16 are opt-in (solvers.device), never a GPU's silent default. `device` ("cpu", "gpu",
    "auto" or a jax.Device; `solvers.device.pass_device`): on "cpu", and on "auto" without a GPU,
    the passes and dev tracking are the host numpy path, unchanged; else they run on the device."""
    from exactedit.solvers.tail.device import DeviceConfig, pass_device, scope

    dev = pass_device(device)
    with scope(DeviceConfig(), device=dev):
        return _solve_head(*args, device=dev, **kwargs)
