"""Evaluation under a pre-registered protocol (SPEC.md section 7), one concept per sub-package:
`protocol` (the TOML protocol, the hash-chained ledger and its anchors, splits, test-once, the blind
registry), `scoring` (RowScores -> bars, bootstrap intervals, bar reports, bar (d) use by use),
`kl` (KL statistics in llama.cpp's form, its base-file format), `rates` (phrase rates of free
generation, variant artefacts) and `discover` (the phrases a model over-uses against the user's own
writing). The code behind the `solve` and `eval` commands is in runs/ (runs/solve, runs/eval).

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "Ledger": "protocol.ledger",
    "anti_slop_bars": "scoring.bars",
    "build_splits": "protocol.splits",
    "load_protocol": "protocol.protocol",
    "persona_bars": "scoring.bars",
})
