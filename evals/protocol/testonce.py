"""Test once: the test split of a bundle is scored a single time, and the ledger keeps the result.

A request first claims the bundle: in one IMMEDIATE ledger transaction it checks that the ledger
has neither a `test` entry nor an open `test-claim` for the bundle and appends a `test-claim`
(pid, host, time), so of two concurrent requests exactly one computes and the other is refused.
The claimant computes (through the caller's `compute` function) and records the result in a `test`
entry naming its claim. A compute that raises releases its claim (a `test-release` entry with the
error), as before nothing is recorded as the bundle's test result. A run killed between claim and
record leaves its claim open: later requests are refused, naming it, until one is made with
`release_stale=True` (`exactedit eval test --release-stale-claim`), which records a `test-release`
for it (refused while the claim's process still runs on this host). Every later request for a
scored bundle is refused without computing anything: the refusal is recorded and carries the first
result, which the CLI prints.
"""
from __future__ import annotations

import datetime as _dt
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from exactedit.evals.protocol.ledger import Entry, Ledger, LedgerRefusal, ProtocolRecord

RELEASE_FLAG = "--release-stale-claim"


@dataclass(frozen=True)
class OnceResult:
    """The test result as recorded in ledger entry `seq`."""

    bundle_sha256: str
    protocol_sha256: str
    seq: int
    result: Mapping[str, Any]
    marker: str = ""


class TestClaimed(LedgerRefusal):
    """Another run holds the bundle's test claim (ledger entry `claim`): nothing was computed."""

    __test__ = False  # not a pytest class

    def __init__(self, message: str, seq: int, claim: int):
        self.claim = claim
        super().__init__(message, seq)


def recorded_test(ledger: Ledger, bundle_sha256: str) -> OnceResult | None:
    """The recorded test scoring of a bundle, or None."""
    for e in ledger.entries("test"):
        if e.payload.get("bundle_sha256") == bundle_sha256:
            return OnceResult(bundle_sha256, e.payload["protocol_sha256"], e.seq, e.payload["result"],
                                  e.payload.get("marker", ""))
    return None


def open_claim(ledger: Ledger, bundle_sha256: str) -> Entry | None:
    """The bundle's `test-claim` that no `test` or `test-release` entry closed yet, or None."""
    closed = {e.payload.get("claim") for e in ledger.entries() if e.kind in ("test", "test-release")}
    for e in ledger.entries("test-claim"):
        if e.payload.get("bundle_sha256") == bundle_sha256 and e.seq not in closed:
            return e
    return None


def _running_here(claim: Entry) -> bool:
    """Whether the claim's process still runs on this host (unknown elsewhere, and on Windows)."""
    pid = claim.payload.get("pid")
    if claim.payload.get("host") != socket.gethostname() or not isinstance(pid, int) or sys.platform == "win32":
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists (another user's)
    return True


def _describe(claim: Entry) -> str:
    p = claim.payload
    return f"claim entry {claim.seq}: pid {p.get('pid')} on {p.get('host')}, since {p.get('time')}"


def _claim(ledger: Ledger, bundle_sha256: str, record: ProtocolRecord, command: str,
           release_stale: bool) -> Entry | LedgerRefusal:
    """In one transaction: the refusal to raise, or the new claim."""
    ins = {"bundle": bundle_sha256}
    with ledger.transaction():
        ledger.require_intact()
        first = recorded_test(ledger, bundle_sha256)
        if first is not None:
            return ledger.refuse(command, ins,
                                 f"the test split was already scored for bundle {bundle_sha256} (entry {first.seq}); "
                                 "test is read once: the recorded result stands and is not recomputed",
                                 recorded=first.result)
        held = open_claim(ledger, bundle_sha256)
        if held is not None and release_stale and _running_here(held):
            why = (f"bundle {bundle_sha256}: the run holding its test claim ({_describe(held)}) is still "
                   "running on this host; its claim was not released")
            return TestClaimed(why, ledger.refuse(command, ins, why).seq, held.seq)
        if held is not None and release_stale:
            ledger.append("test-release", command, ins,
                          {"claim": held.seq, "bundle_sha256": bundle_sha256,
                           "reason": f"released as stale by {RELEASE_FLAG}: its run is gone; the test split "
                                     "may have been read by it"})
        elif held is not None:
            why = (f"bundle {bundle_sha256} is being test-scored by another run ({_describe(held)}); "
                   f"if that run crashed or was killed, rerun with {RELEASE_FLAG} to release its claim")
            return TestClaimed(why, ledger.refuse(command, ins, why).seq, held.seq)
        return ledger.append("test-claim", command, {**ins, "protocol": record.sha256},
                             {"bundle_sha256": bundle_sha256, "protocol_sha256": record.sha256, "pid": os.getpid(),
                              "host": socket.gethostname(),
                              "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})


def score_test_once(ledger: Ledger, bundle_sha256: str, record: ProtocolRecord,
                    compute: Callable[[], Mapping[str, Any]], command: str,
                    inputs: Mapping[str, str] | None = None, *, release_stale: bool = False) -> OnceResult:
    """Score the test split of `bundle_sha256` once. `compute()` returns a JSON-able result (e.g.
    `report_to_json(...)`); it is called only by the run that claimed the bundle. A repeat raises
    LedgerRefusal whose `recorded` is the first result; a request while another run holds the claim
    raises TestClaimed. `release_stale` first releases a claim whose run is gone."""
    claim = _claim(ledger, bundle_sha256, record, command, release_stale)
    if isinstance(claim, LedgerRefusal):
        raise claim
    try:
        result = dict(compute())
    except BaseException as exc:
        try:
            ledger.append("test-release", command, {"bundle": bundle_sha256},
                          {"claim": claim.seq, "bundle_sha256": bundle_sha256,
                           "reason": f"the run failed: {type(exc).__name__}: {exc}"})
        except Exception as release_error:  # the claim stays open; the original error is what to see
            exc.add_note(f"its test claim (entry {claim.seq}) could not be released: {release_error}")
        raise
    e = ledger.append("test", command, {"bundle": bundle_sha256, "protocol": record.sha256, **(inputs or {})},
                      {"bundle_sha256": bundle_sha256, "protocol_sha256": record.sha256, "claim": claim.seq,
                       "registered": record.registered, "marker": record.marker, "result": result})
    return OnceResult(bundle_sha256, record.sha256, e.seq, result, record.marker)
