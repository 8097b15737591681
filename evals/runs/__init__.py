"""The code behind the `solve head`, `solve wfld` and `eval ...` commands: each puts the protocol,
the ledger and the split around the solvers' math (`head_run` with `head_inputs`, `head_testonce`,
`head_report`; `wfld_run`), the `eval` commands as library calls (`workflow`), the one-shot blind
sign-off (`blind`) and what the commands print (`render`). Imported only by cli.py, fixtures/,
bench/ and other runs (tests/test_layers.py).

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "WfldInputs": "wfld_run",
    "blind_report": "render",
    "blind_signoff": "workflow:blind",
    "export_report": "render",
    "head_solve_report": "head_report:solve_report",
    "ledger_report": "render",
    "recorded_test_report": "render",
    "register": "workflow",
    "register_report": "render",
    "score": "workflow",
    "score_report": "render",
    "score_test": "workflow",
    "solve_head": "head_run",
    "solve_wfld": "wfld_run",
    "split": "workflow",
    "split_report": "render",
    "test_report": "render",
    "wfld_solve_report": "wfld_run:solve_report",
    "write_head_bundle": "head_run",
})
