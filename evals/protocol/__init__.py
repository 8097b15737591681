"""Protocol integrity: the pre-registered protocol (`protocol`), the append-only hash-chained ledger
(`ledger`) and its exported anchors (`anchors`), train / dev / test splits (`splits`), test-once
(`testonce`) and the user-level registry of blind runs (`registry`). Imports nothing of evals.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "DEFAULT_WORKSPACE": "ledger",
    "Ledger": "ledger",
    "LedgerRefusal": "ledger",
    "build_splits": "splits",
    "export_head": "anchors",
    "load_protocol": "protocol",
    "record_splits": "splits",
    "render_verification": "anchors",
    "resolve_tokens": "protocol",
    "verify_ledger": "anchors",
    "write_protocol": "protocol",
})
