"""`exactedit bench shape-compile`: `shape compile` of many banned phrases on a real model.

The phrases are drawn (seeded) from the model's own word tokens: two to four lowercase words, the
last one a single token, so every phrase compiles. Timed: the whole `shape compile` (rules file
read, llama.cpp's tokenizer on every phrase, the GGUF's token table, the phrase pieces, the JSON
written and read back), best of the repeats. The same-run baseline is the piece search as it was
written before (every phrase's prefix scanned for every token, O(vocab x phrases)) against today's
(one set lookup per token), both on the first `scan_phrases` phrases: their ratio is the speedup,
and both must find the same pieces.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit.errors import ExacteditError

TARGET_S = 10.0      # 1,000 phrases on Qwen (151,936 tokens)


@dataclass(frozen=True)
class ShapeCompileBenchConfig:
    model: str                 # GGUF path (the CLI resolves public model names)
    phrases: int = 1000
    scan_phrases: int = 50     # the O(vocab x phrases) baseline takes ~0.1 s per phrase on Qwen
    repeats: int = 1
    seed: int = 0

    def __post_init__(self):
        if self.phrases < 1 or not 1 <= self.scan_phrases <= self.phrases or self.repeats < 1:
            raise ExacteditError(f"bench shape-compile: phrases, repeats >= 1 and 1 <= scan_phrases <= phrases, "
                                 f"got {self}")


@dataclass(frozen=True)
class ShapeCompileBenchResult:
    model: str
    vocab: int
    phrases: int
    pieces: int
    compile_s: float           # the whole shape compile, best of repeats
    scan_phrases: int
    scan_s: float              # the old piece search on scan_phrases phrases
    pieces_s: float            # today's piece search on the same phrases
    speedup: float             # scan_s / pieces_s
    target_s: float
    meets_target: bool         # compile_s <= target_s (the target is for 1,000 phrases)

    def to_dict(self) -> dict:
        return asdict(self)


def scan_pieces(phrases, text_bytes) -> dict[int, bytes]:
    """The piece search as first written: every prefix form scanned for every token."""
    from exactedit.solvers.phrases import ends_at_boundary, forms

    prefixes = [f.prefix for f in forms(phrases, True) if f.prefix]
    starts = {p[:k] for p in prefixes for k in range(1, len(p) + 1)}
    longest = max(len(p) for p in prefixes)
    return {i: b for i, b in enumerate(text_bytes) if b and (any(b in p for p in prefixes) or any(
        b[-k:] in starts and ends_at_boundary(b[:-k]) for k in range(1, min(len(b) - 1, longest) + 1)))}


def draw_phrases(text_bytes, n: int, seed: int) -> list[str]:
    """n distinct phrases of 2-4 of the model's own lowercase word tokens (" word", 3-9 letters)."""
    words = sorted({b[1:].decode() for b in text_bytes
                    if len(b) > 3 and b[:1] == b" " and b[1:].isalpha() and b[1:].islower() and len(b) <= 10})
    if len(words) < 50:
        raise ExacteditError(f"bench shape-compile: the model has {len(words)} lowercase word tokens; need 50")
    rng = np.random.default_rng(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        out[" ".join(words[int(i)] for i in rng.integers(0, len(words), int(rng.integers(2, 5))))] = None
    return list(out)


def run_shape_compile_bench(cfg: ShapeCompileBenchConfig,
                            progress: Callable[[int, int], None] | None = None) -> ShapeCompileBenchResult:
    import tomli_w

    from exactedit.native.shaping.compile import compile_file
    from exactedit.quant import gguf
    from exactedit.solvers.shaping.rules_file import matcher_bytes, phrase_pieces
    from exactedit.solvers.tail.model import load_tokens

    total, done = cfg.repeats + 2, 0

    def step():
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    table = load_tokens(gguf.open(cfg.model))
    text_bytes = matcher_bytes([table.token_bytes(i) for i in range(len(table))], table.types or (0,) * len(table))
    phrases = draw_phrases(text_bytes, cfg.phrases, cfg.seed)
    few = phrases[:cfg.scan_phrases]
    t = time.perf_counter()
    old = scan_pieces(few, text_bytes)
    scan_s = time.perf_counter() - t
    step()
    t = time.perf_counter()
    new = phrase_pieces(few, text_bytes)
    pieces_s = time.perf_counter() - t
    if new != old:
        raise ExacteditError(f"bench shape-compile: the piece search found {len(new)} pieces, the scan {len(old)}")
    step()
    best, pieces = float("inf"), 0
    with tempfile.TemporaryDirectory(prefix="exactedit-bench-") as d:
        rules = Path(d) / "rules.toml"
        rules.write_bytes(tomli_w.dumps({"prefix-penalty": {"bias": 6.0, "phrases": phrases}}).encode())
        for i in range(cfg.repeats):
            t = time.perf_counter()
            r = compile_file(rules, cfg.model, Path(d) / f"rules-{i}.json")
            best = min(best, time.perf_counter() - t)
            pieces = next(x["pieces"] for x in r.summary["rules"] if x["kind"] == "prefix-penalty")
            step()
    return ShapeCompileBenchResult(str(cfg.model), len(text_bytes), cfg.phrases, int(pieces), best,
                                   cfg.scan_phrases, scan_s, pieces_s, scan_s / max(pieces_s, 1e-9), TARGET_S,
                                   best <= TARGET_S)


def render_shape_compile_bench(r: ShapeCompileBenchResult) -> str:
    mark = "ok" if r.meets_target else "ABOVE"
    return "\n".join([
        f"shape compile of {r.phrases} phrases on {r.model} ({r.vocab} tokens): {r.compile_s:.2f} s "
        f"(target {r.target_s:g} s for 1,000: {mark}), {r.pieces} token pieces",
        f"piece search on {r.scan_phrases} phrases: scan over every prefix {r.scan_s:.3f} s, set lookup "
        f"{r.pieces_s:.3f} s ({r.speedup:.0f}x), same pieces"])
