"""The one-shot blind sign-off (SPEC.md section 7).

A fresh document nobody tuned on, the untouched bundle (by sha256), one run, no changes. Before
anything is computed the ledger must show: an intact chain; the dev report given, recorded by an
`eval score` run of this very bundle under this protocol; no earlier blind run of this document or
this bundle; the document never read by a score or test run, and not registered as a trace of
any protocol in a role other than blind; and, in the user-level registry shared by every workspace
(evals.protocol.registry), no earlier run of this document or this bundle from any workspace. Then the run
is claimed in the registry and the ledger first (so an interrupted run still counts as the one
run), computed, compared with the dev numbers, written (markdown, JSON, PNG; the sign-off records
the ledger head after its claim, an anchor for evals.protocol.anchors) and recorded in both.

It passes when each compared number lands within `factor` (1.5) of the dev report's:
- slop residual, 1 - reduction of (c) (= mean p'(rejected) / mean p(rejected)): blind <= factor x dev;
- (f) argmax flips to specials: blind <= factor x dev (so 0 stays 0);
- (g) non-slop KLD: blind <= factor x dev;
- (g) ordinary-token mean dlogp, a signed change: blind >= -factor x |dev|.
A number missing (n/a) on either side fails its comparison.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from exactedit.evals.protocol.ledger import Ledger, ProtocolRecord, head_json, ledger_id
from exactedit.evals.protocol.registry import BlindRegistry
from exactedit.evals.scoring.report import BarReport, ReportError, WrittenFiles, report_to_json, write_report

SEEN_KINDS = ("score", "test")


@dataclass(frozen=True)
class BlindComparison:
    metric: str
    dev: float
    blind: float
    allowed: float
    op: str
    passed: bool


@dataclass(frozen=True)
class BlindResult:
    passed: bool
    comparisons: tuple[BlindComparison, ...]
    report: BarReport
    files: WrittenFiles
    claim_seq: int
    result_seq: int
    bundle_sha256: str
    doc_sha256: str


def _get(r: BarReport, key: str) -> float:
    row = r.row(key)
    return math.nan if row is None or row.passed is None else row.number


def compare_to_dev(dev: BarReport, blind: BarReport, factor: float) -> tuple[BlindComparison, ...]:
    """The four comparisons of the sign-off, each with the bound it had to meet."""
    out = []
    for metric, key, harm in (("slop residual (1 - (c) reduction)", "c_reduction", lambda x: 1.0 - x),
                              ("(f) argmax flips to specials", "f_flips", lambda x: x),
                              ("(g) non-slop mean KLD", "g_kld", lambda x: x)):
        d, b = harm(_get(dev, key)), harm(_get(blind, key))
        allowed = factor * d
        ok = bool(math.isfinite(d) and math.isfinite(b) and b <= allowed)
        out.append(BlindComparison(metric, d, b, allowed, "<=", ok))
    d, b = _get(dev, "g_ordinary"), _get(blind, "g_ordinary")
    allowed = -factor * abs(d)
    out.append(BlindComparison("(g) ordinary-token mean dlogp", d, b, allowed, ">=",
                               bool(math.isfinite(d) and math.isfinite(b) and b >= allowed)))
    return tuple(out)


def dev_settings(dev: BarReport, path, protocol=None) -> tuple[str, tuple[str, ...]]:
    """What the blind run repeats of the dev run, from the dev report at `path`: the protocol file
    (`protocol` when given, else the report's meta.protocol) and the shaping rules (meta.shapes). A
    field missing or of the wrong type is a ReportError naming the report and the field (a number
    there was a TypeError traceback)."""
    meta = dev.meta
    if protocol is None:
        protocol = meta.get("protocol")
        if not isinstance(protocol, str) or not protocol.strip():
            why = "missing" if protocol is None else f"expected the protocol file's path, got {protocol!r:.80}"
            raise ReportError(path, "meta.protocol", f"{why}; give --protocol")
    shapes = meta.get("shapes", [])
    if not isinstance(shapes, list) or not all(isinstance(s, str) for s in shapes):
        raise ReportError(path, "meta.shapes", f"expected a list of shaping rules (strings), got {shapes!r:.80}")
    return str(protocol), tuple(shapes)


def run_blind(ledger: Ledger, *, record: ProtocolRecord, bundle_sha256: str, doc_sha256: str,
              dev_report: BarReport, dev_report_sha256: str, compute: Callable[[], BarReport], out_dir,
              command: str, registry: BlindRegistry, factor: float = 1.5,
              inputs: Mapping[str, str] | None = None) -> BlindResult:
    """Check the ledger and the user-level registry, claim the run in both, compute once, compare
    with dev, write and record."""
    ledger.require_intact()
    ins = {"bundle": bundle_sha256, "doc": doc_sha256, "dev_report": dev_report_sha256, **(inputs or {})}

    def refuse(why: str):
        return ledger.refuse(command, ins, why)

    scored = [e for e in ledger.entries("score") if e.payload.get("report_sha256") == dev_report_sha256]
    if not scored:
        raise refuse(f"the dev report (sha256 {dev_report_sha256}) was not written by a recorded `eval score` run")
    dev_entry = scored[0].payload
    if dev_entry.get("heldout_role") != "dev":
        raise refuse(f"the report given scores the {dev_entry.get('heldout_role')!r} role, not dev")
    if dev_entry.get("bundle_sha256") != bundle_sha256:
        raise refuse(f"bundle sha256 {bundle_sha256} is not the registered one: the dev report scored "
                     f"{dev_entry.get('bundle_sha256')}")
    if dev_entry.get("protocol_sha256") != record.sha256:
        raise refuse("the dev report was scored under another protocol")
    for e in ledger.entries("blind"):
        if e.payload.get("doc_sha256") == doc_sha256:
            raise refuse(f"document {doc_sha256} already had its blind run (entry {e.seq})")
        if e.payload.get("bundle_sha256") == bundle_sha256:
            raise refuse(f"bundle {bundle_sha256} already had its blind run (entry {e.seq})")
    for e in ledger.entries():
        if e.kind in SEEN_KINDS and doc_sha256 in e.inputs.values():
            raise refuse(f"document {doc_sha256} was already used by a {e.kind} run (entry {e.seq}); "
                         "a blind document must be fresh")
        if e.kind == "register":
            for name, role in e.payload.get("traces", {}).items():
                if role != "blind" and e.inputs.get(f"trace:{name}") == doc_sha256:
                    raise refuse(f"document {doc_sha256} is trace {name!r} ({role}) of protocol "
                                 f"{e.payload.get('name')!r}; a blind document must be fresh")
    where = ledger_id(ledger)
    run, earlier = registry.claim(bundle_sha256, doc_sha256, where, command)
    if earlier is not None:
        what, first = earlier
        sha = doc_sha256 if what == "document" else bundle_sha256
        why = f"{what} {sha} already had its blind run ({first.describe()})"
        registry.event(first.id, "refused", where, detail={"bundle_sha256": bundle_sha256, "doc_sha256": doc_sha256,
                                                           "command": command, "reason": why})
        raise refuse(why)
    claim = ledger.append("blind", command, ins, {"doc_sha256": doc_sha256, "bundle_sha256": bundle_sha256,
                                                  "protocol_sha256": record.sha256, "status": "claimed",
                                                  "registry": str(registry.path), "registry_run": run.id})
    registry.event(run.id, "ledger-claim", where, claim.seq, claim.hash)
    report = compute()
    comps = compare_to_dev(dev_report, report, factor)
    passed = all(c.passed for c in comps)
    meta = dict(report.meta, bundle_sha256=bundle_sha256, doc_sha256=doc_sha256,
                dev_report_sha256=dev_report_sha256, blind_claim=claim.seq, signoff="pass" if passed else "fail",
                ledger_head=head_json(ledger))
    report = BarReport("blind", report.heldout_role, report.rows, report.verdict, report.phrases, report.kld,
                       meta, record.marker)
    files = write_report(report, Path(out_dir), "signoff", title="Blind sign-off",
                         extra_md=comparison_markdown(comps, passed, factor))
    done = ledger.append("blind-result", command, {**ins, **{f"out:{k}": v for k, v in files.sha256.items()}},
                         {"claim": claim.seq, "passed": passed, "factor": factor,
                          "comparisons": [comparison_json(c) for c in comps], "report": report_to_json(report)})
    registry.event(run.id, "result", where, done.seq, done.hash, {"passed": passed})
    return BlindResult(passed, comps, report, files, claim.seq, done.seq, bundle_sha256, doc_sha256)


def fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else "n/a"


def comparison_json(c: BlindComparison) -> dict:
    """JSON-safe (a number missing on either side is null)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in c.__dict__.items()}


def comparison_markdown(comps, passed: bool, factor: float) -> str:
    lines = [f"## Against the dev report (within {factor}x)", "",
             "| number | dev | blind | bound | |", "|---|---|---|---|---|"]
    lines += [f"| {c.metric} | {fmt(c.dev)} | {fmt(c.blind)} | {c.op} {fmt(c.allowed)} | "
              f"{'pass' if c.passed else 'FAIL'} |" for c in comps]
    return "\n".join(lines + ["", f"Sign-off: **{'PASS' if passed else 'FAIL'}**", ""])
