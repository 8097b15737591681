"""Write a new GGUF from metadata and raw tensor rows (fixtures, test files, benchmarks).

Layout, as ggml writes it: header, metadata, tensor infos, zero padding to the alignment, then each
tensor's bytes at an aligned offset in the order given. Values are typed explicitly with `MetaValue`
or inferred (bool, int -> INT32 or INT64, float -> FLOAT32, str, numpy arrays by dtype, lists of
str/int/float/lists). The file is written to `path + ".tmp"`, fsynced and renamed.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import numpy as np
from gguf import GGUFValueType

from exactedit.errors import GGUFFormatError, QuantError
from exactedit.files import file_sha256, fsync_dir
from exactedit.quant.gguf.parse import (ARRAY_DTYPES, DEFAULT_ALIGNMENT, GGUF_MAGIC, SCALAR_FORMATS,
    SUPPORTED_VERSIONS, ggml_layout, row_bytes_of)

_VT = GGUFValueType
_FROM_DTYPE = {"u1": _VT.UINT8, "i1": _VT.INT8, "u2": _VT.UINT16, "i2": _VT.INT16, "u4": _VT.UINT32,
               "i4": _VT.INT32, "f4": _VT.FLOAT32, "b1": _VT.BOOL, "u8": _VT.UINT64, "i8": _VT.INT64,
               "f8": _VT.FLOAT64}


class MetaValue(NamedTuple):
    """A metadata value with its GGUF type; `elem_type` for arrays."""

    vtype: GGUFValueType
    value: Any
    elem_type: GGUFValueType | None = None


@dataclass(frozen=True)
class TensorData:
    """A tensor to write: ggml type name, shape in numpy order, raw uint8 rows [rows, row_bytes]."""

    type_name: str
    shape: tuple[int, ...]
    raw: np.ndarray

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if not 1 <= len(self.shape) <= 4 or min(self.shape) < 0:
            raise QuantError(f"tensor shape {self.shape} must have 1..4 non-negative dims")
        rows = int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1
        expected = (rows, row_bytes_of(self.type_name, self.shape[-1]))
        raw = np.asarray(self.raw)
        if raw.dtype != np.uint8 or raw.shape != expected:
            raise QuantError(f"{self.type_name} tensor of shape {self.shape} needs raw uint8 "
                             f"{expected}, got {raw.dtype} {raw.shape}")

    @classmethod
    def from_f32(cls, x) -> TensorData:
        """An F32 tensor from a float array (any shape of 1..4 dims)."""
        x = np.ascontiguousarray(x, dtype="<f4")
        rows = int(np.prod(x.shape[:-1])) if x.ndim > 1 else 1
        return cls("F32", x.shape, x.reshape(rows, -1).view(np.uint8))


@dataclass(frozen=True)
class WrittenGGUF:
    path: Path
    sha256: str
    data_offset: int
    offsets: dict[str, int]   # absolute offset of each tensor's bytes


def pack_string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _infer(value: Any) -> MetaValue:
    if isinstance(value, MetaValue):
        return value
    if isinstance(value, (bool, np.bool_)):
        return MetaValue(_VT.BOOL, bool(value))
    if isinstance(value, (int, np.integer)):
        return MetaValue(_VT.INT32 if -2**31 <= value < 2**31 else _VT.INT64, int(value))
    if isinstance(value, (float, np.floating)):
        return MetaValue(_VT.FLOAT32, float(value))
    if isinstance(value, (str, bytes)):
        return MetaValue(_VT.STRING, value)
    if isinstance(value, np.ndarray):
        kind = value.dtype.str[1:]
        if value.ndim != 1 or kind not in _FROM_DTYPE:
            raise QuantError(f"cannot store a numpy array of dtype {value.dtype}, ndim {value.ndim}")
        return MetaValue(_VT.ARRAY, value, _FROM_DTYPE[kind])
    if isinstance(value, (list, tuple)) and value:
        kinds = [_infer(v).vtype for v in value]
        if all(k == kinds[0] for k in kinds):
            return MetaValue(_VT.ARRAY, list(value), kinds[0])
        if set(kinds) <= {_VT.INT32, _VT.INT64}:
            return MetaValue(_VT.ARRAY, list(value), _VT.INT64)
        if set(kinds) <= {_VT.INT32, _VT.INT64, _VT.FLOAT32}:
            return MetaValue(_VT.ARRAY, [float(v) for v in value], _VT.FLOAT32)
    raise QuantError(f"cannot infer a GGUF type for {type(value).__name__} {value!r:.60}; "
                     "wrap it in MetaValue")


def pack_value(v: MetaValue) -> bytes:
    """The bytes of a value (without its leading type tag)."""
    if v.vtype == _VT.STRING:
        return pack_string(v.value)
    if v.vtype == _VT.ARRAY:
        if v.elem_type is None:
            raise QuantError("an ARRAY MetaValue needs elem_type")
        head = struct.pack("<IQ", int(v.elem_type), len(v.value))
        if v.elem_type == _VT.STRING:
            return head + b"".join(pack_string(s) for s in v.value)
        if v.elem_type == _VT.ARRAY:
            return head + b"".join(pack_value(_infer(x)) for x in v.value)
        return head + np.asarray(v.value).astype(ARRAY_DTYPES[v.elem_type]).tobytes()
    fmt = SCALAR_FORMATS[v.vtype]
    return struct.pack(fmt, int(v.value) if v.vtype == _VT.BOOL else v.value)


def encode_metadata(metadata: Mapping[str, Any]) -> bytes:
    out = []
    for key, value in metadata.items():
        v = _infer(value)
        out.append(pack_string(key) + struct.pack("<I", int(v.vtype)) + pack_value(v))
    return b"".join(out)


def encode_tensor_info(name: str, type_name: str, shape: tuple[int, ...], rel_offset: int) -> bytes:
    ne = tuple(reversed(shape))
    return (pack_string(name) + struct.pack(f"<I{len(ne)}Q", len(ne), *ne)
            + struct.pack("<IQ", ggml_layout(type_name)[0], rel_offset))


def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def write_gguf(path, metadata: Mapping[str, Any], tensors: Mapping[str, TensorData | tuple],
               *, alignment: int = DEFAULT_ALIGNMENT, version: int = 3,
               overwrite: bool = False) -> WrittenGGUF:
    """Writes a GGUF (tensors as TensorData or (type_name, shape, raw)); returns offsets and sha256."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise GGUFFormatError(path, "output", "exists; pass overwrite=True to replace it")
    if version not in SUPPORTED_VERSIONS:
        raise QuantError(f"GGUF version {version} cannot be written (expected 2 or 3)")
    if alignment <= 0 or alignment & (alignment - 1):
        raise QuantError(f"alignment {alignment} must be a positive power of two")
    metadata = dict(metadata)
    if alignment != DEFAULT_ALIGNMENT or "general.alignment" in metadata:
        given = metadata.get("general.alignment", MetaValue(_VT.UINT32, alignment))
        if not isinstance(given, MetaValue) or given.vtype != _VT.UINT32 or given.value != alignment:
            raise QuantError(f"general.alignment must be MetaValue(UINT32, {alignment})")
        metadata["general.alignment"] = given
    items = [(n, t if isinstance(t, TensorData) else TensorData(*t)) for n, t in tensors.items()]
    rel, offsets, infos = 0, {}, []
    for name, t in items:
        infos.append(encode_tensor_info(name, t.type_name, t.shape, rel))
        offsets[name] = rel
        rel = align_up(rel + t.raw.nbytes, alignment)
    head = (GGUF_MAGIC + struct.pack("<IQQ", version, len(items), len(metadata))
            + encode_metadata(metadata) + b"".join(infos))
    data_offset = align_up(len(head), alignment)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(head + bytes(data_offset - len(head)))
            for name, t in items:
                fh.write(bytes(data_offset + offsets[name] - fh.tell()))
                fh.write(np.ascontiguousarray(t.raw).tobytes())
            fh.write(bytes(data_offset + rel - fh.tell()))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)
    return WrittenGGUF(path, file_sha256(path), data_offset,
                       {n: data_offset + o for n, o in offsets.items()})


def synthetic_model(path, *, tail: str = "rmsnorm", vocab: int = 300, n: int = 256, h: int = 64,
                    layers: int = 2, tied: bool = False, head_type: str = "Q6_K", d_lo: int = 32,
                    seed: int = 0, metadata: Mapping[str, Any] | None = None,
                    overwrite: bool = False, down_type: str = "Q8_0", post_norm: bool = False,
                    ffn_type: str | None = None) -> WrittenGGUF:
    """A small model-shaped GGUF with random weights and a `vocab`-token table, for tests and benches.

    tail "rmsnorm": output_norm + output (or tied token_embd) + blk.L.ffn_down (`down_type`), and
    with `post_norm` a Gemma-style blk.L.post_ffw_norm (F32, weights of mixed sign), with `ffn_type`
    the FFN's blk.L.ffn_norm (F32) and ffn_gate / ffn_up ([h, n] in that type);
    tail "hc4": output_hc_norm (F32) / _down / _up (BF16) + output + blk.L.ffn_down_shexp (`down_type`).
    """
    from exactedit.quant import quantize

    if tail not in ("rmsnorm", "hc4"):
        raise QuantError(f"tail must be 'rmsnorm' or 'hc4', got {tail!r}")
    if post_norm and tail != "rmsnorm":
        raise QuantError("a post-FFN norm is an rmsnorm tail's (Gemma style)")
    rng = np.random.default_rng(seed)
    arch = "llama" if tail == "rmsnorm" else "hc4test"

    def q(type_name: str, *shape: int, scale: float = 0.05) -> TensorData:
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        return TensorData(type_name, shape, quantize(x.reshape(-1, shape[-1]), type_name))

    meta: dict[str, Any] = {
        "general.architecture": arch, "general.name": f"synthetic {tail}",
        f"{arch}.block_count": MetaValue(_VT.UINT32, layers),
        f"{arch}.embedding_length": MetaValue(_VT.UINT32, n),
        f"{arch}.attention.layer_norm_rms_epsilon": MetaValue(_VT.FLOAT32, 1e-5),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": [f"tok{i}" for i in range(vocab)],
        "tokenizer.ggml.token_type": np.ones(vocab, np.int32),
    }
    meta.update(metadata or {})
    tensors: dict[str, TensorData] = {"token_embd.weight": q(head_type, vocab, n)}
    down = "ffn_down.weight" if tail == "rmsnorm" else "ffn_down_shexp.weight"
    for i in range(layers):
        tensors[f"blk.{i}.attn_norm.weight"] = TensorData.from_f32(1 + rng.standard_normal(n) * 0.1)
        tensors[f"blk.{i}.{down}"] = q(down_type, n, h)
        if ffn_type is not None and tail == "rmsnorm":
            tensors[f"blk.{i}.ffn_norm.weight"] = TensorData.from_f32(1 + rng.standard_normal(n) * 0.1)
            tensors[f"blk.{i}.ffn_gate.weight"] = q(ffn_type, h, n)
            tensors[f"blk.{i}.ffn_up.weight"] = q(ffn_type, h, n)
        if post_norm:
            tensors[f"blk.{i}.post_ffw_norm.weight"] = TensorData.from_f32(1 + rng.standard_normal(n) * 0.5)
    if tail == "rmsnorm":
        tensors["output_norm.weight"] = TensorData.from_f32(1 + rng.standard_normal(n) * 0.1)
    else:
        tensors["output_hc_norm.weight"] = TensorData.from_f32(1 + rng.standard_normal((4, n)) * 0.1)
        tensors["output_hc_down.weight"] = q("BF16", d_lo + 8, 4 * n)
        tensors["output_hc_up.weight"] = q("BF16", 4 * n, d_lo)
    if not tied:
        tensors["output.weight"] = q(head_type, vocab, n)
    return write_gguf(path, meta, tensors, overwrite=overwrite)
