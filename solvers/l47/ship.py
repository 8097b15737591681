"""Shipping the WFLD edit so that the quantized tensor keeps what the solve met (SPEC.md 3, 5).

The solve meets its hard conditions exactly in float64: dW h = 0 on each word's legitimate uses,
special-token logits held at target and anchor rows. Rounding each weight of W0 + dW to a coarse
grid on its own (Q6_K) adds an error E that knows nothing of them (on Qwen: a null hold of 1e-16
became 2%). Every condition is an inner product of a row of E with some hh (per row r of the
tensor: E_r . h_j for a held use, sum_r u_kr E_r . hh_k for a logit), so one quadratic form over
a row's h coordinates weighs them all:

    H = n C / tr(W0 C W0^T)  +  hold_weight * n * mean_j h_j h_j^T / ||W0 h_j||^2

C the solve's background metric (so E stays quiet on the anchors, as dW is; C = mean_a hh_a hh_a^T
+ ridge * mean(diag) * I, given as its anchor rows and ridge so H stays factored: a diagonal plus
one row per anchor row and per held direction, `quant.rounding.feedback.Metric`), h_j the held uses
and the condition rows' hh (targets and special holds alike). Each term is a relative squared
error per row, so `hold_weight` says how many times more a held direction counts than the
background. `quant.rounding.feedback.ship_rows` then chooses each edited row's codes within the row's
original block scales (on which the unedited weights are exact) by error feedback in H, and
keeps per row the best of that, nearest rounding and ggml's own quantizer, scored in H.

Through a post-FFN norm (Gemma style, R' = R + rmsnorm(y) * w_post, y = W hh) the error reaches R'
as J_post(y) E hh = w_post * (r E hh - r^3 / n * y (y . E hh)): row r of E scaled by w_post[r] * r
(a factor per row, which leaves each row's choice of codes unchanged) less a radial part that mixes
the rows and that H, being per row, does not see. H stays a weighting for choosing codes; what the
report gives as shipped is exact (every Gauss-Newton round re-scores the shipped bytes through the
norm and the head), and the held uses' relative error ||E h|| / ||W0 h|| is the relative change of
the norm's input y there (of which the component along y itself drops out of the norm's output).
"""
from __future__ import annotations

import time

import numpy as np

from exactedit import quant
from exactedit.quant.rounding.feedback import FeedbackShip, Metric, ship_rows
from exactedit.quant.rounding.grid import GRID_TYPES
from exactedit.solvers.l47.config import WfldError
from exactedit.solvers.l47.gauss_newton import KIND_NAMES, GaussNewton, Shipper, linear_change

#: tensor types on which shipping by feedback is the default (`ship="auto"`): rounding each
#: weight of these on its own moves the edit by a large share of its size
COARSE_TYPES = ("Q6_K",)


def uses_feedback(mode: str, type_name: str) -> bool:
    """Whether a solve ships by error feedback: mode "feedback", or "auto" on a coarse type."""
    if mode == "feedback" and type_name not in GRID_TYPES:
        raise WfldError("ship", "type", f"feedback shipping needs block scales ({GRID_TYPES}); the tensor "
                        f"is {type_name}")
    return mode == "feedback" or (mode == "auto" and type_name in COARSE_TYPES)


def shipping_metric(hh_bg, ridge: float, held, w0, hold_weight: float) -> Metric:
    """H of the module docstring, factored. hh_bg [N, h] the anchor rows and `ridge` of the
    background metric (as `wfld.background_metric`), held [m, h] the directions to keep (held
    uses and condition rows; zero rows are ignored), w0 [n, h] the original weights."""
    hh = np.asarray(hh_bg, dtype=np.float64)
    w0 = np.asarray(w0, dtype=np.float64)
    n, h = w0.shape
    if hh.ndim != 2 or hh.shape[0] == 0 or hh.shape[1] != h:
        raise WfldError("ship", "metric", f"expected anchor rows [N >= 1, {h}], got {list(hh.shape)}")
    scale = float(np.sum(hh * hh)) / (hh.shape[0] * h)      # mean(diag(hh^T hh / N))
    if not scale > 0 or not ridge > 0:
        raise WfldError("ship", "metric", "feedback shipping needs a background metric with a ridge > 0 "
                        f"(anchor scale {scale}, ridge {ridge})")
    bg = float(np.sum((hh @ w0.T) ** 2)) / hh.shape[0] + ridge * scale * float(np.sum(w0 * w0))
    parts = [hh * np.sqrt(n / (bg * hh.shape[0]))]
    held = np.asarray(held, dtype=np.float64).reshape(-1, h)
    if hold_weight > 0 and held.shape[0]:
        wh = np.linalg.norm(held @ w0.T, axis=1) ** 2
        keep = wh > 0
        if np.any(keep):
            g = held[keep] / np.sqrt(wh[keep])[:, None]
            parts.append(g * np.sqrt(hold_weight * n / int(keep.sum())))
    return Metric(np.full(h, ridge * scale * n / bg), np.concatenate(parts, axis=0))


class FeedbackShipper(Shipper):
    """`Shipper` whose edited rows are chosen by `quant.rounding.feedback.ship_rows` in `metric`, within
    their original block scales. `last` keeps the last call's FeedbackShip (for the report)."""

    def __init__(self, raw0, type_name: str, cols: int, view, metric: Metric, sweeps: int):
        if type_name not in GRID_TYPES:
            raise WfldError("ship", "type", f"feedback shipping needs block scales ({GRID_TYPES}), got {type_name}")
        super().__init__(raw0, type_name, cols, view)
        self.metric, self.sweeps = metric, int(sweeps)
        self.w0_64 = self.w0.astype(np.float64)
        self.last: FeedbackShip | None = None
        self.seconds = 0.0

    def __call__(self, w) -> tuple[np.ndarray, np.ndarray]:
        w = np.asarray(w, dtype=np.float64)
        if w.shape != self.w0.shape:
            raise WfldError("ship", "w", f"expected {list(self.w0.shape)}, got {list(w.shape)}")
        t = time.perf_counter()
        edited = np.flatnonzero(np.any(w != self.w0_64, axis=1))
        raw = self.raw0.copy()
        view = self.w0.copy()
        if edited.size:
            ship = ship_rows(w[edited], self.type_name, self.metric, {"orig": self.raw0[edited]},
                             sweeps=self.sweeps)
            raw[edited] = ship.raw
            view[edited] = ship.values
            self.last = ship
        self.seconds += time.perf_counter() - t
        return raw, view


def _rel(hh, dW, w0) -> np.ndarray:
    """||dW h|| / ||W0 h|| per row of hh."""
    if hh.shape[0] == 0:
        return np.zeros(0)
    base = np.linalg.norm(hh @ w0.T, axis=1)
    return np.linalg.norm(hh @ dW.T, axis=1) / np.maximum(base, 1e-30)


def _stats(rel) -> dict:
    if rel.size == 0:
        return {"max_rel": None, "mean_rel": None}
    return {"max_rel": float(rel.max()), "mean_rel": float(rel.mean())}


def shipping_summary(*, gn: GaussNewton, cond, Hh, w0, held_by_word, collateral_by_word, word_names,
                     raw0, type_name: str, cols: int, view, mode: str, hold_weight: float,
                     shipper: Shipper, hh_bg=None) -> dict:
    """Per word and per hold: the residual as solved (the last float64 solve), as shipped, and as
    ggml's quantizer of the same solve would have shipped it (the comparison this module is for).

    held_by_word / collateral_by_word: per word the hh [m, h] of its held uses (the null space)
    and of its scored legitimate uses (bar (d), never held). With the anchor rows `hh_bg`,
    `background` gives the shipping error's energy on them relative to the edit's own,
    ||(shipped - solved) hh|| / ||solved hh|| over the anchors (shipped and as ggml would ship)."""
    w0 = np.asarray(w0, dtype=np.float64)
    solved = np.asarray(gn.last_solve.dW, dtype=np.float64)
    shipped = np.asarray(gn.dW, dtype=np.float64)
    target = w0 + solved
    edited = np.flatnonzero(np.any(target != w0, axis=1))
    ggml_view = w0.copy()
    if edited.size:
        rows = quant.quantize(target[edited].astype(np.float32), type_name)
        ggml_view[edited] = np.asarray(view(rows, type_name, cols), dtype=np.float64)
    ggml = ggml_view - w0
    dn = float(np.linalg.norm(solved))
    words = []
    for wi, name in enumerate(word_names):
        held = np.asarray(held_by_word[wi], dtype=np.float64).reshape(-1, w0.shape[1])
        coll = np.asarray(collateral_by_word[wi], dtype=np.float64).reshape(-1, w0.shape[1])
        words.append({"word": name, "held_uses": int(held.shape[0]), "collateral_uses": int(coll.shape[0]),
                      "held": {k: _stats(_rel(held, d, w0)) for k, d in
                               (("solved", solved), ("shipped", shipped), ("ggml", ggml))},
                      "collateral": {k: _stats(_rel(coll, d, w0)) for k, d in
                                     (("solved", solved), ("shipped", shipped), ("ggml", ggml))}})
    U, b = gn.last_U, gn.last_solve.rhs
    lin = {k: np.abs(linear_change(d, U, Hh) - b) for k, d in
           (("solved", solved), ("shipped", shipped), ("ggml", ggml))}
    exact = np.abs((gn.logits - gn.base_logits) - cond.target)
    holds = {}
    for k, name in enumerate(KIND_NAMES):
        sel = cond.kind == k
        if np.any(sel):
            holds[name] = {"n": int(sel.sum()), **{f"{key}_linear": float(v[sel].max()) for key, v in lin.items()},
                           "shipped_exact": float(exact[sel].max())}
    out = {"mode": mode, "type": type_name, "feedback": isinstance(shipper, FeedbackShipper),
           "hold_weight": float(hold_weight),
           "ship_rel": float(np.linalg.norm(shipped - solved)) / dn if dn > 0 else 0.0,
           "ship_rel_ggml": float(np.linalg.norm(ggml - solved)) / dn if dn > 0 else 0.0,
           "words": words, "holds": holds}
    if hh_bg is not None:
        hb = np.asarray(hh_bg, dtype=np.float64)
        own = float(np.linalg.norm(hb @ solved.T))
        out["background"] = {k: float(np.linalg.norm(hb @ (d - solved).T)) / own if own > 0 else None
                             for k, d in (("shipped", shipped), ("ggml", ggml))}
    if isinstance(shipper, FeedbackShipper) and shipper.last is not None:
        last = shipper.last
        ggml_obj = last.candidate_objective[:, 0]
        out["rows"] = last.chosen()
        out["objective"] = {"ggml": float(np.sum(ggml_obj[np.isfinite(ggml_obj)])),
                            "shipped": float(np.sum(last.objective[np.isfinite(last.objective)]))}
        out["seconds"] = shipper.seconds
    return out
