"""The partition function under an edit of a head row set S (SPEC.md section 2).

Editing rows S of W_out changes only the logits of S, linearly: l'_v = l_v + dW_v . mix. With
LSE_rest = log sum_{v not in S} exp(l_v) computed once per row (from one full-vocabulary pass),
    LSE' = logaddexp(LSE_rest, logsumexp_{v in S} l'_v)
costs rows x |S| x n per step instead of rows x V x n.

LSE_rest = LSE + log(1 - p_S) is formed as LSE + log(-expm1(LSE_S - LSE)), which keeps full
relative precision in 1 - p_S when S holds little of the mass; when S holds essentially all
of it (p_S rounds to 1) LSE_rest is -inf, and LSE' is then just the logsumexp over S.
All arithmetic is float64.
"""
from __future__ import annotations

import numpy as np


def logsumexp_rows(x) -> np.ndarray:
    """log sum exp over the last axis, float64; -inf for an empty or all -inf row."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], -np.inf)
    m = x.max(axis=-1)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.sum(np.exp(x - safe[..., None]), axis=-1))


def lse_rest(lse, logits_S) -> np.ndarray:
    """log sum over v not in S of exp(l_v) [T], from the full LSE [T] and the base logits of S [T, |S|]."""
    lse = np.asarray(lse, dtype=np.float64)
    lse_s = logsumexp_rows(logits_S)
    gap = lse_s - lse  # log p_S <= 0 up to rounding
    with np.errstate(divide="ignore", invalid="ignore"):
        rest = lse + np.log(-np.expm1(np.minimum(gap, 0.0)))
    return np.where(gap < 0.0, rest, -np.inf)


def edited_logits(logits_S, mix, dW_S) -> np.ndarray:
    """l'_S = l_S + mix @ dW_S^T: [T, |S|] float64 from base logits, mix [T, n], dW_S [|S|, n]."""
    return (np.asarray(logits_S, dtype=np.float64)
            + np.asarray(mix, dtype=np.float64) @ np.asarray(dW_S, dtype=np.float64).T)


def lse_edited(rest, logits_S_new) -> np.ndarray:
    """LSE' [T] = logaddexp(LSE_rest, logsumexp over S of the edited logits [T, |S|])."""
    return np.logaddexp(np.asarray(rest, dtype=np.float64), logsumexp_rows(logits_S_new))
