"""The head solver's math (SPEC.md section 4) and its one entry:

    solve_rows(HeadInputs, HeadSolveConfig, *, stopping, progress) -> HeadRowsResult

`solve_rows` takes what its driver gathered (the tail, the row data of train, dev and each anchor
trace, the edit set S, the openers / closers, the head's rows of S, the device, and any rows held
in J's KL term besides train's own anchors: `HeadInputs.hold`, e.g. the anchors' paragraph starts)
and builds the train batch (`batch`), the null space of the anchors (`param`), the tracker, runs `optimize`,
picks the checkpoint with the stopping rule it is handed, ships that edit (`ship`) and scores it
exactly on every row set it was given (the effects, the split reports, the per-row scores the
bars read).

`optimize` runs Adam from the zero edit, one pure step per backend (`numpy_step`: the float64
reference with the analytic gradient; `objective_jax.train_step`: float32, jitted once), and every
`stopping.every` steps rounds the edit through the head's type (`ship`) and scores it exactly on
train and dev (a `track.HostTracker` or `DeviceTracker`). Which checkpoint ships is decided by the
caller's stopping rule (runs.solve.head passes the protocol's); this module never reads a protocol,
a ledger or a split.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple, Protocol, Sequence

import numpy as np

from exactedit.dumps.format import ROLE_ANCHOR
from exactedit.solvers.head import rowdata
from exactedit.solvers.head.adam import AdamState, adam_init, adam_update
from exactedit.solvers.head.batch import build_batch
from exactedit.solvers.head.config import HeadSolveConfig, HeadSolveError
from exactedit.solvers.head.editset import EditSet
from exactedit.solvers.head.objective import Terms, objective_grad
from exactedit.solvers.head.param import (
    anchor_energy_kept, delta_w, init_params, n_params, null_basis, project, pullback,
)
from exactedit.solvers.head.rowdata import RowData
from exactedit.solvers.head.scores import ClassGains, SplitReport, class_masks, split_report
from exactedit.solvers.head.ship import HeadRows, Shipped, ship, shipped_edit
from exactedit.solvers.head.track import DeviceTracker, HostTracker

__all__ = ["Checkpoint", "HeadInputs", "HeadRowsResult", "HeadStopping", "Optimized", "Scorer", "bundle_plan",
           "check_tail", "gather_rows", "null_space", "numpy_step", "optimize", "solve_rows"]

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
    dev_kl_off: float = float("nan")    # mean dev KL off the style's decision rows (solvers.tail.decision)


class Optimized(NamedTuple):
    """What `optimize` returns: the scored checkpoints, the float edit at each, J per step."""

    checkpoints: tuple[Checkpoint, ...]
    saved: dict                 # step -> dW [|S|, n] (float64, before the round trip)
    losses: tuple[float, ...]
    n_params: int
    seconds_per_step: float


def check_tail(tail) -> str:
    if tail.softcap is not None:
        raise HeadSolveError(tail.path, "logit softcap", "solve head needs logits linear in the head rows; "
                             "this model applies a final softcap")
    if tail.spec.tied:
        raise HeadSolveError(tail.path, "token_embd.weight", "the head is tied to the input embeddings; "
                             "editing its rows would change the inputs too")
    return tail.spec.names["head"]


def gather_rows(tail, role_rows, edit_ids, sel_ids, tile_rows, phase: Callable[[int], Progress], device_head=None):
    """RowData of the given RoleRows (`rowdata.gather` per dump, concatenated); `phase(size)` gives
    each pass its progress callback."""
    parts = [rowdata.gather(tail, rr.dump, rr.spans, rr.docs, edit_ids, sel_ids, tile_rows=tile_rows,
                            device_head=device_head, progress=phase(tail.spec.vocab)) for rr in role_rows]
    return rowdata.concat(parts)


class Scorer:
    """Scores a shipped edit on fixed RowData sets."""

    def __init__(self, edit_ids, style, specials, turn_end):
        self.ids, self.style, self.specials, self.turn_end = edit_ids, style, specials, turn_end

    def effect(self, rd, dw):
        return rowdata.effect(rd, dw, self.ids)

    def report(self, name, rd, eff) -> SplitReport:
        return split_report(name, rd, eff, class_masks(rd, self.style, self.specials), self.specials, self.turn_end)


def numpy_step(params, state: AdamState, batch, q, cfg: HeadSolveConfig):
    """One Adam step of the float64 reference: (params, state) -> (params, state, terms); pure."""
    terms, gw = objective_grad(batch, delta_w(params, q), cfg.weights)
    params, state = adam_update(pullback(params, q, gw), state, params, cfg.adam)
    return project(params, q), state, terms


def _numpy_backend(cfg, batch, q, params):
    """(state, step(params, state) -> (params, state, loss), to_host, sync, params) of the reference."""
    def step(p, st):
        p, st, terms = numpy_step(p, st, batch, q, cfg)
        return p, st, terms.total
    return adam_init(params), step, (lambda p: p), (lambda p: None), params


def _jax_backend(cfg, batch, q, params):
    """The same for the fast path: float32, `objective_jax.train_step` jitted once."""
    import jax
    import jax.numpy as jnp

    from exactedit.solvers.head import objective_jax as oj

    data = oj.to_device(batch, q)
    scfg = oj.StepConfig(cfg.weights, cfg.adam)
    fn = oj.train_step_jit
    p0 = type(params)(*(jnp.asarray(x, jnp.float32) for x in params))
    zeros = type(params)(*(jnp.zeros_like(x) for x in p0))

    def step(p, st):
        p, st, terms = fn(p, st, data, cfg=scfg)
        return p, st, terms.total

    def to_host(p):
        return type(p)(*(np.asarray(x, dtype=np.float64) for x in p))
    return AdamState(jnp.zeros((), jnp.int32), zeros, zeros), step, to_host, jax.block_until_ready, p0


def optimize(cfg: HeadSolveConfig, batch, q, head: HeadRows, track, stopping, tick: Progress):
    """Adam from the zero edit; a scored Checkpoint every `stopping.every` steps (`track`: a
    track.HostTracker or DeviceTracker of the train and dev rows; `stopping`: any object with
    `every`, `max_steps` and `metric`, e.g. the protocol's stopping rule). Returns `Optimized`."""
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
        checkpoints.append(Checkpoint(step, sc.terms, sc.train, sc.dev, sc.dev_kl, float(ratio), changed,
                                      sc.dev_kl_off))
        saved[step] = dw

    check(0, params)
    backend = _jax_backend if cfg.backend == "jax" else _numpy_backend
    state, step_fn, to_host, sync, p = backend(cfg, batch, q, params)
    timed, losses = 0.0, []
    for step in range(1, stopping.max_steps + 1):
        t0 = time.perf_counter()
        p, state, loss = step_fn(p, state)
        losses.append(loss)
        if step > 1:  # the first step includes the jit compile
            sync(p)
            timed += time.perf_counter() - t0
        if step % stopping.every == 0:
            check(step, to_host(p))
        tick(step, stopping.max_steps)
    per_step = timed / (stopping.max_steps - 1) if stopping.max_steps > 1 else float("nan")
    return Optimized(tuple(checkpoints), saved, tuple(float(x) for x in losses), n_params(params), per_step)


def null_space(cfg: HeadSolveConfig, z_anchor: np.ndarray, n: int) -> np.ndarray:
    if cfg.null_k == 0:
        return np.zeros((n, 0))
    if len(z_anchor) == 0 or cfg.null_k >= n:
        raise HeadSolveError("train", "anchors", f"--null-k {cfg.null_k} needs anchor rows and must be below "
                             f"n = {n} (train has {len(z_anchor)} anchor rows)")
    return null_basis(z_anchor, cfg.null_k)


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


class HeadStopping(Protocol):
    """The stopping rule a solve is handed (the protocol's, `evals.protocol.protocol.StoppingRule`,
    fits): a checkpoint every `every` steps up to `max_steps`, gains on the `metric` token class, and
    `choose(steps, train_gain, dev_gain, dev_kl_off=...)`, the step to ship or None (no edit); it is
    also handed each checkpoint's mean dev KL off the style's decision rows."""

    every: int
    max_steps: int
    metric: str

    def choose(self, steps: Sequence[int], train_gain: Sequence[float], dev_gain: Sequence[float], *,
               dev_kl_off: Sequence[float] | None = None) -> int | None: ...


@dataclass(frozen=True, eq=False)
class HeadInputs:
    """What a head solve reads, gathered by its driver: the tail, the row data of one full-vocab
    pass over train, dev and each anchor trace (`gather_rows`), S, the token ids the terms and the
    scores name, the head's rows of S (`ship.load_head_rows`) and the device the tracker runs on."""

    tail: object                                # solvers.tail.model.Tail (its vocab size and n)
    train: RowData
    dev: RowData
    anchors: tuple[tuple[str, RowData], ...]    # (trace name, row data) of each anchor trace
    edit: EditSet
    style: tuple[int, ...]
    specials: tuple[int, ...]
    turn_end: int
    openers: tuple[int, ...]
    closers: tuple[int, ...]
    head: HeadRows
    device: object = None                       # a jax.Device: DeviceTracker there; None: HostTracker
    hold: RowData | None = None                 # more rows for J's KL term only (their roles become ROLE_ANCHOR)
    decision_bits: int = 0                      # role bits of the style's decision rows (`decision`)


@dataclass(frozen=True, eq=False)
class HeadRowsResult:
    """A head solve: the trajectory, the chosen step, the shipped edit (the zero edit when no step
    qualifies) and what it does on every row set of the inputs."""

    trajectory: tuple[Checkpoint, ...]
    losses: tuple[float, ...]         # J per Adam step (before the round trip)
    n_params: int
    seconds_per_step: float           # one Adam step (the first, which compiles, not counted)
    seconds: float                    # batch, null space, tracker and the Adam steps
    term_rows: dict                   # rows of each term of J
    anchor_energy_kept: float
    chosen_step: int | None
    shipped: Shipped
    edit_norm_ratio: float            # ||dW shipped|| / ||W_S||
    splits: tuple[SplitReport, ...]   # train, dev
    anchors: tuple[SplitReport, ...]  # each anchor trace
    row_scores: tuple                 # solvers.tail.scores.RowScores of train, dev, each anchor trace
    scorer: "Scorer"

    @property
    def has_edit(self) -> bool:
        """A step qualified and its round trip changed some row's bytes."""
        return self.chosen_step is not None and bool(self.shipped.changed.any())

    def score_rows(self, name: str, rd: RowData):
        """(SplitReport, RowScores) of the shipped edit on more rows (test, read by the caller)."""
        eff = self.scorer.effect(rd, self.shipped.dw)
        return self.scorer.report(name, rd, eff), rowdata.row_scores(rd, eff, self.scorer.specials)


def solve_rows(inputs: HeadInputs, cfg: HeadSolveConfig, *, stopping: HeadStopping,
               progress: Progress | None = None) -> HeadRowsResult:
    """The head solve on gathered rows: the train batch, the anchors' null space, Adam with a scored
    checkpoint every `stopping.every` steps, the step `stopping.choose` keeps, its edit shipped and
    scored on train, dev and each anchor trace. `progress(step, max_steps)` follows the Adam steps."""
    t0 = time.perf_counter()
    i, head = inputs, inputs.head
    ids, spec = i.edit.ids, i.tail.spec
    rows = i.train if i.hold is None or not i.hold.rows else \
        rowdata.concat([i.train, replace(i.hold, roles=np.full(i.hold.rows, ROLE_ANCHOR, np.uint8))])
    batch, counts = build_batch(rows, ids, i.specials, i.openers, i.closers, spec.vocab)
    counts["hold"] = 0 if i.hold is None else i.hold.rows
    z_anchor = rows.z[batch.anchor]
    q = null_space(cfg, z_anchor, spec.n)
    scorer = Scorer(ids, i.style, i.specials, i.turn_end)
    tracking = (i.style, i.specials)
    track = (HostTracker(batch, cfg.weights, rows, i.dev, ids, *tracking, decision_bits=i.decision_bits)
             if i.device is None else
             DeviceTracker(batch, cfg.weights, rows, i.dev, ids, *tracking, i.device, decision_bits=i.decision_bits))
    opt = optimize(cfg, batch, q, head, track, stopping, progress or (lambda done, total: None))
    seconds = time.perf_counter() - t0

    checkpoints, metric = opt.checkpoints, stopping.metric
    chosen = stopping.choose([c.step for c in checkpoints], [c.train.of(metric) for c in checkpoints],
                             [c.dev.of(metric) for c in checkpoints], dev_kl_off=[c.dev_kl_off for c in checkpoints])
    shipped = ship(head, opt.saved[chosen] if chosen is not None else np.zeros_like(head.view))
    named = [("train", i.train), ("dev", i.dev), *i.anchors]
    effects = [scorer.effect(rd, shipped.dw) for _, rd in named]
    reports = [scorer.report(name, rd, eff) for (name, rd), eff in zip(named, effects)]
    parts = [rowdata.row_scores(rd, eff, i.specials) for (_, rd), eff in zip(named, effects)]
    w_norm = float(np.linalg.norm(head.view))
    return HeadRowsResult(
        trajectory=checkpoints, losses=opt.losses, n_params=opt.n_params, seconds_per_step=opt.seconds_per_step,
        seconds=seconds, term_rows=counts,
        anchor_energy_kept=anchor_energy_kept(z_anchor, q) if len(z_anchor) else 0.0, chosen_step=chosen,
        shipped=shipped, edit_norm_ratio=float(np.linalg.norm(shipped.dw)) / w_norm if w_norm > 0 else 0.0,
        splits=tuple(reports[:2]), anchors=tuple(reports[2:]), row_scores=tuple(parts), scorer=scorer)
