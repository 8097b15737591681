"""The exact tail: from a dump's fields to full-vocabulary logits, and the passes over the head.

dump fields -> last-layer write (R') -> the head's mix -> logits. Each forward has a float64 numpy
reference beside its float32 fast paths (`head_ref` / `head_fast`, `l47_ref` / `l47_fast`); the
streaming full-vocabulary pass (`vocab_pass`, on a device: `device_pass`), the KL pass (`kl_pass`
reference, `kl_pass_numba`, `kl_pass_jax`), the partition function under a head-row edit
(`partition`), the engine-faithful path (`engine`), the tail's weights from a GGUF (`model`), the
per-row scores every bar is a function of (`scores`) and `exactedit logits` (`logits`); the row
buckets of the jitted forwards (`buckets`) and JAX's persistent compilation cache with a compile
counter (`jax_cache`).
Imports only quant/ and dumps/.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "ArrayRows": "vocab_pass", "QuantRows": "vocab_pass", "RowSource": "vocab_pass", "VocabPass": "vocab_pass",
    "gguf_rows": "vocab_pass",
    "KlRows": "kl_pass", "kl_rows": "kl_pass",
    "head_pass": "logits", "open_pair": "logits", "parse_rows": "logits", "tail_mix": "logits",
    "render_logits": "logits", "write_logits": "logits",
    "TokenTable": "model", "load_tail": "model", "load_tokens": "model",
    "DocMeta": "scores", "RowScores": "scores", "concat": "scores", "rows_from_logits": "scores",
})
