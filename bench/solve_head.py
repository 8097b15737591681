"""`exactedit bench solve-head`: one Adam step of the head solver at production size, and the
full-vocab pass it needs once, against sgemm of the same shape.

The step works on synthetic arrays of the production shape (rows x |S| x n); its cost does not
depend on the values. The full-vocab pass is bench/head.py's measurement, reused as is.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, asdict
from typing import Callable

import numpy as np

from solvers.head.objective import HeadBatch, MarginTerm, SetTerm, TargetTerm, logsumexp


def synthetic_batch(rng: np.random.Generator, rows: int, k: int, n: int, *, z_scale: float = 1.0,
                    share: float = 0.5) -> HeadBatch:
    """A random, self-consistent HeadBatch: every term has about `share` of the rows, targets and
    set members both inside and outside S, base LSE = logaddexp(LSE_rest, logsumexp(base_s))."""
    z = rng.standard_normal((rows, n)) * (z_scale / np.sqrt(n))
    base_s = rng.normal(0.0, 1.5, (rows, k))
    lse_rest = rng.normal(2.0, 1.0, rows)
    lse = np.logaddexp(lse_rest, logsumexp(base_s))

    def pick():
        m = max(1, int(round(share * rows)))
        return np.sort(rng.choice(rows, size=m, replace=False))

    def target(rows_):
        slot = rng.integers(-1, k, len(rows_))
        logit = lse[rows_] - rng.exponential(3.0, len(rows_))
        return TargetTerm(rows_, logit, slot)

    def set_term(rows_):
        mask = rng.random((len(rows_), k)) < 0.3
        lse_out = lse_rest[rows_] - rng.exponential(2.0, len(rows_))  # members outside S are in the rest
        lse_out[rng.random(len(rows_)) < 0.3] = -np.inf
        return SetTerm(rows_, mask, lse_out)

    mrows = pick()
    cho, rej = target(mrows), target(mrows)
    return HeadBatch(z=z, base_s=base_s, lse_rest=lse_rest, lse=lse, nll=target(pick()),
                     margin=MarginTerm(cho, rej), opener=set_term(pick()),
                     closer=set_term(pick()), anchor=pick(), guard=pick())
