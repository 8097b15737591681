"""What the engine actually multiplies with (SPEC.md section 2).

The engine does not multiply with BF16 tensors directly: at load it makes a Q8_0 copy of each
(rows in blocks of 32 along the columns) and uses that. So the runtime view of a BF16 tensor is
dequant(quant_q8_0(bf16 values)); every other stored type is used as dequantized.
"""
from __future__ import annotations

import numpy as np

from exactedit import quant
from exactedit.errors import QuantError


def runtime_q8_0(x) -> np.ndarray:
    """dequant(quant_q8_0(x)) float32 [rows, cols], for x the bf16 values of a tensor as float32
    [rows, cols] (1-D: one row). Values that are not exactly bf16 are refused: the engine would
    round them to bf16 first, so round them with quant.quantize(x, "BF16") and say so."""
    x = np.asarray(x, dtype=np.float32)
    bits = np.ascontiguousarray(x).view(np.uint32)
    low = (bits & 0xFFFF) != 0
    if low.any():
        where = tuple(int(i) for i in np.argwhere(low)[0])
        raise QuantError(f"x{list(where)} = {x[where]!r}: expected a bf16 value (as float32, low 16 "
                         f"bits zero); quantize the tensor to BF16 first")
    cols = x.shape[-1]
    return quant.dequantize(quant.quantize(x, "Q8_0"), "Q8_0", cols)


def runtime_view(raw, qtype: str, cols: int) -> np.ndarray:
    """float32 [rows, cols] that the engine multiplies with, for stored rows `raw` of `qtype`:
    BF16 -> its Q8_0 copy, dequantized; any other type -> dequantized."""
    values = quant.dequantize(raw, qtype, cols)
    if qtype == "BF16":
        return runtime_q8_0(values)
    return values
