"""What the `exactedit eval ...` commands print: each result as (JSON object, text), so the CLI only
chooses between them. The bar tables themselves come from evals.scoring.report (`format_table`)."""
from __future__ import annotations

from exactedit.runs.eval.blind import comparison_json, fmt
from exactedit.evals.scoring.report import format_table, report_from_json, report_to_json

__all__ = ["blind_report", "export_report", "ledger_report", "recorded_test_report", "register_report",
           "score_report", "split_report", "test_report"]


def register_report(r) -> tuple[dict, str]:
    """`eval register` (an runs.eval.workflow register result)."""
    obj = {"name": r.record.name, "sha256": r.record.sha256, "entry": r.record.seq, "traces": dict(r.trace_sha256)}
    return obj, (f"registered protocol {r.record.name!r} sha256 {r.record.sha256} "
                 f"(ledger entry {r.record.seq}, {len(r.trace_sha256)} traces)")


def split_report(r) -> tuple[dict, str]:
    """`eval split`: the split's hash, counts and each document's role."""
    docs = [{"trace": d.trace, "doc": d.doc, "group": d.group, "role": d.role} for d in r.splits.docs]
    lines = ([r.record.marker] if r.record.marker else []) + [f"split {r.splits.sha256}: {r.splits.counts()}"]
    lines += [f"  {d['role']:<10} {d['trace']}/{d['doc']}  ({d['group']})" for d in docs]
    return {"sha256": r.splits.sha256, "marker": r.record.marker, "docs": docs}, "\n".join(lines)


def score_report(r) -> tuple[dict, str]:
    """`eval score`: the dev bars and where the report went."""
    files = {k: str(v) for k, v in r.files.paths.items()}
    return ({**report_to_json(r.report), "files": files, "entry": r.seq},
            format_table(r.report) + f"\nwrote {files['json']} (ledger entry {r.seq})")


def test_report(r) -> tuple[dict, str]:
    """`eval test`: the test bars, recorded once."""
    return ({**report_to_json(r.report), "entry": r.seq},
            format_table(r.report) + f"\nrecorded as ledger entry {r.seq}")


def recorded_test_report(recorded: dict) -> tuple[dict, str]:
    """A refused repeat of `eval test`: the recorded result."""
    return recorded, "recorded test result:\n" + format_table(report_from_json(recorded))


def blind_report(r) -> tuple[dict, str]:
    """`eval blind` (an runs.eval.blind.BlindResult): the bars, the comparison with dev, the verdict."""
    obj = {"passed": r.passed, "comparisons": [comparison_json(c) for c in r.comparisons],
           "report": report_to_json(r.report), "files": {k: str(v) for k, v in r.files.paths.items()}}
    lines = [format_table(r.report), "against the dev report:"]
    lines += [f"  {c.metric:<36} dev {fmt(c.dev)}  blind {fmt(c.blind)}  bound {c.op} {fmt(c.allowed)}  "
              f"{'pass' if c.passed else 'FAIL'}" for c in r.comparisons]
    lines.append(f"SIGN-OFF: {'PASS' if r.passed else 'FAIL'}  (wrote {r.files.paths['md']})")
    return obj, "\n".join(lines)


def export_report(r) -> tuple[dict, str]:
    """`eval ledger --export`: the head written."""
    return r.to_dict(), f"wrote {r.path}: head entry {r.seq} {r.hash} of {r.ledger}"


def ledger_report(entries) -> tuple[list, str]:
    """`eval ledger`: one line per entry."""
    rows = [{"seq": e.seq, "time": e.time, "kind": e.kind, "command": e.command} for e in entries]
    return rows, "\n".join(f"{e['seq']:>4}  {e['time']}  {e['kind']:<12} {e['command']}" for e in rows)
