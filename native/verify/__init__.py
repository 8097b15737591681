"""Live verification: does a compiled engine loading the edited GGUF produce the predicted logits?
On llama.cpp (`live`), and through the production engine's command contract (`strata`, `production`).

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "EngineCommand": "strata",
    "Tolerance": "live",
    "check_edit": "live",
    "render_contract_run": "strata",
    "render_report": "live",
    "run_llamacpp": "strata",
    "verify_engine": "production",
    "verify_live": "live",
})
