"""Scoring: the bars of SPEC.md section 7 as pure functions of RowScores (`bars`), bar (d) use by
use (`collateral`), bootstrap intervals over documents (`bootstrap`), bar reports as table / JSON /
PNG (`report`) and `eval score`'s scoring of dumps (`evaluate`). Imports evals.protocol and evals.kl.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "BarContext": "bars",
    "BarReport": "report",
    "ScoreConfig": "evaluate",
    "anti_slop_bars": "bars",
    "collateral_lines": "collateral",
    "collateral_uses": "collateral",
    "persona_bars": "bars",
    "verdict": "bars",
})
