"""Hypothesis strategies for the format tests: float32 rows that reach the quantizers' corners.

`float_rows(block)` draws [rows, n_blocks * block] float32 arrays block by block, each block of one
kind (below), from a numpy generator seeded by hypothesis. `raw_floats(block)` draws the values
themselves with hypothesis (any finite float32), which finds edge values no recipe names.

Kinds, and the corner each reaches:
  normal         Gaussian at a scale 2**e, e in [-30, 30] (random signs of the largest value)
  zero           all +0.0 / -0.0: the "all zero group" branches
  constant       every value the same: ties between equal magnitudes
  ties           multiples of m/2 with the largest exactly A*m (A = 127 or 32, m = 2**e): codes land
                 exactly on .5 (roundf vs nearest-even) in Q8_0 and in Q6_K's first guess
  subnormal      float32 subnormals: 1/d overflows to inf, fp16 scales round to 0
  outlier        Gaussian with one value 2**10..2**40 larger: one code saturates, the rest are ~0
  tiny_huge      Gaussian at 2**e, e in [-149, 125] (clipped to finite)
  fp16_overflow  magnitudes 2**23..2**66: the fp16 scale overflows to inf (and x*x overflows float32)
  fp16_underflow magnitudes 2**-40..2**-13: fp16 scales subnormal or zero
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

KINDS = ("normal", "zero", "constant", "ties", "subnormal", "outlier", "tiny_huge",
         "fp16_overflow", "fp16_underflow")

_F32_MAX = np.float32(np.finfo(np.float32).max)


def _gaussian(rng: np.random.Generator, n: int, lo: float, hi: float) -> np.ndarray:
    scale = 2.0 ** rng.uniform(lo, hi)
    return rng.standard_normal(n) * scale


def make_block(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """One block of n float32 values of the given kind."""
    if kind == "normal":
        v = _gaussian(rng, n, -30, 30)
    elif kind == "zero":
        v = np.where(rng.random(n) < 0.5, 0.0, -0.0)
    elif kind == "constant":
        v = np.full(n, rng.choice([-1.0, 1.0]) * 2.0 ** rng.uniform(-20, 20))
    elif kind == "ties":
        big = float(rng.choice([127, 32]))
        m = 2.0 ** int(rng.integers(-20, 20))
        v = rng.integers(-2 * int(big) + 1, 2 * int(big), n) / 2.0 * m
        v[rng.integers(n)] = rng.choice([-1.0, 1.0]) * big * m
    elif kind == "subnormal":
        bits = rng.integers(1, 0x800000, n).astype(np.uint32)
        bits |= np.where(rng.random(n) < 0.5, np.uint32(0x80000000), np.uint32(0))
        return bits.view(np.float32)
    elif kind == "outlier":
        v = _gaussian(rng, n, -12, 4)
        v[rng.integers(n)] *= 2.0 ** rng.uniform(10, 40)
    elif kind == "tiny_huge":
        v = _gaussian(rng, n, -149, 125)
    elif kind == "fp16_overflow":
        v = _gaussian(rng, n, 23, 66)
    elif kind == "fp16_underflow":
        v = _gaussian(rng, n, -40, -13)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return np.clip(v, -_F32_MAX, _F32_MAX).astype(np.float32)


@st.composite
def float_rows(draw, block: int, max_rows: int = 3, max_blocks: int = 4, kinds=KINDS):
    """float32 [rows, n_blocks * block], each block of a drawn kind."""
    rows = draw(st.integers(1, max_rows))
    n_blocks = draw(st.integers(1, max_blocks))
    chosen = draw(st.lists(st.sampled_from(kinds), min_size=rows * n_blocks,
                           max_size=rows * n_blocks))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    blocks = [make_block(k, block, rng) for k in chosen]
    return np.concatenate(blocks).reshape(rows, n_blocks * block)


def raw_floats(block: int, max_rows: int = 2, max_blocks: int = 2):
    """float32 [rows, n_blocks * block] of any finite float32 values, drawn by hypothesis."""
    shape = st.tuples(st.integers(1, max_rows), st.integers(1, max_blocks).map(lambda b: b * block))
    return arrays(np.float32, shape, elements=st.floats(width=32, allow_nan=False,
                                                         allow_infinity=False))


# ---- float32 forward tests (fast path vs float64 reference) ------------------------------------
U32 = 2.0 ** -24          # unit roundoff of float32


def gamma(k: int) -> float:
    """The standard bound gamma_k = k u / (1 - k u) on the relative error of a length-k float32 sum."""
    return k * U32 / (1 - k * U32)


def spread_floats(draw, shape, scale=None, decades=(-3, 3)) -> np.ndarray:
    """float32 values (seeded Gaussian) at a drawn scale 10^k, k in `decades`, with exact zeros mixed in."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if scale is None:
        scale = 10.0 ** draw(st.integers(*decades))
    x = rng.standard_normal(shape) * scale
    x[rng.random(shape) < 0.05] = 0.0
    return x.astype(np.float32)


# ---- untrusted text inputs (discover's transcripts, phrase lists, one-per-line files) -----------
#: pieces that reach the text parsers' corners: the harness's tags opened and closed, an
#: interruption line, a lone surrogate (valid JSON "\ud800"), NUL / ESC / DEL, JSON's own characters
TEXT_PIECES = ("<system-reminder>", "</system-reminder>", "<command-name>", "</command-name>", "<bash-stdout>",
               "[Request interrupted by user]", "[Request interrupted by user for tool use]", "\n", "\r", " ", "\t",
               "\ud800", "\udc00", "\x00", "\x1b", "\x7f", "\x85", "\u2028", "é", "{", "[", '"', "\\", "#", "a b",
               "Here's an example", "you can use")
#: the keys the transcript and phrase readers look at
RECORD_KEYS = ("text", "side", "name", "prompt", "model", "provider", "role", "content", "type", "message",
               "messages", "conversations", "from", "value", "isMeta", "phrase", "ban_phrase", "phrases")

tricky_text = st.lists(st.sampled_from(TEXT_PIECES) | st.text(max_size=3), max_size=8).map("".join)
#: any JSON value, its strings tricky, its objects keyed mostly by the readers' keys
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats() | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(RECORD_KEYS) | tricky_text, inner,
                                                               max_size=4),
    max_leaves=12)
#: a record shaped like one the readers know, its fields any JSON value
records = st.one_of(
    st.fixed_dictionaries({"text": json_values}, optional={"side": json_values, "prompt": json_values,
                                                           "model": json_values}),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]) | json_values,
                           "content": json_values}),
    st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant"]) | json_values, "content": json_values}), max_size=3)}),
    st.fixed_dictionaries({"type": st.sampled_from(["user", "assistant", "summary"]) | json_values,
                           "message": st.fixed_dictionaries({"content": json_values},
                                                            optional={"model": json_values})},
                          optional={"isMeta": json_values}),
    st.fixed_dictionaries({"conversations": st.lists(st.fixed_dictionaries(
        {"from": st.sampled_from(["human", "gpt"]) | json_values, "value": json_values}), max_size=3)}),
    st.dictionaries(st.sampled_from(RECORD_KEYS) | tricky_text, json_values, max_size=4))
