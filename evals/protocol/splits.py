"""Train / dev / test splits by document group, fixed before any solve and kept in the ledger.

Documents of `pool` traces are grouped by the protocol's keys (source and character); whole groups
go to train, dev or test, in a seeded permutation of the sorted group keys with largest-remainder
shares, so reruns give the same split. Documents of traces with a fixed role keep it. A group may
never sit in two of train / dev / test / blind. Bar (b)'s same-document held-out positions are
drawn per trace, stratified twice: each train document gives at most round(share x its slop
positions) (so a document with one position keeps it for train) and each banned word (a phrase's final
token) at most round(share x its positions), in a seeded order; a per-document draw alone can leave
a phrase almost nothing to train on (docs/real-model.md: 7 of 10 positions of one phrase held out by one draw).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping, Protocol as _Proto, Sequence

import numpy as np

from exactedit.evals.protocol.ledger import Ledger, ProtocolRecord, canonical
from exactedit.evals.protocol.protocol import Protocol, ProtocolError, SplitRule

SPLIT_ROLES = ("train", "dev", "test")
EXCLUSIVE_ROLES = ("train", "dev", "test", "blind")


class DocLike(_Proto):
    name: str
    source: str
    character: str


@dataclass(frozen=True)
class DocAssignment:
    trace: str
    doc: str
    source: str
    character: str
    group: str
    role: str


@dataclass(frozen=True)
class Splits:
    """Every document of every trace with its role; `sha256` identifies the split."""

    protocol_sha256: str
    seed: int
    same_doc_heldout: float
    docs: tuple[DocAssignment, ...]

    def to_json(self) -> dict:
        return {"protocol_sha256": self.protocol_sha256, "seed": self.seed,
                "same_doc_heldout": self.same_doc_heldout,
                "docs": [[d.trace, d.doc, d.source, d.character, d.group, d.role] for d in self.docs]}

    @classmethod
    def from_json(cls, obj: Mapping) -> "Splits":
        return cls(obj["protocol_sha256"], int(obj["seed"]), float(obj["same_doc_heldout"]),
                   tuple(DocAssignment(*row) for row in obj["docs"]))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(canonical(self.to_json()).encode("utf-8")).hexdigest()

    def role(self, trace: str, doc: str) -> str:
        for d in self.docs:
            if d.trace == trace and d.doc == doc:
                return d.role
        raise KeyError(f"document {doc!r} of trace {trace!r} is not in the split")

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.docs:
            out[d.role] = out.get(d.role, 0) + 1
        return out


def group_key(doc: DocLike, rule: SplitRule) -> str:
    """The group a document belongs to; a document with none of the keys set is its own group."""
    parts = [f"{k}={getattr(doc, k) or ''}" for k in rule.by]
    if all(not getattr(doc, k) for k in rule.by):
        parts.append(f"doc={doc.name}")
    return "|".join(parts)


def allocate(n_groups: int, shares: Sequence[float]) -> list[int]:
    """Largest-remainder counts of `n_groups` for `shares`; every nonzero share gets at least one
    group while there are enough groups, taken from the largest count."""
    exact = [s * n_groups for s in shares]
    counts = [int(np.floor(e)) for e in exact]
    order = sorted(range(len(shares)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: n_groups - sum(counts)]:
        counts[i] += 1
    for i, s in enumerate(shares):
        if s > 0 and counts[i] == 0:
            donor = max(range(len(shares)), key=lambda j: (counts[j], -j))
            if counts[donor] > 1:
                counts[donor] -= 1
                counts[i] += 1
    return counts


def build_splits(protocol: Protocol, docs_by_trace: Mapping[str, Sequence[DocLike]]) -> Splits:
    """Assign every document a role under the protocol's split rule (pure, deterministic)."""
    rule = protocol.split
    fixed: dict[str, str] = {}
    rows: list[tuple[str, DocLike, str]] = []
    for trace in protocol.traces:
        if trace.name not in docs_by_trace:
            raise ProtocolError(protocol.path, f"traces.{trace.name}", "no documents were given for this trace")
        for doc in docs_by_trace[trace.name]:
            g = group_key(doc, rule)
            rows.append((trace.name, doc, g))
            if trace.role in EXCLUSIVE_ROLES:
                if fixed.setdefault(g, trace.role) != trace.role:
                    raise ProtocolError(protocol.path, f"traces.{trace.name}",
                                        f"group {g!r} is both {fixed[g]} and {trace.role}")
    role_of = {t.name: t.role for t in protocol.traces}
    pooled = sorted({g for t, _, g in rows if role_of[t] == "pool"})
    clash = [g for g in pooled if g in fixed]
    if clash:
        raise ProtocolError(protocol.path, "traces", f"pooled group {clash[0]!r} also appears in a "
                            f"fixed {fixed[clash[0]]} trace; a group is never split")
    perm = np.random.default_rng(rule.seed).permutation(len(pooled))
    counts = allocate(len(pooled), (rule.train, rule.dev, rule.test))
    bounds = np.cumsum(counts)
    pooled_role = {pooled[int(p)]: SPLIT_ROLES[int(np.searchsorted(bounds, i, side="right"))]
                   for i, p in enumerate(perm)}
    docs = tuple(
        DocAssignment(t, d.name, d.source or "", d.character or "", g,
                      pooled_role[g] if role_of[t] == "pool" else role_of[t])
        for t, d, g in rows)
    return Splits(protocol.sha256, rule.seed, rule.same_doc_heldout, docs)


def _share_of(share: float, n: int) -> int:
    return int(np.floor(share * n + 0.5))


def same_doc_heldout(splits: Splits, trace: str, docs: Sequence[str], positions: np.ndarray,
                     phrases: Sequence[int]) -> np.ndarray:
    """Boolean mask over one trace's train slop positions (`docs[i]`: the document of position i,
    `positions[i]`: its row in that document's dump, `phrases[i]`: its phrase's group, the banned word): the ones
    held out for bar (b). A position is held out when, in a seeded order of all of them, its document
    has not yet given round(share x its positions) and its group has not yet given round(share x its
    positions). The order is a permutation seeded from the split seed and the trace over the
    positions sorted by (document, row), so it does not depend on the order they are given in."""
    docs = np.asarray([str(d) for d in docs], dtype=object)
    positions, phrases = np.asarray(positions, dtype=np.int64), np.asarray(phrases, dtype=np.int64)
    if not len(docs) == len(positions) == len(phrases):
        raise ValueError(f"same_doc_heldout: {len(docs)} documents, {len(positions)} positions and "
                         f"{len(phrases)} phrases given; one of each per position")
    share = splits.same_doc_heldout
    doc_left = {d: _share_of(share, int(c)) for d, c in zip(*np.unique(docs, return_counts=True))}
    phrase_left = {int(p): _share_of(share, int(c)) for p, c in zip(*np.unique(phrases, return_counts=True))}
    canonical_order = sorted(range(len(docs)), key=lambda i: (docs[i], int(positions[i])))
    digest = hashlib.sha256(f"{splits.seed}\0{trace}".encode("utf-8")).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    mask = np.zeros(len(docs), dtype=bool)
    for k in rng.permutation(len(docs)):
        i = canonical_order[int(k)]
        d, p = docs[i], int(phrases[i])
        if doc_left[d] > 0 and phrase_left[p] > 0:
            mask[i] = True
            doc_left[d] -= 1
            phrase_left[p] -= 1
    return mask


def record_splits(ledger: Ledger, record: ProtocolRecord, splits: Splits, command: str,
                  dump_hashes: Mapping[str, str]) -> Splits:
    """Write the split into the ledger once per protocol. A rerun that gives the same split returns
    the recorded one; a different split for the same protocol (changed dumps) is refused."""
    ledger.require_intact()
    for e in ledger.entries("split"):
        if e.payload.get("protocol_sha256") != splits.protocol_sha256:
            continue
        if e.payload.get("splits_sha256") == splits.sha256:
            return Splits.from_json(e.payload["splits"])
        raise ledger.refuse(command, dict(dump_hashes),
                            f"protocol {record.name!r} already has a different split (entry {e.seq}); "
                            "splits are fixed before the first solve")
    ledger.append("split", command, {"protocol": record.sha256, **{f"trace:{k}": v for k, v in dump_hashes.items()}},
                  {"protocol_sha256": splits.protocol_sha256, "splits_sha256": splits.sha256,
                   "splits": splits.to_json(), "registered": record.registered})
    return splits


def recorded_splits(ledger: Ledger, protocol_sha256: str) -> Splits | None:
    """The split recorded for a protocol, or None."""
    for e in ledger.entries("split"):
        if e.payload.get("protocol_sha256") == protocol_sha256:
            return Splits.from_json(e.payload["splits"])
    return None
