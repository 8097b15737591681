"""Ledger anchors: copies of the ledger head held outside the ledger, so that a rewrite shows.

Threat model (docs/evals.md). The ledger is a hash chain in one SQLite file plus `ledger.head`;
whoever can write both can drop the append-only triggers, delete or edit entries, re-chain the rest
and rewrite the head, and the chain then verifies. What such a rewrite cannot reach are the heads
recorded elsewhere when outputs were written: every bundle (manifest `ledger_head`), dev report,
test report and sign-off (`meta.ledger_head`), the file `exactedit eval ledger --export` writes (to
be committed to git), and the user-level blind registry (each claim's entry seq and hash). Each
entry's hash covers every entry before it, so an anchor (seq, hash) that still equals entry seq of
the chain proves that the chain up to seq is the one the anchor saw. A report is also backed only
while the ledger still records it (the dev report's `score` entry by its sha256, the sign-off's
`blind-result` entry, the test report's `test` entry). Detected: any edit, deletion, reordering or
rewrite of entries up to an anchor, given one anchor written after them. Not detected: a rewrite of
entries after the last surviving anchor, or by someone who also destroys or forges every anchor.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

from exactedit.evals.protocol.ledger import ChainCheck, Ledger, LedgerError, LedgerHead, file_sha256, head_json, ledger_id
from exactedit.files import atomic_write_text, read_regular

HEAD_KIND = "exactedit.ledger-head"
REPORT_KIND = "exactedit.eval-report"
BUNDLE_KIND = "exactedit.bundle"
MAX_JSON_BYTES = 64 << 20
REGISTRY = "blind registry claim"
_WHAT = {"score": "dev report", "test": "test report", "blind": "sign-off"}


@dataclass(frozen=True)
class Anchor:
    """One recorded head: where it was found, what kind of output holds it, and (seq, hash)."""

    source: str
    what: str
    seq: int
    hash: str
    ledger: str = ""
    file_sha256: str = ""      # reports: the file's sha256, which the ledger must still record
    bundle_sha256: str = ""    # test reports: the bundle whose test entry must still be there


@dataclass(frozen=True)
class AnchorStatus:
    anchor: Anchor
    backed: bool
    reason: str = ""


@dataclass(frozen=True)
class LedgerVerification:
    """`exactedit eval ledger --verify`: the chain, then each anchor against it."""

    ledger: str
    chain: ChainCheck
    head: LedgerHead
    anchors: tuple[AnchorStatus, ...]

    @property
    def ok(self) -> bool:
        return self.chain.ok and all(a.backed for a in self.anchors)

    @property
    def first_unbacked(self) -> AnchorStatus | None:
        bad = [a for a in self.anchors if not a.backed]
        # the earliest head; on a tie an output file before the registry's record of the same claim
        return min(bad, key=lambda a: (a.anchor.seq, a.anchor.what == REGISTRY, a.anchor.source)) if bad else None

    def to_dict(self) -> dict:
        first = self.first_unbacked
        return {"ledger": self.ledger, "ok": self.ok, "chain": asdict(self.chain), "head": self.head.to_json(),
                "anchors": [{**asdict(a.anchor), "backed": a.backed, "reason": a.reason} for a in self.anchors],
                "first_unbacked": first.anchor.source if first else None}


@dataclass(frozen=True)
class ExportedHead:
    path: str
    seq: int
    hash: str
    ledger: str
    sha256: str

    def to_dict(self) -> dict:
        return asdict(self)


def export_head(workspace, out) -> ExportedHead:
    """Write the ledger's current head as a small JSON (`*.tmp`, fsync, rename) to commit to git.
    Refuses a broken chain: an anchor of a broken ledger would vouch for the break."""
    with Ledger.open(workspace, write=False) as ledger:
        ledger.require_intact()
        head = head_json(ledger)
        obj = {"kind": HEAD_KIND, **head, "entries": head["seq"],
               "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    out = Path(out)
    atomic_write_text(out, json.dumps(obj, indent=1, sort_keys=True) + "\n")
    return ExportedHead(str(out), head["seq"], head["hash"], head["ledger"], file_sha256(out))


def _head_of(obj, source: str, what: str) -> Anchor:
    if not isinstance(obj, dict) or not isinstance(obj.get("seq"), int) or isinstance(obj.get("seq"), bool) \
            or not isinstance(obj.get("hash"), str):
        raise LedgerError(source, "ledger_head", f"expected {{seq: int, hash: str}}, got {obj!r}")
    return Anchor(source, what, obj["seq"], obj["hash"], str(obj.get("ledger", "")))


def _json_bytes(path: Path) -> bytes | None:
    """The bytes of a file that may hold an anchor, or None where none can be: no such file (a
    dangling link in a searched directory, a directory without manifest.json), or a regular file
    over MAX_JSON_BYTES (no output of ours). A FIFO, device or socket, a symlink loop, an unreadable
    file: LedgerError naming it and --against (read without blocking: a FIFO was waited on for ever)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LedgerError(path, "--against", f"cannot read ({exc.strerror or exc})") from None
    if stat.S_ISREG(st.st_mode) and st.st_size > MAX_JSON_BYTES:
        return None
    return read_regular(path, MAX_JSON_BYTES, LedgerError, "--against")


def anchor_of(path: Path) -> Anchor | None:
    """The anchor a JSON file (or a bundle directory) holds, or None when it holds none; a special
    file refused (`_json_bytes`)."""
    path = Path(path)
    if path.is_dir():
        path = path / "manifest.json"
    data = _json_bytes(path)
    if data is None:
        return None
    try:
        obj = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    kind = obj.get("kind")
    if kind == HEAD_KIND:
        return _head_of(obj, str(path), "exported head")
    if kind == BUNDLE_KIND and obj.get("ledger_head") is not None:
        return _head_of(obj["ledger_head"], str(path.parent), "bundle")
    if kind == REPORT_KIND and isinstance(obj.get("meta"), dict) and obj["meta"].get("ledger_head") is not None:
        a = _head_of(obj["meta"]["ledger_head"], str(path), _WHAT.get(obj.get("report"), "report"))
        return Anchor(a.source, a.what, a.seq, a.hash, a.ledger, hashlib.sha256(data).hexdigest(),
                      str(obj["meta"].get("bundle_sha256", "")))
    return None


def find_anchors(paths: Iterable) -> list[Anchor]:
    """Anchors in the given files and directories (searched for *.json, bundles included). A file
    named explicitly must hold one, and a directory at least one: `--against` cannot pass vacuously."""
    found: list[Anchor] = []
    for p in map(Path, paths):
        try:
            os.stat(p)
        except OSError as exc:                      # missing, or a symlink loop: named as such
            raise LedgerError(p, "--against", "no such file or directory" if isinstance(exc, FileNotFoundError)
                              else f"cannot read ({exc.strerror or exc})") from None
        if not p.is_dir() or os.path.lexists(p / "manifest.json"):      # a file, or a bundle
            a = anchor_of(p)
            if a is None:
                raise LedgerError(p, "--against", "holds no ledger head (expected an exported head, a bundle, "
                                  "a report or a sign-off written with a ledger)")
            found.append(a)
            continue
        here = [a for f in sorted(p.rglob("*.json")) if (a := anchor_of(f)) is not None]
        if not here:
            raise LedgerError(p, "--against", "no file under it holds a ledger head")
        found += here
    return list({(a.source, a.seq, a.hash): a for a in found}.values())


def check_anchor(ledger: Ledger, chain: ChainCheck, a: Anchor) -> AnchorStatus:
    """Is the chain up to `a.seq` the one the anchor saw, and does the ledger still record the output?"""
    if chain.first_bad is not None and a.seq >= chain.first_bad:
        return AnchorStatus(a, False, f"its head (entry {a.seq}) lies past the chain's break at entry {chain.first_bad}")
    if a.seq == 0:
        ok = a.hash == "0" * 64
        return AnchorStatus(a, ok, "" if ok else "an empty-ledger head with a non-genesis hash")
    e = ledger.entry(a.seq)
    if e is None:
        return AnchorStatus(a, False, f"it records head entry {a.seq} ({a.hash[:12]}), the ledger ends at "
                            f"entry {ledger.head().seq}: entries were cut off")
    if e.hash != a.hash:
        return AnchorStatus(a, False, f"it records entry {a.seq} with hash {a.hash[:12]}, the ledger's entry "
                            f"{a.seq} now hashes to {e.hash[:12]}: the chain was rewritten up to there")
    if a.what == "dev report" and not any(x.payload.get("report_sha256") == a.file_sha256
                                          for x in ledger.entries("score")):
        return AnchorStatus(a, False, f"no score entry records this report (sha256 {a.file_sha256[:12]})")
    if a.what == "sign-off" and not any(x.inputs.get("out:json") == a.file_sha256
                                        for x in ledger.entries("blind-result")):
        return AnchorStatus(a, False, f"no blind-result entry records this sign-off (sha256 {a.file_sha256[:12]})")
    if a.what == "test report" and not any(x.payload.get("bundle_sha256") == a.bundle_sha256
                                           for x in ledger.entries("test")):
        return AnchorStatus(a, False, f"no test entry records bundle {a.bundle_sha256[:12]}")
    return AnchorStatus(a, True)


def registry_anchors(ledger: Ledger, home=None) -> list[Anchor]:
    """The blind claims this ledger made, as the user-level registry recorded them."""
    from exactedit.evals.protocol.registry import DB_NAME, BlindRegistry, exactedit_home

    if not ((Path(home) if home is not None else exactedit_home()) / DB_NAME).is_file():
        return []  # no blind run was ever claimed here: nothing to check, nothing created
    with BlindRegistry.open(home, write=False) as reg:
        return [Anchor(c.source, REGISTRY, c.seq, c.hash, c.ledger) for c in reg.claims_of(ledger_id(ledger))]


def verify_ledger(workspace, against: Sequence = (), *, home=None) -> LedgerVerification:
    """The chain, then every anchor: those found under `against` and the registry's claims."""
    anchors = find_anchors(against)
    with Ledger.open(workspace, write=False) as ledger:
        chain = ledger.verify()
        anchors += registry_anchors(ledger, home)
        statuses = tuple(check_anchor(ledger, chain, a) for a in anchors)
        return LedgerVerification(str(ledger.path), chain, ledger.head(), statuses)


def render_verification(v: LedgerVerification) -> str:
    lines = [f"ledger {v.ledger}: {v.chain.entries} entries, "
             + ("hash chain intact" if v.chain.ok else f"BROKEN at entry {v.chain.first_bad}: {v.chain.reason}")]
    for s in v.anchors:
        a = s.anchor
        lines.append(f"  {'backed    ' if s.backed else 'NOT BACKED'}  {a.what:<21} entry {a.seq:>4}  {a.source}"
                     + (f": {s.reason}" if s.reason else ""))
    first = v.first_unbacked
    if first is not None:
        lines.append(f"first output the ledger no longer backs: {first.anchor.source} ({first.anchor.what}, "
                     f"head entry {first.anchor.seq}): {first.reason}")
    elif v.anchors:
        lines.append(f"all {len(v.anchors)} anchors backed")
    return "\n".join(lines)
