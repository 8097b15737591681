"""Bridges to compiled engines: llama.cpp through llama-cpp-python (`llamacpp`, `capture`,
`generate`, `mine`), the real public models of the `live` extra (`models`), live verification
(`verify`, `verify_engine`), the production engine's file contract (`strata`), llama-perplexity's
KL file format and the untie of a tied head (`untie`). See docs/live.md.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "EngineSettings": "llamacpp",
    "LlamaEngine": "llamacpp",
    "locate": "models",
    "verify_live": "verify",
})
