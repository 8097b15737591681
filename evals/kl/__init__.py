"""KL statistics of an edited model against its base: llama.cpp's conventions (`llamacpp`) and its
report (`llamacpp_stats`), the statistics of `exactedit kld` (`stats`, `compare`) and the
`llama-perplexity --kl-divergence-base` file format (`base_file`). Imports nothing of evals.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "KldConfig": "compare",
    "kld_stats": "stats",
    "read_base_file": "base_file",
})
