"""llama.cpp through llama-cpp-python's ctypes API: the engine (`engine`), dumps captured off its graph
(`capture`), the model's own chat (`chat`), labelled documents (`documents`), llama-perplexity's
chunks (`perplexity_chunks`), the real public models of the `live` extra (`models`), and generation:
one door, `sample_replies` (`sample`), in front of two engines, the one-at-a-time loop with a per-step
logits hook (`generate`) and its batched form (`batched`), both with the rules' rewind mode
(`rewind`: a banned phrase or a variant rolled back and resampled); every reply is a `Generation`.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "DumpInputs": "documents",
    "EngineError": "engine",
    "EngineSettings": "engine",
    "Generation": "generate",
    "Sampling": "generate",
    "SEED_LIMIT": "generate",
    "LlamaEngine": "engine",
    "RewindConfig": "rewind",
    "default_gpu_layers": "engine",
    "dump_documents": "documents",
    "dump_text_chunks": "perplexity_chunks",
    "import_dump": "documents",
    "locate": "models",
    "render_chunk_dump": "perplexity_chunks",
    "render_documents": "documents",
    "render_import": "documents",
    "sample_replies": "sample",
    "seed_problem": "generate",
})
