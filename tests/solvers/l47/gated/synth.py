"""Synthetic FFN inputs for the gated-edit tests: rows = a component common to every row (the
residual's, which lets a gate through the origin act as if it had a bias) + noise, with a planted
direction d carrying the label: positives at d-coordinate in [pos_lo, pos_hi], negatives in
[neg_lo, neg_hi]; documents of `doc` consecutive rows, positives spread over them."""
from __future__ import annotations

import numpy as np


def planted(seed: int, *, rows: int = 1200, n: int = 24, every: int = 40, common: float = 4.0,
            noise: float = 0.5, pos=(2.0, 4.0), neg=(-3.0, -0.5), doc: int = 60):
    """(x [rows, n], y bool [rows], groups int [rows], d [n]): d = e_0, the common component along
    e_1 (orthogonal to d), so g = d separates through the origin iff neg's upper end is < 0."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, n)) * noise
    x[:, 1] += common
    y = np.zeros(rows, dtype=bool)
    y[every // 2::every] = True
    x[:, 0] = np.where(y, rng.uniform(*pos, rows), rng.uniform(*neg, rows))
    d = np.zeros(n)
    d[0] = 1.0
    return x, y, np.arange(rows) // doc, d
