"""The exact tail: from a dump's fields to full-vocabulary logits, and the passes over the head.

dump fields -> last-layer write (R') -> the head's mix -> logits. Each forward has a float64 numpy
reference beside its float32 fast paths (`head_ref` / `head_fast`, `l47_ref` / `l47_fast`); the
streaming full-vocabulary pass (`vocab_pass`, on a device: `device_pass`), the KL pass (`kl_pass`
reference, `kl_pass_numba`, `kl_pass_jax`), the partition function under a head-row edit
(`partition`), the engine-faithful path (`engine`), the tail's weights from a GGUF (`model`), the
per-row scores every bar is a function of (`scores`) and `exactedit logits` (`logits`).
Imports only quant/ and dumps/.
"""
from exactedit.solvers.tail.kl_pass import KlRows, kl_rows
from exactedit.solvers.tail.logits import head_pass, open_pair, parse_rows, tail_mix, write_logits
from exactedit.solvers.tail.model import TokenTable, load_tail, load_tokens
from exactedit.solvers.tail.scores import DocMeta, RowScores, concat, rows_from_logits
from exactedit.solvers.tail.vocab_pass import ArrayRows, QuantRows, RowSource, VocabPass, gguf_rows, vocab_pass

__all__ = [
    "ArrayRows", "DocMeta", "KlRows", "QuantRows", "RowScores", "RowSource", "TokenTable", "VocabPass",
    "concat", "gguf_rows", "head_pass", "kl_rows", "load_tail", "load_tokens", "open_pair", "parse_rows",
    "rows_from_logits", "tail_mix", "vocab_pass", "write_logits",
]
