"""The exact tail: from a dump's fields to full-vocabulary logits, and the passes over the head.

dump fields -> last-layer write (R') -> the head's mix -> logits. `forward/`: each forward has a
float64 numpy reference beside its float32 fast paths (`head_ref` / `head_fast`, `last_layer_ref` /
`last_layer_fast`), with the jitted forwards' row buckets, JAX's persistent compilation cache and
the device configuration. `passes/`: the streaming full-vocabulary pass (`vocab_pass`, on a device:
`device_pass`) and the KL pass (`kl_pass` reference, `kl_pass_numba`, `kl_pass_jax`). Here: the
partition function under a head-row edit (`partition`), the engine-faithful path (`engine_math`), the
tail's weights from a GGUF (`model`), the per-row scores every bar is a function of (`scores`), the
rows a style is decided on and the paragraph starts (`decision`), the bound on how far an edit of a
few down columns moves a row's logits and the per-row memo of scored edits (`moved`) and
`exactedit logits` (`logits`).
Imports only quant/ and dumps/.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "ArrayRows": "passes.vocab_pass", "QuantRows": "passes.vocab_pass", "RowSource": "passes.vocab_pass",
    "VocabPass": "passes.vocab_pass", "gguf_rows": "passes.vocab_pass",
    "KlRows": "passes.kl_pass", "kl_rows": "passes.kl_pass",
    "head_pass": "logits", "open_pair": "logits", "parse_rows": "logits", "tail_mix": "logits",
    "render_logits": "logits", "write_logits": "logits",
    "TokenTable": "model", "load_tail": "model", "load_tokens": "model",
    "DocMeta": "scores", "RowScores": "scores", "concat": "scores", "rows_from_logits": "scores",
    "decision_rows": "decision", "paragraph_starts": "decision", "role_bits": "decision",
})
