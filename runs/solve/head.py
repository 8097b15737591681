"""`solve head` end to end (SPEC.md section 4): the protocol, the ledger and the split around the
head solver's one entry (`solvers.head.solve_rows`).

1. The protocol must be registered (or the run is marked `--unregistered`); its split decides
   which documents of the given dumps are train, dev and test; S comes from train only.
2. One full-vocab pass over the train and dev rows (and the protocol's anchor traces) gives LSE,
   LSE_rest, the base logits of S and of every token a term names (`rowdata.gather`).
3. `solvers.head.solve_rows`: Adam steps on J at |rows| x |S| x n each; every `stopping.every`
   steps the edit is round-tripped through the head's type and scored exactly on train and dev
   (`Checkpoint`); the protocol's stopping rule, handed in, picks the step (or none: then no edit
   ships); the shipped edit is scored on train, dev and the anchors.
4. Test rows are read only now, once per (protocol, edit) through the ledger; a repeat gets the
   recorded numbers.
5. The result carries everything a report needs; `write_head_bundle` writes the bundle.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from exactedit.evals.scoring.bars import BarContext, BarRow, persona_bars
from exactedit.runs.solve.head_inputs import gather_inputs, solve_splits
from exactedit.runs.solve.head_testonce import TestOutcome, score_head_test
from exactedit.evals.protocol.ledger import DEFAULT_WORKSPACE, Ledger, head_json, require_registered
from exactedit.evals.protocol.protocol import load_protocol, resolve_tokens as resolve_protocol_tokens
from exactedit.quant import gguf
from exactedit.solvers.head import (
    Checkpoint, EditSet, HeadInputs, HeadRows, HeadRowsResult, HeadSolveConfig, HeadSolveError, Shipped,
    SplitReport, check_head_tail, choose_edit_set, gather_head_rows, head_bundle_plan, load_head_rows,
    rejected_openers, resolve_head_tokens, solve_rows,
)
from exactedit.solvers.tail.decision import paragraph_starts, role_bits
from exactedit.solvers.tail.scores import concat as concat_scores

__all__ = ["HeadSolveResult", "solve_head", "write_head_bundle"]

Progress = Callable[[int, int], None]


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
    ledger_head: dict | None = None   # the ledger's head at the end of the solve (its test entry included)

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


@dataclass(frozen=True, eq=False)
class _Setup:
    """What a solve reads before any pass: the tail, the protocol's tokens, the rows, S."""

    tail: object
    head_name: str
    vocab: list
    resolved: object              # evals.protocol.protocol.ResolvedTokens
    given: dict                   # role -> [RoleRows]
    edit: EditSet
    openers: tuple[int, ...]
    closers: tuple[int, ...]
    sel_ids: tuple[int, ...]      # tokens whose base logits every pass keeps
    device_head: object = None    # the head on the solve's JAX device (stream_jax.DeviceRows), or None: host passes


def _setup(cfg: HeadSolveConfig, proto, splits, g, train, dev, test, device=None) -> _Setup:
    from exactedit.solvers.tail.model import load_tail

    tail = load_tail(g)
    head_name = check_head_tail(tail)
    vocab = [tail.tokens.piece(i) for i in range(tail.spec.vocab)]
    resolved = resolve_protocol_tokens(proto, vocab)
    given = gather_inputs(proto, splits, {"train": train, "dev": dev, "test": test}, tail.dump_expect())
    openers = resolve_head_tokens(cfg.openers, vocab, "--opener")
    closers = resolve_head_tokens(cfg.closers, vocab, "--closer")
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
        from exactedit.solvers.tail.passes.device_pass import to_device

        device_head = to_device(tail.head, device)
    return _Setup(tail, head_name, vocab, resolved, given, edit, openers, closers, sel_ids, device_head)


def _solve_head(cfg: HeadSolveConfig, *, model, train: Sequence, dev: Sequence, protocol, test: Sequence,
                workspace, command: str, device, progress: Progress | None) -> HeadSolveResult:
    """`solve_head` on a resolved device (None: the host passes)."""
    clock = {"start": time.perf_counter()}
    proto = load_protocol(protocol)
    with Ledger.open(workspace) as ledger, gguf.open(model) as g:
        record = require_registered(ledger, proto, command, cfg.unregistered)
        su = _setup(cfg, proto, solve_splits(proto, ledger, cfg.unregistered), g, train, dev, test, device)
        tail, resolved, given, edit, V = su.tail, su.resolved, su.given, su.edit, su.tail.spec.vocab
        passes = len(given["train"]) + len(given["dev"]) + len(given["anchors"]) + len(given["test"])
        tick = _Ticker(progress, passes * V + proto.stopping.max_steps)

        def gather(rows):
            return gather_head_rows(tail, rows, edit.ids, su.sel_ids, cfg.tile_rows, tick.phase, su.device_head)

        train_rd, dev_rd = gather(given["train"]), gather(given["dev"])
        anchor_rds = [gather([rr]) for rr in given["anchors"]]
        hold = _hold_rows(cfg.hold, anchor_rds, su.vocab)
        clock["pass"] = time.perf_counter()

        head = load_head_rows(g, su.head_name, edit.ids, runtime=tail.head.runtime)
        clock["head"] = time.perf_counter()
        rows = solve_rows(
            HeadInputs(tail=tail, train=train_rd, dev=dev_rd,
                       anchors=tuple((rr.trace, rd) for rr, rd in zip(given["anchors"], anchor_rds)), edit=edit,
                       style=resolved.style, specials=resolved.specials, turn_end=resolved.turn_end,
                       openers=su.openers, closers=su.closers, head=head, device=device, hold=hold,
                       decision_bits=role_bits(proto.bars.persona_decision)),
            cfg, stopping=proto.stopping, progress=tick.phase(proto.stopping.max_steps))
        clock["steps"] = clock["head"] + rows.seconds
        shipped = rows.shipped

        def bars_with(scores, role):
            return persona_bars(concat_scores(scores, chunks=False),
                                BarContext(tokens=resolved, bars=proto.bars, heldout_role=role))

        has_edit = rows.has_edit
        dumps = tuple((f"{rr.role}:{rr.trace}", str(rr.path), rr.dump.sha256())
                      for role in ("train", "dev", "test", "anchors") for rr in given[role])
        *_, identity = head_bundle_plan(model, g.sha256(), proto.path, proto.sha256, dumps, cfg, head,
                                        shipped if has_edit else None)
        outcome, bars = score_head_test(
            ledger, record, command, bool(given["test"]), has_edit, identity,
            lambda: _score_test(su, given["test"], cfg, rows, bars_with, tick),
            lambda: bars_with(rows.row_scores, "dev"))
        clock["end"] = time.perf_counter()
        return HeadSolveResult(
            config=cfg, protocol=proto.name, protocol_sha256=proto.sha256, protocol_path=proto.path,
            marker=record.marker, model=str(model), model_sha256=g.sha256(), inputs=dumps, edit_set=edit,
            edit_tokens=tuple(su.vocab[i] for i in edit.ids), n_params=rows.n_params,
            anchor_energy_kept=rows.anchor_energy_kept, term_rows=rows.term_rows,
            stopping=dict(proto.stopping.__dict__), trajectory=rows.trajectory, losses=rows.losses,
            chosen_step=rows.chosen_step, rows_changed=int(shipped.changed.sum()), quant_rel_error=shipped.rel_error,
            edit_norm_ratio=rows.edit_norm_ratio, splits=rows.splits, anchors=rows.anchors, test=outcome,
            bars=tuple(bars),
            seconds={"vocab_pass": clock["pass"] - clock["start"], "adam_step": rows.seconds_per_step,
                     "steps": clock["steps"] - clock["pass"], "total": clock["end"] - clock["start"]},
            bundle_sha256=identity, head=head, shipped=shipped, ledger_head=head_json(ledger))


def _hold_rows(hold: str, anchors: Sequence, vocab: Sequence[str]):
    """The anchors traces' rows `HeadSolveConfig.hold` names (RowData), or None: "paragraph" takes
    the rows that predict a paragraph's first token (`solvers.tail.decision.paragraph_starts`)."""
    if hold == "none" or not anchors:
        return None
    from exactedit.solvers.head.rowdata import concat

    picked = [rd.take(np.flatnonzero(paragraph_starts(rd.tokens, rd.doc, rd.next, vocab.__getitem__)))
              for rd in anchors]
    return concat(picked)


def _score_test(su: _Setup, test_rows, cfg, rows: HeadRowsResult, bars_with, tick: _Ticker):
    """Test rows: one pass each, the exact effect, the split report and the bars with test held out."""
    rd = gather_head_rows(su.tail, test_rows, su.edit.ids, su.sel_ids, cfg.tile_rows, tick.phase, su.device_head)
    report, part = rows.score_rows("test", rd)
    return report, bars_with([*rows.row_scores, part], "test")


def write_head_bundle(r: HeadSolveResult, out, *, overwrite: bool = False):
    """The bundle of a solve: the row patch of the shipped edit (none when no step qualified),
    report.json, report.txt, trajectory.png, and the manifest (inputs' sha256, config, trajectory).
    Its identity is `r.bundle_sha256`, the key test was scored under."""
    from exactedit.solvers.bundle import write_bundle
    from exactedit.runs.solve import head_report as report

    inputs, cfg, edits, ident = head_bundle_plan(r.model, r.model_sha256, r.protocol_path, r.protocol_sha256, r.inputs,
                                                 r.config, r.head, r.shipped if r.shipped_edit else None)
    full = report.result_json(r)
    record = {k: full[k] for k in ("marker", "edit_set", "stopping", "chosen_step", "shipped_edit", "rows_changed",
                                   "quant_rel_error", "trajectory", "test")}
    files = {"report.json": json.dumps(full, indent=1).encode(), "report.txt": report.summary_table(r).encode(),
             "trajectory.png": report.trajectory_png(r)}
    b = write_bundle(out, solver="head", inputs=inputs, config=cfg, edits=edits, files=files, record=record,
                     ledger_head=r.ledger_head, overwrite=overwrite)
    if b.sha256 != r.bundle_sha256 or ident != r.bundle_sha256:
        raise HeadSolveError(out, "identity", f"bundle identity {b.sha256} differs from the solve's {r.bundle_sha256}")
    return b


def solve_head(cfg: HeadSolveConfig, *, model, train: Sequence, dev: Sequence, protocol, test: Sequence = (),
               workspace=DEFAULT_WORKSPACE, command: str = "exactedit solve head", device="auto",
               progress: Progress | None = None) -> HeadSolveResult:
    """Run a head solve; nothing is written except ledger entries (see `write_head_bundle`). Every
    JAX matmul runs in exact float32 (HIGHEST): TF32 / bf16 are opt-in (solvers.tail.forward.device), never a
    GPU's silent default. `device` ("cpu", "gpu", "auto" or a jax.Device; `pass_device`): on "cpu",
    and on "auto" without a GPU, the passes and dev tracking are the host numpy path; else they run on
    the device (`vocab_pass_jax`, exact mode, and the float64 DeviceTracker there)."""
    from exactedit.solvers.tail.forward.device import DeviceConfig, pass_device, scope

    dev_ = pass_device(device)
    with scope(DeviceConfig(), device=dev_):
        return _solve_head(cfg, model=model, train=train, dev=dev, protocol=protocol, test=test,
                           workspace=workspace, command=command, device=dev_, progress=progress)
