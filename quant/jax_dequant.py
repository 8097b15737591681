"""ggml dequantization in JAX, from the raw bytes: the head travels to a device as its Q6_K bytes
(521 MB at production size) and is expanded to float32 one tile at a time, on the device.

Bit-identical to `quant.dequantize` (the numba fast paths) for every byte pattern:
  * fp16 scales are converted with integer bit operations (normal, subnormal, inf, NaN made
    quiet as ggml does), never through a float16 type whose conversion a backend might flush;
  * Q6_K values are (d * scales[j]) * (code - 32) and Q8_0 values float(qs) * d, in float32 and
    in that order, exactly as the numpy references and the numba kernels compute them, with the host's
    NaN results (`mul_host`: a GPU would give its one canonical NaN for inf * 0 and NaN operands);
  * BF16, F16 and F32 are pure bit moves (BF16: the two bytes become the top of a float32).
The functions are traceable (call them inside jit): `dequantize(raw, qtype, cols)` takes uint8
[rows, row_bytes] and returns float32 [rows, cols]; `dequantize_jit` is the jitted entry point.
"""
from __future__ import annotations

from functools import partial

import gguf
import jax
import jax.numpy as jnp
import numpy as np

from exactedit.errors import QuantError

SUPPORTED: tuple[str, ...] = ("F32", "F16", "BF16", "Q8_0", "Q6_K")

_U32 = jnp.uint32
_F32 = jnp.float32
_TWO_POW_M24 = np.float32(2.0 ** -24)


def _sizes(qtype: str) -> tuple[int, int]:
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]


def fp16_bits_to_f32(h):
    """float32 of binary16 bit patterns (any integer array holding 0..65535), exact.

    Normal: the exponent rebiased by 127 - 15 and the 10 significand bits moved up by 13.
    Subnormal: significand * 2**-24, an exact float32 product with a normal result.
    Inf / NaN: the float32 all-ones exponent; a NaN gets the quiet bit, as ggml's conversion."""
    h = jnp.asarray(h).astype(_U32)
    sign = (h & 0x8000) << 16
    exp = (h >> 10) & 0x1F
    mant = h & 0x3FF
    normal = ((exp + (127 - 15)) << 23) | (mant << 13)
    quiet = jnp.where(mant != 0, _U32(0x400000), _U32(0))
    inf_nan = _U32(0x7F800000) | (mant << 13) | quiet
    sub = jax.lax.bitcast_convert_type(mant.astype(_F32) * _TWO_POW_M24, _U32)
    bits = jnp.where(exp == 0, sub, jnp.where(exp == 0x1F, inf_nan, normal)) | sign
    return jax.lax.bitcast_convert_type(bits, _F32)


with np.errstate(invalid="ignore"):  # the host CPU's NaN for inf * 0 (x86: 0xFFC00000)
    _HOST_DEFAULT_NAN = (np.array([np.inf], np.float32) * np.array([0], np.float32)).view(np.uint32)[0]


def mul_host(a, b):
    """float32 a * b with the host CPU's NaN results, which the numpy and numba paths produce: a NaN
    operand is returned as is (the first one if both are NaN), and an invalid product with no NaN
    operand (inf * 0) is the host's default NaN (0xFFC00000 on x86). A GPU returns one canonical
    NaN instead, so without this the bits of NaN outputs would depend on the backend. Operand NaNs
    here are always quiet (fp16 conversion makes them so)."""
    r = a * b
    default = jax.lax.bitcast_convert_type(jnp.full(r.shape, _HOST_DEFAULT_NAN), _F32)
    return jnp.where(jnp.isnan(a), a, jnp.where(jnp.isnan(b), b, jnp.where(jnp.isnan(r), default, r)))


def _le16(lo, hi):
    """Little-endian uint16 value of two byte arrays, as uint32."""
    return lo.astype(_U32) | (hi.astype(_U32) << 8)


def _int8(b):
    return jax.lax.bitcast_convert_type(b.astype(jnp.uint8), jnp.int8)


def q6_k(raw, cols: int):
    """Q6_K rows uint8 [rows, cols / 256 * 210] -> float32 [rows, cols]."""
    qk, size = _sizes("Q6_K")
    rows, nb = raw.shape[0], cols // qk
    b = raw.reshape(rows, nb, size)
    ql = b[..., :qk // 2].astype(jnp.int32).reshape(rows, nb, 2, 2, 32)   # [.., half, ql half, l]
    qh = b[..., qk // 2:qk // 2 + qk // 4].astype(jnp.int32).reshape(rows, nb, 2, 32)
    scales = _int8(b[..., 3 * qk // 4:3 * qk // 4 + qk // 16]).astype(_F32)  # [rows, nb, 16]
    d = fp16_bits_to_f32(_le16(b[..., size - 2], b[..., size - 1]))         # [rows, nb]
    lo = jnp.stack([ql[..., 0, :] & 0xF, ql[..., 1, :] & 0xF, ql[..., 0, :] >> 4, ql[..., 1, :] >> 4], axis=3)
    hi = jnp.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=3)           # [.., half, 4, l]
    q = ((lo | (hi << 4)) - 32).astype(_F32).reshape(rows, nb, qk // 16, 16)
    ds = mul_host(jnp.broadcast_to(d[..., None], scales.shape), scales)
    return mul_host(jnp.broadcast_to(ds[..., None], q.shape), q).reshape(rows, cols)


def q8_0(raw, cols: int):
    """Q8_0 rows uint8 [rows, cols / 32 * 34] -> float32 [rows, cols]."""
    qk, size = _sizes("Q8_0")
    rows, nb = raw.shape[0], cols // qk
    b = raw.reshape(rows, nb, size)
    d = fp16_bits_to_f32(_le16(b[..., 0], b[..., 1]))
    qs = _int8(b[..., 2:]).astype(_F32)
    return mul_host(qs, jnp.broadcast_to(d[..., None], qs.shape)).reshape(rows, cols)


def bf16(raw, cols: int):
    """BF16 rows uint8 [rows, 2 * cols] -> float32 [rows, cols]."""
    b = raw.reshape(raw.shape[0], cols, 2)
    return jax.lax.bitcast_convert_type(_le16(b[..., 0], b[..., 1]) << 16, _F32)


def f16(raw, cols: int):
    """F16 rows uint8 [rows, 2 * cols] -> float32 [rows, cols]."""
    b = raw.reshape(raw.shape[0], cols, 2)
    return fp16_bits_to_f32(_le16(b[..., 0], b[..., 1]))


def f32(raw, cols: int):
    """F32 rows uint8 [rows, 4 * cols] -> float32 [rows, cols]."""
    b = raw.reshape(raw.shape[0], cols, 4).astype(_U32)
    bits = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    return jax.lax.bitcast_convert_type(bits, _F32)


_KERNELS = {"Q6_K": q6_k, "Q8_0": q8_0, "BF16": bf16, "F16": f16, "F32": f32}


def check_shape(shape, qtype: str, cols: int) -> None:
    """QuantError unless `shape` is [rows, row_bytes] of `qtype` rows of `cols` values."""
    from exactedit.quant import registry

    if qtype not in _KERNELS:
        raise QuantError(f"qtype {qtype!r}: no JAX dequantizer; expected one of {', '.join(SUPPORTED)}")
    nbytes = registry.row_bytes(qtype, cols)
    if len(shape) != 2 or shape[1] != nbytes:
        raise QuantError(f"raw: expected shape [rows, {nbytes}] for {qtype} rows of {cols} values, "
                         f"got {tuple(shape)}")


def dequantize(raw, qtype: str, cols: int):
    """Traceable: uint8 [rows, row_bytes] -> float32 [rows, cols] (same values and bits as
    `quant.dequantize`). Shape and type are checked at trace time."""
    check_shape(raw.shape, qtype, cols)
    if raw.dtype != jnp.uint8:
        raise QuantError(f"raw: expected uint8 bytes of {qtype} rows, got dtype {raw.dtype}")
    return _KERNELS[qtype](raw, cols)


@partial(jax.jit, static_argnames=("qtype", "cols"))
def dequantize_jit(raw, qtype: str, cols: int):
    """`dequantize` compiled for the device that holds `raw`."""
    return dequantize(raw, qtype, cols)
