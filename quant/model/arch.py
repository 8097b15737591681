"""Recognize a model's tail (final norm/mixer, output head, last-layer FFN down projection) from its tensors.

Two architectures (SPEC.md section 2), told apart by the tensors present, never by
`general.architecture`:
- "hc4": `output_hc_norm/down/up.weight` exist; the edited FFN is `blk.L.ffn_down_shexp.weight`
  with L the highest block that has one. Its RMS eps is SPEC.md's constant 1e-6 and its mix scale
  the constant 1/4, so a tail with another stream count is refused, not computed with a wrong scale.
- "rmsnorm": `output_norm.weight`, then `output.weight` (or the tied `token_embd.weight`); the
  last-layer FFN is `blk.L.ffn_down.weight`, optionally preceded by `blk.L.post_ffw_norm.weight`.
  RMS eps and the final logit softcap come from metadata.
Blocks that metadata marks as next-token-prediction layers (`{arch}.nextn_predict_layers`, counted
from the end of `{arch}.block_count`) are not the model's last layer and are skipped.
`summarize(path)` is what `exactedit inspect` reports.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from exactedit.quant import gguf
from exactedit.errors import GGUFFormatError

HC4_RMS_EPS = 1e-6
HC4_STREAMS = 4  # the head mix is 1/4 * sum over the streams (SPEC.md section 2): a fixed 4


@dataclass(frozen=True)
class TailTensor:
    role: str
    name: str
    type_name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class TailSpec:
    """The tail: kind, sizes, and each role's tensor (name, type, shape)."""

    kind: str                       # "hc4" or "rmsnorm"
    layer: int                      # L, the last layer (its FFN down projection is editable)
    n: int                          # model width
    vocab: int                      # V, rows of the head
    h: int                          # FFN hidden width of layer L (cols of its down projection)
    tied: bool                      # head is token_embd.weight
    tensors: tuple[TailTensor, ...]
    rms_eps: float | None
    streams: int | None = None      # hc4: residual streams
    d_lo: int | None = None         # hc4: cols of output_hc_up
    logit_softcap: float | None = None
    architecture: str | None = None  # general.architecture, for information only

    @property
    def names(self) -> dict[str, str]:
        return {t.role: t.name for t in self.tensors}

    def tensor(self, role: str) -> TailTensor:
        for t in self.tensors:
            if t.role == role:
                return t
        raise KeyError(f"{self.kind} tail has no role {role!r}; roles: {list(self.names)}")

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("kind", "layer", "n", "vocab", "h", "tied", "rms_eps",
                                           "streams", "d_lo", "logit_softcap", "architecture")}
        d["tensors"] = {t.role: {"name": t.name, "type": t.type_name, "shape": list(t.shape)}
                        for t in self.tensors}
        return d


def _last_layer(g: gguf.GGUFFile, suffix: str) -> int:
    pattern = re.compile(rf"blk\.(\d+)\.{re.escape(suffix)}")
    layers = sorted(int(m.group(1)) for name in g.tensors if (m := pattern.fullmatch(name)))
    arch = g.get("general.architecture")
    blocks, nextn = g.get(f"{arch}.block_count"), g.get(f"{arch}.nextn_predict_layers")
    if isinstance(blocks, int) and isinstance(nextn, int) and nextn > 0:
        layers = [n for n in layers if n < blocks - nextn]
    if not layers:
        raise GGUFFormatError(g.path, "tail", f"no blk.N.{suffix} tensor (outside next-token-"
                                              "prediction layers)")
    return layers[-1]


def _take(g: gguf.GGUFFile, role: str, name: str, expect: Callable[[tuple], bool],
          what: str) -> TailTensor:
    info = g.tensor(name)
    if not expect(info.shape):
        raise GGUFFormatError(g.path, f"tensor {name}", f"shape {info.shape} (numpy order), "
                                                       f"expected {what}")
    return TailTensor(role, name, info.type_name, info.shape)


def _head(g: gguf.GGUFFile) -> tuple[str, bool]:
    if "output.weight" in g.tensors:
        return "output.weight", False
    if "token_embd.weight" in g.tensors:
        return "token_embd.weight", True
    raise GGUFFormatError(g.path, "tail", "no output.weight and no token_embd.weight to tie to")


def _metadata_float(g: gguf.GGUFFile, suffix: str) -> float | None:
    arch = g.get("general.architecture")
    value = g.get(f"{arch}.{suffix}")
    if value is None:
        keys = [k for k in g.metadata_keys() if k.endswith("." + suffix)]
        value = g.get(keys[0]) if len(keys) == 1 else None
    return float(value) if isinstance(value, (int, float, np.floating)) else None


def _hc4(g: gguf.GGUFFile) -> TailSpec:
    norm = g.tensor("output_hc_norm.weight")
    if len(norm.shape) != 2:
        raise GGUFFormatError(g.path, "tensor output_hc_norm.weight",
                              f"shape {norm.shape}, expected (streams, n)")
    s, n = norm.shape
    if s != HC4_STREAMS:
        raise GGUFFormatError(g.path, "tensor output_hc_norm.weight",
                              f"{s} residual streams; hc4 mixes exactly {HC4_STREAMS} (its mix scale is the "
                              f"constant 1/{HC4_STREAMS}, SPEC.md section 2)")
    up = g.tensor("output_hc_up.weight")
    d_lo = up.shape[-1]
    head_name, tied = _head(g)
    L = _last_layer(g, "ffn_down_shexp.weight")
    head = _take(g, "head", head_name, lambda x: len(x) == 2 and x[1] == n, f"(V, {n})")
    ffn = _take(g, "ffn_down", f"blk.{L}.ffn_down_shexp.weight", lambda x: len(x) == 2 and x[0] == n,
                f"({n}, h)")
    tensors = (TailTensor("hc_norm", norm.name, norm.type_name, norm.shape),
               _take(g, "hc_down", "output_hc_down.weight",
                     lambda x: len(x) == 2 and x[0] >= d_lo and x[1] == s * n, f"(>= {d_lo}, {s * n})"),
               _take(g, "hc_up", "output_hc_up.weight", lambda x: x == (s * n, d_lo),
                     f"({s * n}, d_lo)"),
               head, ffn)
    return TailSpec("hc4", L, n, head.shape[0], ffn.shape[1], tied, tensors, HC4_RMS_EPS,
                    streams=s, d_lo=d_lo, logit_softcap=_metadata_float(g, "final_logit_softcapping"),
                    architecture=g.get("general.architecture"))


def _rmsnorm(g: gguf.GGUFFile) -> TailSpec:
    norm = g.tensor("output_norm.weight")
    if len(norm.shape) != 1:
        raise GGUFFormatError(g.path, "tensor output_norm.weight", f"shape {norm.shape}, expected (n,)")
    (n,) = norm.shape
    head_name, tied = _head(g)
    L = _last_layer(g, "ffn_down.weight")
    head = _take(g, "head", head_name, lambda x: len(x) == 2 and x[1] == n, f"(V, {n})")
    ffn = _take(g, "ffn_down", f"blk.{L}.ffn_down.weight", lambda x: len(x) == 2 and x[0] == n,
                f"({n}, h)")
    tensors = [TailTensor("output_norm", norm.name, norm.type_name, norm.shape), head, ffn]
    post = f"blk.{L}.post_ffw_norm.weight"
    if post in g.tensors:
        tensors.append(_take(g, "post_ffn_norm", post, lambda x: x == (n,), f"({n},)"))
    return TailSpec("rmsnorm", L, n, head.shape[0], ffn.shape[1], tied, tuple(tensors),
                    _metadata_float(g, "attention.layer_norm_rms_epsilon"),
                    logit_softcap=_metadata_float(g, "final_logit_softcapping"),
                    architecture=g.get("general.architecture"))


def detect_tail(g: gguf.GGUFFile) -> TailSpec:
    """The tail of an opened GGUF; GGUFFormatError when it is neither hc4 nor a plain rmsnorm head."""
    hc = [f"output_hc_{p}.weight" for p in ("norm", "down", "up")]
    present = [name for name in hc if name in g.tensors]
    if len(present) == 3:
        return _hc4(g)
    if present:
        missing = sorted(set(hc) - set(present))
        raise GGUFFormatError(g.path, "tail", f"has {', '.join(present)} but not {', '.join(missing)}:"
                                              " an incomplete hc4 tail")
    if "output_norm.weight" in g.tensors:
        return _rmsnorm(g)
    raise GGUFFormatError(g.path, "tail", "neither hc4 (output_hc_norm/down/up.weight) nor rmsnorm "
                                          f"(output_norm.weight) tensors among {len(g.tensors)} tensors")


@dataclass(frozen=True)
class ModelSummary:
    """What `exactedit inspect` reports about a GGUF."""

    path: str
    sha256: str
    size: int
    version: int
    alignment: int
    tensor_count: int
    tail: TailSpec | None
    tail_error: str | None
    metadata: tuple[tuple[str, str], ...]   # (key, short rendering of its value)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "size": self.size, "version": self.version,
                "alignment": self.alignment, "tensor_count": self.tensor_count,
                "tail": None if self.tail is None else self.tail.to_dict(),
                "tail_error": self.tail_error, "metadata": dict(self.metadata)}


def _short(g: gguf.GGUFFile, key: str, width: int = 60) -> str:
    info = g.metadata_info(key)
    if info.type_name == "ARRAY":
        return f"[{info.elem_type} x {info.count}]"
    text = repr(g.get(key))
    return text if len(text) <= width else f"{text[:width - 3]}... ({len(text)} chars)"


def summarize(path, progress: Callable[[int, int], None] | None = None) -> ModelSummary:
    """Opens a GGUF, recognizes its tail (or records why not), hashes it, summarizes its metadata."""
    with gguf.open(path) as g:
        try:
            tail, error = detect_tail(g), None
        except GGUFFormatError as exc:
            tail, error = None, str(exc)
        meta = tuple((k, _short(g, k)) for k in g.metadata_keys())
        return ModelSummary(str(g.path), g.sha256(progress), g.size, g.version, g.alignment,
                            len(g.tensors), tail, error, meta)


def render_summary(s: ModelSummary) -> str:
    """The text table `exactedit inspect` prints."""
    lines = [f"file       {s.path}", f"sha256     {s.sha256}",
             f"size       {s.size:,} bytes, GGUF v{s.version}, alignment {s.alignment}, "
             f"{s.tensor_count} tensors"]
    t = s.tail
    if t is None:
        lines.append(f"tail       not recognized: {s.tail_error}")
    else:
        extra = f", streams {t.streams}, d_lo {t.d_lo}" if t.kind == "hc4" else ""
        lines += [f"tail       {t.kind}: layer {t.layer}, n {t.n}, V {t.vocab}, h {t.h}{extra}",
                  f"           tied {'yes' if t.tied else 'no'}, rms eps {t.rms_eps:.6g}, "
                  f"logit softcap {t.logit_softcap}, architecture {t.architecture}"]
        for x in t.tensors:
            lines.append(f"  {x.role:<14}{x.name:<34}{x.type_name:<6}{' x '.join(map(str, x.shape))}")
    lines.append("metadata")
    lines += [f"  {k:<44}{v}" for k, v in s.metadata]
    return "\n".join(lines)
