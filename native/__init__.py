"""Bridges to compiled engines, one concept per sub-package: `llamacpp` (the engine through
llama-cpp-python, capture of dumps, the model's chat, labelled documents, the real public models of
the `live` extra, the one generation loop and its batched form), `shaping` (the sampler rules live:
compile, rates, bitwise verification, the C reference of the compiled format), `verify` (live
verification on llama.cpp and through the production engine's command contract). The code behind
the commands that use them is in runs/. See docs/live.md.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "EngineSettings": "llamacpp.engine",
    "LlamaEngine": "llamacpp.engine",
    "locate": "llamacpp.models",
    "verify_live": "verify.live",
})
