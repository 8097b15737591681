"""Evaluation under a pre-registered protocol (SPEC.md section 7): protocols (`protocol`), the
hash-chained ledger and its anchors (`ledger`, `anchors`), splits, bars, KL statistics (`kld`),
shaping rules, phrase rates, reports, test-once, the blind sign-off and its registry, and the
drivers that run a solve under a protocol (`head_run`, `wfld_run`, `workflow`).

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "Ledger": "ledger",
    "WfldInputs": "wfld_run",
    "anti_slop_bars": "bars",
    "build_splits": "splits",
    "load_protocol": "protocol",
    "persona_bars": "bars",
    "solve_head": "head_run",
    "solve_wfld": "wfld_run",
    "write_head_bundle": "head_run",
})
