"""The WFLD background metric leaves out the anchors' own slop contexts: a row where a banned
phrase's prefix is followed by its final token is where the edit must act, not background."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from exactedit.solvers.l47.problem import background_rows


def test_slop_context_rows_are_left_out_and_the_rest_kept_in_order():
    hh = np.arange(24, dtype=np.float32).reshape(6, 4)
    mining = SimpleNamespace(trace=lambda name: SimpleNamespace(rows=np.array([1, 4])))
    got = background_rows("anchors", SimpleNamespace(hh=hh), mining)
    np.testing.assert_array_equal(got, hh[[0, 2, 3, 5]])


def test_an_anchor_without_slop_is_whole():
    hh = np.ones((3, 2), np.float32)
    mining = SimpleNamespace(trace=lambda name: SimpleNamespace(rows=np.zeros(0, np.int64)))
    np.testing.assert_array_equal(background_rows("a", SimpleNamespace(hh=hh), mining), hh)
