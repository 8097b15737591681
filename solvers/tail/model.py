"""Load a model's tail from a GGUF: the weights the exact forwards need, at runtime precision,
plus the head as a RowSource and the token table.

The tail kind comes from `quant.model.arch.detect_tail` (tensors present, never the model's name):
- hc4 (production engine): every tensor at the engine's runtime view (`quant.runtime_view`:
  BF16 output_hc_down/up through their Q8_0 copy, Q8_0 W_sd and the Q6_K head dequantized);
  only rows 0..d_lo-1 of output_hc_down are read.
- rmsnorm (public models on llama.cpp): plain dequantization; the head is output.weight, or
  token_embd.weight when tied; the last layer's ffn_down, with its post-FFN norm if present.
The head stays in the GGUF (memory-mapped) and is read tile by tile by the streaming pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Union

import numpy as np

from exactedit.dumps.format import DumpExpect
from exactedit.errors import GGUFFormatError
from exactedit.solvers.tail.forward import head_ref
from exactedit.solvers.tail.forward import head_fast
from exactedit.solvers.tail.passes.vocab_pass import QuantRows, gguf_rows
from exactedit.solvers.tail.forward import last_layer_ref as l47_ref
from exactedit.solvers.tail.forward import last_layer_fast as l47_fast

# llama.cpp token types (tokenizer.ggml.token_type)
TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_BYTE = 3, 4, 6


def _gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte -> printable character map: printable Latin-1 bytes stand for
    themselves, the other 68 bytes for the characters U+0100 upward, in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(0x100 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


@dataclass(frozen=True)
class TokenTable:
    """The GGUF's token strings and types; `style` is the tokenizer family that says how a
    stored string maps to bytes: "bpe" (byte-level, GPT-2 style), "spm" (SentencePiece:
    U+2581 is a space, <0xHH> a raw byte) or "raw" (strings are the text)."""

    tokens: tuple[str, ...]
    types: tuple[int, ...] | None
    style: str

    def __post_init__(self):
        if self.style not in ("bpe", "spm", "raw"):
            raise ValueError(f"style must be bpe, spm or raw, got {self.style!r}")
        if self.types is not None and len(self.types) != len(self.tokens):
            raise ValueError(f"{len(self.types)} token types for {len(self.tokens)} tokens")

    def __len__(self) -> int:
        return len(self.tokens)

    def is_special(self, i: int) -> bool:
        return self.types is not None and self.types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)

    def special_ids(self) -> np.ndarray:
        if self.types is None:
            return np.zeros(0, dtype=np.int64)
        t = np.asarray(self.types)
        return np.flatnonzero((t == TOKEN_CONTROL) | (t == TOKEN_USER_DEFINED))

    @cached_property
    def byte_strings(self) -> tuple[bytes, ...]:
        """token_bytes of every token, made on first use and kept (an inverse index reads them all)."""
        return tuple(self.token_bytes(i) for i in range(len(self.tokens)))

    def token_bytes(self, i: int) -> bytes:
        """The bytes token `i` stands for (special tokens: their name, as UTF-8)."""
        text = self.tokens[i]
        if self.is_special(i) or self.style == "raw":
            return text.encode("utf-8")
        if self.style == "bpe":
            if _BYTE_CHARS.issuperset(text):
                return text.translate(_BYTE_LATIN1).encode("latin-1")
            return text.encode("utf-8")  # not byte-encoded (added tokens)
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                pass
        return text.replace("\u2581", " ").encode("utf-8")

    def decode(self, ids) -> str:
        """Ids -> text (invalid UTF-8 shown as U+FFFD); special tokens appear as their names."""
        n = len(self.tokens)
        out = bytearray()
        for i in np.asarray(ids, dtype=np.int64).reshape(-1):
            if not 0 <= i < n:
                raise IndexError(f"token id {int(i)} outside the table of {n}")
            out += self.token_bytes(int(i))
        return out.decode("utf-8", errors="replace")

    def piece(self, i: int) -> str:
        return self.decode([i])


_BYTE_DECODER = _gpt2_byte_decoder()
# the same map as a str.translate table to the Latin-1 character of each byte (then .encode("latin-1"))
_BYTE_CHARS = frozenset(_BYTE_DECODER)
_BYTE_LATIN1 = {ord(c): b for c, b in _BYTE_DECODER.items()}
_STYLES = {"gpt2": "bpe", "llama": "spm", "gemma": "spm", "t5": "spm"}


def load_tokens(g) -> TokenTable:
    """The token table of an open GGUF, with its decoding style from tokenizer.ggml.model."""
    types = g.token_types()
    return TokenTable(tuple(g.tokens()), None if types is None else tuple(int(t) for t in types),
                      _STYLES.get(g.get("tokenizer.ggml.model"), "raw"))


@dataclass(frozen=True, eq=False)
class Hc4Tail:
    """The hc4 tail at runtime precision; `head` reads output.weight rows lazily."""

    spec: object  # quant.model.arch.TailSpec
    path: str
    l47: l47_ref.Hc4L47
    mix_params: head_ref.Hc4Head
    head: QuantRows
    tokens: TokenTable
    kind = "hc4"
    softcap = None

    def dump_expect(self) -> DumpExpect:
        s = self.spec
        return DumpExpect(s.n, s.h, s.vocab, s.streams, "hc4", s.layer)

    def residual(self, dump, rows=None, dW=None, *, reference: bool = False) -> np.ndarray:
        """R' [T, streams, n] for dump rows (slice or ids; all when None), W_sd + dW when given."""
        sel = slice(None) if rows is None else rows
        args = (dump.R[sel], dump.inj[sel], dump.hh[sel], dump.sgv[sel], dump.yr[sel], self.l47, dW)
        return l47_ref.hc4_l47_ref(*args) if reference else l47_fast.hc4_l47(*args)

    def mix(self, Rp, *, reference: bool = False) -> np.ndarray:
        return (head_ref.hc4_mix_ref if reference else head_fast.hc4_mix)(Rp, self.mix_params)


@dataclass(frozen=True, eq=False)
class RmsnormTail:
    """Final RMSNorm + head (output.weight or tied token_embd.weight) and the last FFN's down."""

    spec: object
    path: str
    l47: l47_ref.RmsnormL47
    mix_params: head_ref.RmsnormHead
    head: QuantRows
    tokens: TokenTable
    kind = "rmsnorm"

    @property
    def softcap(self) -> float | None:
        return self.mix_params.softcap

    def dump_expect(self) -> DumpExpect:
        s = self.spec
        return DumpExpect(s.n, s.h, s.vocab, None, "rmsnorm", s.layer)

    def residual(self, dump, rows=None, dW=None, *, reference: bool = False) -> np.ndarray:
        """R' [T, n] for dump rows, W_down + dW when given."""
        sel = slice(None) if rows is None else rows
        args = (dump.R[sel], dump.hh[sel], self.l47, dW)
        return l47_ref.rmsnorm_l47_ref(*args) if reference else l47_fast.rmsnorm_l47(*args)

    def mix(self, Rp, *, reference: bool = False) -> np.ndarray:
        return (head_ref.rmsnorm_mix_ref if reference else head_fast.rmsnorm_mix)(Rp, self.mix_params)


Tail = Union[Hc4Tail, RmsnormTail]


def _vector(g, view, name: str) -> np.ndarray:
    info = g.tensor(name)
    return view(g.read_raw(name), info.type_name, info.cols).reshape(-1)


def load_tail(g) -> Tail:
    """The tail of an open `quant.gguf.GGUFFile` (kind from `quant.model.arch.detect_tail`)."""
    from exactedit import quant
    from exactedit.quant.model.arch import detect_tail

    spec = detect_tail(g)
    names = spec.names
    tokens = load_tokens(g)
    if len(tokens) < spec.vocab:
        raise GGUFFormatError(g.path, "tokenizer.ggml.tokens",
                              f"{len(tokens)} tokens for a head of {spec.vocab} rows")

    if spec.kind == "hc4":
        view = quant.runtime_view

        def matrix(role, stop=None):
            name = names[role]
            return view(g.read_raw(name, 0, stop), g.tensor(name).type_name, g.tensor(name).cols)

        mix = head_ref.Hc4Head(matrix("hc_norm"), matrix("hc_down", spec.d_lo), matrix("hc_up"),
                               spec.rms_eps)
        return Hc4Tail(spec, str(g.path), l47_ref.Hc4L47(matrix("ffn_down")), mix,
                       gguf_rows(g, names["head"], runtime=True), tokens)

    if spec.rms_eps is None:
        raise GGUFFormatError(g.path, f"{spec.architecture}.attention.layer_norm_rms_epsilon",
                              "missing: the final RMSNorm needs its eps")
    view = quant.dequantize
    ffn = names["ffn_down"]
    w_down = view(g.read_raw(ffn), g.tensor(ffn).type_name, g.tensor(ffn).cols)
    post = _vector(g, view, names["post_ffn_norm"]) if "post_ffn_norm" in names else None
    mix = head_ref.RmsnormHead(_vector(g, view, names["output_norm"]), spec.rms_eps,
                               spec.logit_softcap)
    return RmsnormTail(spec, str(g.path), l47_ref.RmsnormL47(w_down, post, spec.rms_eps), mix,
                       gguf_rows(g, names["head"]), tokens)
