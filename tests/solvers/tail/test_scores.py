"""RowScores from logits (float64 reference against hand math), concat, slop and word positions."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.solvers.tail.scores import DocMeta, RowScores, concat, log_softmax, rows_from_logits, slop_positions, word_positions

END, TO, RATHER, THAN, X = 0, 1, 2, 3, 4


def test_rows_from_logits_matches_hand_math():
    base = np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    edit = np.array([[0.0, 1.0, 0.0], [3.0, 0.0, 0.0]])
    s = rows_from_logits(base, edit, tokens=[1, 2], next_tokens=[2, -1], roles=[0, 0], doc=[0, 0],
                         special_ids=[0], selected_ids=[1, 2], docs=[DocMeta("d", "t", "dev")])
    pb = np.exp(base[0]) / np.exp(base[0]).sum()
    pe = np.exp(edit[0]) / np.exp(edit[0]).sum()
    assert s.logp_base[0] == pytest.approx(np.log(pb[2]), abs=1e-12)
    assert s.logp_edit[0] == pytest.approx(np.log(pe[2]), abs=1e-12)
    assert np.isnan(s.logp_base[1])  # unknown next token
    assert s.kl[0] == pytest.approx(np.sum(pb * np.log(pb / pe)), abs=1e-12) and s.kl[1] == 0.0
    assert list(s.argmax_base) == [2, 0] and list(s.argmax_edit) == [1, 0]
    assert s.p_special_base[0, 0] == pytest.approx(pb[0]) and s.logp_sel_edit.shape == (2, 2)
    assert s.dlogp[0] == pytest.approx(np.log(pe[2] / pb[2]))


def test_log_softmax_is_stable():
    x = np.array([[1000.0, 1000.0], [-1000.0, 0.0]])
    assert np.allclose(np.exp(log_softmax(x)).sum(-1), 1.0)
    assert log_softmax(x)[0, 0] == pytest.approx(-np.log(2))


def _scores(tokens, nxt, doc, n_docs):
    t = len(tokens)
    z = np.zeros(t)
    return RowScores(np.array(tokens, np.int32), np.array(nxt, np.int32), np.zeros(t, np.uint8),
                     np.array(doc, np.int32), z, z, z, np.zeros(t, np.int32), np.zeros(t, np.int32), (),
                     np.zeros((t, 0)), np.zeros((t, 0)),
                     docs=tuple(DocMeta(f"d{i}", "t", "dev") for i in range(n_docs)))


def test_slop_positions_prefix_exact_within_document():
    #        row: 0    1   2    3       4     5   6   7
    tokens = [END, TO, X, RATHER, END, TO, X, RATHER]
    nxt = [TO, END, RATHER, THAN, TO, END, RATHER, X]
    doc = [0, 0, 0, 0, 1, 1, 1, 1]
    s = _scores(tokens, nxt, doc, 2)
    got = slop_positions(s, [(END, TO, END), (RATHER, THAN)])
    assert list(got) == [-1, 0, -1, 1, -1, 0, -1, -1]  # row 7: next is not the final token
    s2 = _scores([END, TO, END], [TO, END, X], [0, 1, 1], 2)  # prefix crosses a document boundary
    assert list(slop_positions(s2, [(END, TO, END)])) == [-1, -1, -1]
    words = word_positions(s, [END, THAN], got)
    assert list(words) == [-1, -1, -1, -1, -1, -1, -1, -1]
    s3 = _scores([X, X, TO], [END, THAN, END], [0, 0, 0], 1)
    assert list(word_positions(s3, [END, THAN], slop_positions(s3, [(RATHER, THAN)]))) == [0, 1, 0]


def test_longer_prefix_wins():
    s = _scores([X, TO, TO], [X, X, END], [0, 0, 0], 1)
    assert list(slop_positions(s, [(TO, END), (TO, TO, END)])) == [-1, -1, 1]


def test_concat_offsets_documents():
    a = _scores([1, 2], [2, 3], [0, 0], 1)
    b = _scores([5], [6], [0], 1)
    c = concat([a, b], chunks=False)
    assert list(c.doc) == [0, 0, 1] and len(c.docs) == 2
    same = concat([a, b], chunks=True)
    assert list(same.doc) == [0, 0, 0] and len(same.docs) == 1
    with pytest.raises(ValueError, match="same documents"):
        concat([a, a.with_docs([DocMeta("other", "t", "dev")])], chunks=True)


def test_shape_errors():
    with pytest.raises(ValueError, match="next"):
        RowScores(np.zeros(2, np.int32), np.zeros(3, np.int32), *([None] * 10))
