"""Which rows of which dump a head solve may read, and in what role, under the protocol.

Every dump given on the command line must be one of the protocol's traces (matched by path). The
split comes from the protocol's rule (`evals.protocol.splits.build_splits`, deterministic) and must equal
the one recorded in the ledger when there is one. A `--train` dump contributes only its documents
whose split role is train; `--dev` only dev; `--test` only test (so a pooled trace may be passed to
all three). The protocol's `anchors` traces are read whole, for the KL report.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from exactedit.dumps import VerifyCache, read_dump
from exactedit.dumps.reader import load_manifest
from exactedit.evals.protocol.ledger import Ledger
from exactedit.evals.protocol.protocol import Protocol
from exactedit.solvers.tail.scores import DocMeta
from exactedit.evals.protocol.splits import Splits, build_splits, recorded_splits
from exactedit.solvers.head.config import HeadSolveError

SOLVE_ROLES = ("train", "dev", "test")


@dataclass(frozen=True)
class RoleRows:
    """The documents of one dump that play `role`: row spans (start, stop, local doc index)."""

    role: str
    trace: str
    path: Path
    dump: object                      # dumps.Dump
    spans: tuple[tuple[int, int, int], ...]
    docs: tuple[DocMeta, ...]

    @property
    def rows(self) -> int:
        return sum(b - a for a, b, _ in self.spans)


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def trace_for(protocol: Protocol, path) -> object:
    path = Path(path)
    for t in protocol.traces:
        if _same(t.path, path):
            return t
    raise HeadSolveError(path, "trace", f"is not a trace of protocol {protocol.name!r} "
                         f"({', '.join(str(t.path) for t in protocol.traces)})")


def solve_splits(protocol: Protocol, ledger: Ledger, unregistered: bool = False) -> Splits:
    """The protocol's split, which must be the one recorded in the ledger (`exactedit eval split`);
    an unregistered run may go without a recorded split (it is then computed here)."""
    docs = {t.name: load_manifest(t.path).docs for t in protocol.traces}
    splits = build_splits(protocol, docs)
    recorded = recorded_splits(ledger, protocol.sha256)
    if recorded is None and not unregistered:
        raise HeadSolveError(ledger.path, "split", f"no split recorded for protocol {protocol.name!r}: run "
                             "`exactedit eval split` first (splits are fixed before any solve)")
    if recorded is not None and recorded.sha256 != splits.sha256:
        raise HeadSolveError(protocol.path, "split", "the dumps no longer give the split recorded in the "
                             f"ledger ({recorded.sha256[:12]} vs {splits.sha256[:12]}): a dump changed")
    return splits


def role_rows(protocol: Protocol, splits: Splits, path, role: str, expect, cache=None) -> RoleRows:
    """The documents of dump `path` whose split role is `role` (field hashes verified; `cache`, a
    dumps.VerifyCache, hashes a dump given for several roles once)."""
    trace = trace_for(protocol, path)
    dump = read_dump(path, expect=expect, cache=cache)
    if dump.roles is None:
        raise HeadSolveError(path, "roles", "the dump has no roles field; solve head needs row roles "
                             "(see docs/dump-format.md, dumps.roles.infer_roles)")
    spans, docs = [], []
    for d in dump.docs:
        r = splits.role(trace.name, d.name)
        if r == role:
            spans.append((d.first_row, d.stop, len(docs)))
            docs.append(DocMeta(d.name, trace.name, r, d.source, d.character, tuple(d.tags), trace.domain))
    if not spans:
        raise HeadSolveError(path, "docs", f"no document of trace {trace.name!r} has split role {role!r}")
    return RoleRows(role, trace.name, Path(path), dump, tuple(spans), tuple(docs))


def gather_inputs(protocol: Protocol, splits: Splits, given: Mapping[str, Sequence], expect
                  ) -> dict[str, list[RoleRows]]:
    """RoleRows for each of train / dev / test (the dumps given for it) and the anchors traces."""
    out: dict[str, list[RoleRows]] = {}
    cache = VerifyCache()
    for role in SOLVE_ROLES:
        paths = list(given.get(role, ()))
        if role != "test" and not paths:
            raise HeadSolveError("solve head", role, f"no {role} dump given")
        out[role] = [role_rows(protocol, splits, p, role, expect, cache) for p in paths]
    out["anchors"] = [role_rows(protocol, splits, t.path, "anchors", expect, cache)
                      for t in protocol.traces if t.role == "anchors"]
    return out
