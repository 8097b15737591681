"""The gated edit's report section (solvers/l47/report.py `gated_lines`), on a summary of the shape
`solvers.l47.gated.edit` writes (abridged from a Gemma 3 run): the activation's name, each phrase's
activation on the fit's and the held-out contexts, the removal costs and the down columns. A name
clash here once failed Gemma's demo at its report, after every stage had run."""
from __future__ import annotations

import pytest

from exactedit.solvers.l47.report import gated_lines


def _summary(activation: str | None) -> dict:
    act = {"pos_min": 5.938, "pos_median": 6.21, "neg_max_abs": 0.0, "n_pos": 30, "n_neg": 5823}
    held = {"pos_min": 2.007, "pos_median": 5.346, "neg_max_abs": 0.0229, "n_pos": 12, "n_neg": 2290}
    out = {"units": [1974, 910], "activation_target": 6.0389,
           "phrases": [{"phrase": "What is the", "unit": 1974, "gate": {"fit": {"auc": 1.0, "gap": 1.923}},
                        "fit_activation": act, "heldout_activation": held},
                       {"phrase": "What are", "unit": 910, "gate": {"fit": {"auc": 0.999, "gap": 0.5}},
                        "fit_activation": None, "heldout_activation": {"pos_min": None}}],
           "removal": {"chosen": [{"unit": 1974, "kl_mean": 2.886e-06, "kl_max": 0.00022},
                                  {"unit": 910, "kl_mean": None, "kl_max": None}]},
           "columns": [{"unit": 1974, "strength": 1.0, "rejected_logp": [-0.01, -2.4], "kl_to_target": 0.003,
                        "clamped": 0}]}
    if activation is not None:
        out["activation"] = activation
    return out


@pytest.mark.parametrize("activation, name", [("gelu", "GEGLU"), ("silu", "SwiGLU"), (None, "SwiGLU")])
def test_the_gated_section_names_the_activation_and_each_units_activation(activation, name):
    lines = gated_lines(_summary(activation))
    assert lines[0] == f"gated edit: units [1974, 910] ({name}, activation target 6.04)"
    text = "\n".join(lines)
    assert "'What is the': unit 1974, gate AUC 1.000, gap 1.92" in text
    assert "activation, fit: 30 contexts >= 5.94 (median 6.21), elsewhere |a| <= " in text
    assert "activation, held-out: 12 contexts >= 2.01 (median 5.35)" in text
    assert text.count("no contexts") == 2                           # "What are": none on either side
    assert "removal of unit 1974: KL on the anchors mean 2.89e-06" in text and "removal of unit 910" not in text
    assert "    1974 | 1 | -0.010 -> -2.400 | 0.003 | 0" in text


def test_no_gated_edit_no_section():
    assert gated_lines(None) == [] and gated_lines({}) == []
