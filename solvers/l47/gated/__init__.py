"""The gated edit of the last layer: rewrite ONE SwiGLU unit j of the last FFN into a detector of a
phrase's prefix. Unit j computes a_j(x) = silu(g.x) (u.x) on x = ffn_norm(R) and writes
W_down[:, j] a_j into the residual; with g a gate through the origin that separates the prefix's
positions from every other row, a_j is ~0 off the prefix and the down column lowers the banned word
only there (the dense edit of ffn_down is linear in hh and cannot threshold).

    unit     the unit's float64 reference and its gradient in g and u (`unit_ref`, `unit_grad`)
    gate     the gate's fit through the origin (or affine, the yardstick) and out-of-fold margins
             by document (`fit_gate` -> Gate, `oof_margins` -> OofMargins)
    ridge    the gate's ridge chosen on dev per detector (`choose_ridge` -> RidgeChoice)
    design   the unit's gate and up rows from a gate, and the detector's numbers
             (`design_unit` -> GatedUnit, `activation_ratio`)
    removal  the cost of repurposing a unit: energy screen, candidates, the residual changes
    config   `GatedError`, `GateConfig`, `DesignConfig`
    edit     the entry: `solve_gated(GatedInputs, WfldConfig) -> GatedResult` (gate, unit choice,
             removal, the rewritten traces, the down column's solve on the one unit's key)
    column   the down column through the exact final norm and head (lowering a phrase's word,
             or raising a style's tokens)
    down     the columns per strength, shipped within ffn_down's block scales, chosen on dev
    style    a persona's style raised at its decision rows only: `solve_style_unit(StyleInputs)`

Pure numpy/scipy; the names below are imported on first use.
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "ActivationRatio": "design",
    "DesignConfig": "config",
    "Gate": "gate",
    "GateConfig": "config",
    "GatedError": "config",
    "GatedInputs": "edit",
    "GatedResult": "edit",
    "solve_gated": "edit",
    "GatedUnit": "design",
    "StyleInputs": "style",
    "StyleResult": "style",
    "solve_style_unit": "style",
    "OofMargins": "gate",
    "RemovalCandidates": "removal",
    "RidgeChoice": "ridge",
    "choose_ridge": "ridge",
    "Separation": "gate",
    "activation_ratio": "design",
    "col_norms": "removal",
    "design_unit": "design",
    "fit_gate": "gate",
    "gate_loss": "gate",
    "leak_bound": "design",
    "oof_margins": "gate",
    "removal_candidates": "removal",
    "removal_delta": "removal",
    "rewrite_delta": "removal",
    "separation": "gate",
    "unit_energy": "removal",
    "unit_grad": "unit",
    "unit_ref": "unit",
})
