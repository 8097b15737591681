"""The `exactedit eval ...` commands as library calls: each opens the workspace's ledger, checks
what the protocol requires, does its one job and records it. The CLI only parses flags and prints.

- `register`: the protocol's sha256 and its traces' dump hashes;
- `split`: the splits from the traces' documents (the same on every rerun);
- `score`: dev bars of a model + bundle / edited GGUF / shaping rules, report files, recorded
  with the report's sha256 (the dev report a blind run compares against);
- `test`: the test bars of a bundle, once;
- `blind`: the one-shot blind sign-off (once per document and per bundle across every workspace,
  through the user-level registry, evals.protocol.registry).

Every dump is opened with its field hashes verified (a tampered field is refused naming dump and
field), once per command (a dumps.VerifyCache per call), and every trace read must still be the
dump registered with the protocol. Reports record the ledger head when written (`ledger_head`,
checked by `exactedit eval ledger --verify --against`, evals.protocol.anchors).
"""
from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

from exactedit.runs.eval.blind import BlindResult, dev_settings, run_blind
from exactedit.evals.scoring.evaluate import EvalError, KnownRows, ScoreConfig, TraceInput, protocol_traces, score_traces
from exactedit.dumps import VerifyCache
from exactedit.evals.protocol.ledger import (
    Ledger, LedgerRefusal, ProtocolRecord, head_json, register_protocol, require_registered,
)
from exactedit.evals.protocol.registry import BlindRegistry
from exactedit.evals.protocol.protocol import Protocol, load_protocol
from exactedit.evals.scoring.report import (BarReport, ReportError, WrittenFiles, read_report, report_from_json,
                                            report_to_json, write_report)
from exactedit.evals.protocol.splits import Splits, build_splits, record_splits, recorded_splits
from exactedit.evals.protocol.testonce import score_test_once

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class RegisterResult:
    record: ProtocolRecord
    trace_sha256: Mapping[str, str]


@dataclass(frozen=True)
class SplitResult:
    record: ProtocolRecord
    splits: Splits


@dataclass(frozen=True)
class ScoreResult:
    report: BarReport
    files: WrittenFiles
    seq: int
    bundle_sha256: str


@dataclass(frozen=True)
class ScoredTest:
    report: BarReport
    files: WrittenFiles
    seq: int
    bundle_sha256: str


def _dump_hashes(protocol: Protocol, cache=None) -> dict[str, str]:
    """Each trace's verified dump identity (its data's sha256)."""
    from exactedit.dumps import read_dump

    return {t.name: read_dump(t.path, check_finite=False, cache=cache).sha256() for t in protocol.traces}


def register(protocol_path, workspace, command: str) -> RegisterResult:
    """Record the protocol file's sha256 and its traces' dump hashes."""
    protocol = load_protocol(protocol_path)
    hashes = _dump_hashes(protocol)
    with Ledger.open(workspace) as ledger:
        return RegisterResult(register_protocol(ledger, protocol, command, hashes), hashes)


def _registration_hashes(ledger: Ledger, record: ProtocolRecord) -> dict[str, str]:
    for e in ledger.entries("register"):
        if e.seq == record.seq:
            return {k[len("trace:"):]: v for k, v in e.inputs.items() if k.startswith("trace:")}
    return {}


def _require_registered_dumps(ledger: Ledger, record: ProtocolRecord, hashes: Mapping[str, str],
                              command: str) -> None:
    """Refuse (and record) a trace whose dump is not the one registered with the protocol."""
    for name, sha in _registration_hashes(ledger, record).items():
        if name in hashes and hashes[name] != sha:
            raise ledger.refuse(command, dict(hashes), f"trace {name!r} changed since the protocol was registered "
                                f"(registered dump sha256 {sha}, now {hashes[name]})")


def split(protocol_path, workspace, command: str, unregistered: bool = False) -> SplitResult:
    """Build the splits from the traces' documents and record them (a rerun returns the same)."""
    from exactedit.dumps import read_dump

    protocol = load_protocol(protocol_path)
    with Ledger.open(workspace) as ledger:
        record = require_registered(ledger, protocol, command, unregistered)
        dumps = {t.name: read_dump(t.path, check_finite=False) for t in protocol.traces}
        hashes = {k: d.sha256() for k, d in dumps.items()}
        for name, sha in _registration_hashes(ledger, record).items():
            if hashes.get(name) != sha:
                raise ledger.refuse(command, hashes, f"trace {name!r} changed since the protocol was registered "
                                    f"(registered dump sha256 {sha}, now {hashes.get(name)})")
        splits = build_splits(protocol, {k: d.docs for k, d in dumps.items()})
        return SplitResult(record, record_splits(ledger, record, splits, command, hashes))


def _read_hashes(traces, cache) -> dict[str, str]:
    """Verified dump identities of the traces a run reads (the cache keeps them for the scoring)."""
    from exactedit.dumps import read_dump

    return {t.name: read_dump(t.path, check_finite=False, cache=cache).sha256() for t in traces}


def _splits_or_error(ledger: Ledger, protocol: Protocol) -> Splits:
    splits = recorded_splits(ledger, protocol.sha256)
    if splits is None:
        raise EvalError(f"no split recorded for protocol {protocol.name!r} in {ledger.path}: "
                        "run `exactedit eval split` first")
    return splits


@contextlib.contextmanager
def edited_model(model, bundle, workspace) -> Iterator[tuple[Path | None, str]]:
    """(edited GGUF, bundle sha256): the bundle applied to a temporary copy of `model` in a
    directory of its own under WORKSPACE/tmp (unique per run: concurrent runs of one bundle do not
    share it), removed afterwards; (None, "") without a bundle."""
    if bundle is None:
        yield None, ""
        return
    from exactedit.quant import gguf
    from exactedit.solvers.apply import apply_bundle
    from exactedit.solvers.bundle import model_tensors, read_bundle

    with gguf.open(model) as g:          # the edits bounded by the model's tensors before they are read
        b = read_bundle(bundle, tensors=model_tensors(g))
    tmp = Path(workspace) / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix=f"edited-{b.sha256[:16]}-", dir=tmp))
    try:
        out = run_dir / "edited.gguf"
        apply_bundle(b, model, out)
        yield out, b.sha256
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def score(protocol_path, workspace, model, out_dir, command: str, *, bundle=None, edited=None,
          config: ScoreConfig = ScoreConfig(), unregistered: bool = False, known: KnownRows | None = None,
          progress: Progress | None = None) -> ScoreResult:
    """Dev bars of `model` edited by a bundle or an edited GGUF and/or shaping rules; writes
    dev-report.{json,md,png} into out_dir and records the report's sha256. `known`: the rows the
    bundle's own solve scored (its rescore, the same pass), read instead of a second pass; refused
    unless they are of this bundle. The report's meta says where its rows came from."""
    if config.heldout_role != "dev":
        raise EvalError("`eval score` scores the dev role; test is read by `eval test`, blind by `eval blind`")
    if bundle is not None and edited is not None:
        raise EvalError("give a bundle or an edited model, not both")
    protocol = load_protocol(protocol_path)
    with Ledger.open(workspace) as ledger:
        record = require_registered(ledger, protocol, command, unregistered)
        splits = _splits_or_error(ledger, protocol)
        traces = protocol_traces(protocol, splits, "dev")
        cache = VerifyCache()
        _require_registered_dumps(ledger, record, _read_hashes(traces, cache), command)
        with edited_model(model, bundle, workspace) as (path, bundle_sha):
            meta = {"bundle_sha256": bundle_sha, "ledger_head": head_json(ledger)}
            if known is not None:
                if not bundle_sha or known.bundle_sha256 != bundle_sha:
                    raise EvalError(f"the rows handed in are of bundle {known.bundle_sha256[:12]}..., not of "
                                    f"{bundle} ({(bundle_sha or 'none')[:12]}...)")
                meta["rows_from"] = f"solve wfld's rescore of bundle {bundle_sha} (the same KL pass)"
            scored = score_traces(protocol, model, traces, config, edited=path or edited, splits=splits,
                                  meta=meta, marker=record.marker, cache=cache, known=known, progress=progress)
        files = write_report(scored.report, out_dir, "dev-report", title="Dev report")
        e = ledger.append("score", command,
                          {"protocol": protocol.sha256, "model": scored.report.meta["model_sha256"],
                           "report": files.sha256["json"], **({"bundle": bundle_sha} if bundle_sha else {}),
                           **{f"dump:{k}": v for k, v in scored.dump_sha256.items()}},
                          {"report_sha256": files.sha256["json"], "bundle_sha256": bundle_sha,
                           "protocol_sha256": protocol.sha256, "heldout_role": "dev",
                           "verdict": scored.report.verdict, "registered": record.registered,
                           "shapes": list(config.shapes)})
    return ScoreResult(scored.report, files, e.seq, bundle_sha)


def score_test(protocol_path, workspace, model, bundle, out_dir, command: str, *,
               config: ScoreConfig | None = None, unregistered: bool = False,
               progress: Progress | None = None, release_stale_claim: bool = False) -> ScoredTest:
    """The test bars of a bundle, computed once; a repeat raises LedgerRefusal carrying the first,
    a request while another run holds the bundle's claim raises TestClaimed (evals.protocol.testonce;
    `release_stale_claim` first releases the claim of a run that is gone)."""
    config = config or ScoreConfig(heldout_role="test")
    if config.heldout_role != "test":
        raise EvalError("`eval test` scores the test role")
    protocol = load_protocol(protocol_path)
    with Ledger.open(workspace) as ledger:
        record = require_registered(ledger, protocol, command, unregistered)
        splits = _splits_or_error(ledger, protocol)
        from exactedit.solvers.bundle import read_bundle

        bundle_sha = read_bundle(bundle).sha256
        traces = protocol_traces(protocol, splits, "test")
        cache = VerifyCache()

        def compute() -> dict:
            _require_registered_dumps(ledger, record, _read_hashes(traces, cache), command)
            with edited_model(model, bundle, workspace) as (path, _):
                scored = score_traces(protocol, model, traces, config, edited=path, splits=splits,
                                      meta={"bundle_sha256": bundle_sha}, marker=record.marker, kind="test",
                                      cache=cache, progress=progress)
            return report_to_json(scored.report)

        done = score_test_once(ledger, bundle_sha, record, compute, command, release_stale=release_stale_claim)
        head = head_json(ledger)  # after the test entry: the written report anchors it
    report = report_from_json(done.result)
    report = dataclasses.replace(report, meta={**report.meta, "ledger_head": head})
    return ScoredTest(report, write_report(report, out_dir, "test-report", title="Test report"), done.seq,
                      bundle_sha)


def blind(model, bundle, doc, dev_report, workspace, out_dir, command: str, *, protocol_path=None,
          chunk_rows: int = 128, home=None, progress: Progress | None = None) -> BlindResult:
    """The one-shot blind sign-off of `bundle` on the dump `doc` (see runs.eval.blind), checked against
    and recorded in the user-level blind registry under `home` (default: EXACTEDIT_HOME)."""
    from exactedit.dumps import read_dump
    from exactedit.solvers.bundle import read_bundle

    dev, dev_sha = read_report(dev_report, "--dev-report")     # ReportError naming the file and the flag
    protocol_path, shapes = dev_settings(dev, dev_report, protocol_path)
    try:
        config = ScoreConfig(heldout_role="blind", bars="anti-slop", shapes=shapes, chunk_rows=chunk_rows)
    except ValueError as exc:
        raise ReportError(dev_report, "meta.shapes", str(exc)) from None
    protocol = load_protocol(protocol_path)
    bundle_sha = read_bundle(bundle).sha256
    cache = VerifyCache()
    d = read_dump(doc, check_finite=False, cache=cache)
    doc_sha = d.sha256()
    trace = TraceInput("blind", Path(doc), {x.name: "blind" for x in d.docs})
    with Ledger.open(workspace) as ledger, BlindRegistry.open(home) as registry:
        record = require_registered(ledger, protocol, command)

        def compute() -> BarReport:
            with edited_model(model, bundle, workspace) as (path, _):
                return score_traces(protocol, model, [trace], config, edited=path, marker=record.marker,
                                    kind="blind", cache=cache, progress=progress).report

        return run_blind(ledger, record=record, bundle_sha256=bundle_sha, doc_sha256=doc_sha, dev_report=dev,
                         dev_report_sha256=dev_sha, compute=compute, out_dir=out_dir, command=command,
                         registry=registry, factor=protocol.bars.blind_factor)


__all__ = ["LedgerRefusal", "register", "split", "score", "score_test", "blind", "edited_model"]
