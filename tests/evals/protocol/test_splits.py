"""Splits: by (source, character) group, never by row; seeded and deterministic; kept in the ledger."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.evals.protocol.ledger import Ledger, LedgerRefusal, register_protocol
from exactedit.evals.protocol.protocol import ProtocolError, load_protocol
from exactedit.evals.protocol.splits import allocate, build_splits, record_splits, recorded_splits, same_doc_heldout
from tests.evals.conftest import Doc


def _pool(n_sources=8, per=3):
    return [Doc(f"d{s}-{k}", f"src{s}", "mochi" if s % 2 else "kai") for s in range(n_sources) for k in range(per)]


def _docs(pool):
    return {"chat": pool, "anchors": [Doc("a0", "wiki", "")], "blind": [Doc("b0", "fresh", "mochi")]}


def test_split_is_deterministic_and_by_group(protocol_file):
    p = load_protocol(protocol_file)
    pool = _pool()
    a, b = build_splits(p, _docs(pool)), build_splits(p, _docs(list(reversed(pool))))
    assert a.sha256 == build_splits(p, _docs(pool)).sha256
    assert {(d.doc, d.role) for d in a.docs} == {(d.doc, d.role) for d in b.docs}  # order of input irrelevant
    groups = {}
    for d in a.docs:
        groups.setdefault(d.group, set()).add(d.role)
    assert all(len(r) == 1 for r in groups.values())  # a group is never split
    counts = a.counts()
    assert counts == {"train": 12, "dev": 6, "test": 6, "anchors": 1, "blind": 1}  # 8 groups: 4/2/2
    assert a.role("anchors", "a0") == "anchors" and a.role("blind", "b0") == "blind"


def test_seed_changes_the_split(protocol_file):
    p = load_protocol(protocol_file)
    a = build_splits(p, _docs(_pool()))
    protocol_file.write_text(protocol_file.read_text().replace("seed = 7", "seed = 8"))
    b = build_splits(load_protocol(protocol_file), _docs(_pool()))
    assert [d.role for d in a.docs] != [d.role for d in b.docs]


def test_group_in_two_roles_is_refused(protocol_file):
    p = load_protocol(protocol_file)
    docs = _docs(_pool())
    docs["blind"] = [Doc("b0", "src1", "mochi")]  # same group as pooled documents
    with pytest.raises(ProtocolError, match="never split"):
        build_splits(p, docs)
    with pytest.raises(ProtocolError, match="no documents"):
        build_splits(p, {"chat": _pool()})


@pytest.mark.parametrize("n, shares, want", [
    (8, (0.5, 0.25, 0.25), [4, 2, 2]),
    (3, (0.6, 0.2, 0.2), [1, 1, 1]),
    (2, (0.6, 0.2, 0.2), [1, 1, 0]),
    (10, (1.0, 0.0, 0.0), [10, 0, 0]),
    (7, (0.6, 0.2, 0.2), [4, 2, 1]),
])
def test_allocate(n, shares, want):
    got = allocate(n, shares)
    assert got == want and sum(got) == n


def test_same_doc_heldout_is_seeded_and_order_free(protocol_file):
    splits = build_splits(load_protocol(protocol_file), _docs(_pool()))
    pos = np.array([40, 3, 17, 99, 8, 61])
    docs = ["d0-0"] * 6
    phr = [0, 0, 0, 0, 0, 0]
    m = same_doc_heldout(splits, "chat", docs, pos, phr)
    assert m.sum() == 2  # round(0.34 * 6)
    assert np.array_equal(m, same_doc_heldout(splits, "chat", docs, pos, phr))
    perm = np.array([3, 0, 5, 1, 4, 2])  # the held-out rows do not depend on the order given
    assert set(pos[perm][same_doc_heldout(splits, "chat", docs, pos[perm], phr)]) == set(pos[m])


def test_same_doc_heldout_is_capped_per_document_and_per_phrase(protocol_file):
    """Seven documents with one position of each of two phrases, and six single-position documents
    of phrase 0: a per-document draw alone may hold out all seven phrase-1 positions (what one real
    draw did); stratified, phrase 1 gives round(0.34 * 7) = 2 and a single position is never held."""
    splits = build_splits(load_protocol(protocol_file), _docs(_pool()))
    docs = [f"pair{i}" for i in range(7) for _ in range(2)] + [f"one{i}" for i in range(6)]
    pos = np.array([r for _ in range(7) for r in (10, 50)] + [20] * 6)
    phr = np.array([p for _ in range(7) for p in (0, 1)] + [0] * 6)
    for seed_trace in ("chat", "other", "third"):
        m = same_doc_heldout(splits, seed_trace, docs, pos, phr)
        assert not m[14:].any()  # single-position documents keep theirs
        held_per_doc = np.bincount(np.repeat(np.arange(7), 2), weights=m[:14])
        assert held_per_doc.max() <= 1  # round(0.34 * 2)
        assert m[phr == 1].sum() <= 2 and m[phr == 0].sum() <= 4  # round(0.34 * 7), round(0.34 * 13)
        assert m.sum() == 6  # both quotas met: the pairs have room for 2 + 4


def test_record_splits_once(tmp_path, protocol_file):
    p = load_protocol(protocol_file)
    with Ledger.open(tmp_path / "ws") as led:
        rec = register_protocol(led, p, "eval register")
        s = build_splits(p, _docs(_pool()))
        hashes = {"chat": "a" * 64}
        assert record_splits(led, rec, s, "eval split", hashes) == s
        assert record_splits(led, rec, build_splits(p, _docs(_pool())), "eval split", hashes) == s  # rerun
        assert len(led.entries("split")) == 1
        assert recorded_splits(led, p.sha256) == s
        other = build_splits(p, _docs(_pool(n_sources=6)))
        with pytest.raises(LedgerRefusal, match="different split"):
            record_splits(led, rec, other, "eval split", hashes)
