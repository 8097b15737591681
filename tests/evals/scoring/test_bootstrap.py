"""Bootstrap over documents: resample weights, per-document sums, intervals."""
from __future__ import annotations

import math

import numpy as np

from exactedit.evals.scoring import bootstrap as bs


def test_per_doc_sums_and_counts():
    values = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    doc = np.array([0, 0, 1, 2, 2])
    sums, counts = bs.per_doc(values, np.array([True, True, True, False, True]), doc, 4)
    assert list(sums) == [3.0, 3.0, 5.0, 0.0] and list(counts) == [2, 1, 1, 0]


def test_resample_weights_stay_in_their_strata():
    w = bs.resample_weights([np.array([0, 2]), np.array([3, 4, 5])], 7, 200, seed=1)
    assert w.shape == (200, 7)
    assert np.all(w[:, [0, 2]].sum(1) == 2) and np.all(w[:, [3, 4, 5]].sum(1) == 3)
    assert np.all(w[:, [1, 6]] == 0)
    assert np.array_equal(w, bs.resample_weights([np.array([0, 2]), np.array([3, 4, 5])], 7, 200, seed=1))


def test_interval_of_a_mean_over_documents():
    # 10 documents; document i has mean i over 5 rows: the mean over rows is 4.5
    sums, counts = np.arange(10) * 5.0, np.full(10, 5.0)
    lo, hi = bs.interval(bs.ratio(sums, counts), [np.arange(10)], 10, 2000, 0.95, seed=0)
    assert lo < 4.5 < hi
    # the standard error of a mean of 10 documents with sd 3.03 is ~0.96: a 95% interval ~ +-1.9
    assert 2.6 < lo < 3.2 and 5.8 < hi < 6.4
    same = np.full(10, 5.0)
    assert bs.interval(bs.ratio(same, counts), [np.arange(10)], 10, 100, 0.95, 0) == (1.0, 1.0)


def test_no_interval_without_two_documents_or_resamples():
    one = bs.interval(bs.ratio(np.ones(3), np.ones(3)), [np.array([1])], 3, 100, 0.95, 0)
    assert all(math.isnan(x) for x in one)
    none = bs.interval(bs.ratio(np.ones(3), np.ones(3)), [np.arange(3)], 3, 0, 0.95, 0)
    assert all(math.isnan(x) for x in none)
