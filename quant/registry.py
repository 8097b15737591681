"""ggml type name -> its format module, with the block sizes taken from gguf-py.

Each format module (quant/formats/f32.py, f16.py, bf16.py, q8_0.py, q6_k.py, q4_0.py, q4_1.py, q5_0.py,
q4_k.py, q5_k.py) provides the same four functions: `quantize_ref(x) -> raw` and
`dequantize_ref(raw, cols) -> x` (numpy references), and `quantize_into(x, out)` /
`dequantize_into(raw, out)` (fast paths writing into preallocated arrays). The registry adds the
block layout from `gguf.GGML_QUANT_SIZES` and checks shapes.
"""
from __future__ import annotations

import operator
from types import ModuleType
from typing import Callable, NamedTuple

import gguf

from exactedit.quant.formats import bf16, f16, f32, q4_0, q4_1, q5_0, q8_0
from exactedit.quant.kquants import q4_k, q5_k, q6_k
from exactedit.errors import QuantError


class Format(NamedTuple):
    """One ggml tensor type: block layout, numpy references and fast paths."""

    name: str
    block_size: int        # values per block
    type_size: int         # bytes per block
    quantize_ref: Callable
    dequantize_ref: Callable
    quantize_into: Callable
    dequantize_into: Callable


def _format(module: ModuleType) -> Format:
    block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[module.NAME]]
    return Format(module.NAME, block_size, type_size, module.quantize_ref, module.dequantize_ref,
                  module.quantize_into, module.dequantize_into)


FORMATS: dict[str, Format] = {m.NAME: _format(m) for m in (f32, f16, bf16, q8_0, q6_k, q4_0, q4_1, q5_0,
                                                        q4_k, q5_k)}
SUPPORTED: tuple[str, ...] = tuple(FORMATS)


def get(qtype: str) -> Format:
    """The format of a ggml type name ("Q6_K"); QuantError if it is not supported."""
    try:
        return FORMATS[qtype]
    except (KeyError, TypeError):
        raise QuantError(f"qtype {qtype!r}: unsupported ggml type; expected one of "
                         f"{', '.join(SUPPORTED)}") from None


def row_bytes(qtype: str, cols: int) -> int:
    """Bytes of one row of `cols` values; QuantError if cols is not a whole number of blocks."""
    fmt = get(qtype)
    try:
        cols = operator.index(cols)
    except TypeError:
        raise QuantError(f"cols {cols!r}: expected a positive integer") from None
    if cols <= 0 or cols % fmt.block_size:
        raise QuantError(f"cols {cols}: a {qtype} row must be a positive multiple of "
                         f"{fmt.block_size} values")
    return cols // fmt.block_size * fmt.type_size
