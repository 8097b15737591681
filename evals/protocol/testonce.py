"""Test once: the test split of a bundle is scored a single time, and the ledger keeps the result.

The first request computes (through the caller's `compute` function), records the result with the
bundle's sha256, and returns it. Every later request for the same bundle is refused without
computing anything: the refusal is recorded and carries the first result, which the CLI prints.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from exactedit.evals.protocol.ledger import Ledger, ProtocolRecord


@dataclass(frozen=True)
class OnceResult:
    """The test result as recorded in ledger entry `seq`."""

    bundle_sha256: str
    protocol_sha256: str
    seq: int
    result: Mapping[str, Any]
    marker: str = ""


def recorded_test(ledger: Ledger, bundle_sha256: str) -> OnceResult | None:
    """The recorded test scoring of a bundle, or None."""
    for e in ledger.entries("test"):
        if e.payload.get("bundle_sha256") == bundle_sha256:
            return OnceResult(bundle_sha256, e.payload["protocol_sha256"], e.seq, e.payload["result"],
                                  e.payload.get("marker", ""))
    return None


def score_test_once(ledger: Ledger, bundle_sha256: str, record: ProtocolRecord,
                    compute: Callable[[], Mapping[str, Any]], command: str,
                    inputs: Mapping[str, str] | None = None) -> OnceResult:
    """Score the test split of `bundle_sha256` once. `compute()` returns a JSON-able result (e.g.
    `report_to_json(...)`); it is called only when the ledger has no test entry for the bundle.
    A repeat raises LedgerRefusal whose `recorded` is the first result."""
    ledger.require_intact()
    first = recorded_test(ledger, bundle_sha256)
    if first is not None:
        raise ledger.refuse(command, {"bundle": bundle_sha256},
                            f"the test split was already scored for bundle {bundle_sha256} (entry {first.seq}); "
                            "test is read once: the recorded result stands and is not recomputed",
                            recorded=first.result)
    result = dict(compute())
    e = ledger.append("test", command, {"bundle": bundle_sha256, "protocol": record.sha256, **(inputs or {})},
                      {"bundle_sha256": bundle_sha256, "protocol_sha256": record.sha256,
                       "registered": record.registered, "marker": record.marker, "result": result})
    return OnceResult(bundle_sha256, record.sha256, e.seq, result, record.marker)
