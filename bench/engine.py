"""`exactedit bench engine`: the full-vocabulary pass with `--match-engine llamacpp` numerics
against the exact path, on the same head and activations, in the same run.

The head is a synthetic quantized matrix of the asked shape (default: Qwen2.5-Coder-1.5B's
V = 151,936 x n = 1536 head): Gaussian rows quantized with ggml's reference quantizer, a few
thousand distinct rows repeated to fill V (the kernels' cost does not depend on which rows
repeat). Activations are Gaussian. Both passes are `solvers.tail.passes.vocab_pass.vocab_pass`: the
exact one with its default float32 sgemm on dequantized tiles, the engine-faithful one with
`solvers.tail.engine_math.EngineMatmul` under the given micro-batch layout (default one micro-batch
of all rows, the tiled kernel). Each timing is the best of `repeats`, the two passes alternating.
The engine result's first head tile is also checked bit for bit against the numpy reference of
the engine's kernel.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Callable

import gguf
import numpy as np

from exactedit.errors import QuantError

TARGET_RATIO = 1.5          # engine-faithful time / exact time (docs/performance.md)
QTYPES = ("Q6_K", "Q8_0")
DISTINCT_ROWS = 4096

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class EngineBenchConfig:
    rows: int = 395             # activation rows (positions)
    vocab: int = 151936
    n: int = 1536
    qtype: str = "Q6_K"
    ubatch: int = 0             # micro-batch size; 0: one micro-batch of all rows
    tile_rows: int = 8192
    repeats: int = 1
    seed: int = 0

    def __post_init__(self):
        for key in ("rows", "vocab", "n", "tile_rows", "repeats"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise QuantError(f"{key} {v!r}: expected a positive integer")
        if not isinstance(self.ubatch, int) or self.ubatch < 0:
            raise QuantError(f"ubatch {self.ubatch!r}: expected 0 (all rows) or a positive integer")
        if self.qtype not in QTYPES:
            raise QuantError(f"qtype {self.qtype!r}: expected one of {', '.join(QTYPES)}")
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[self.qtype]][0]
        if self.n % block:
            raise QuantError(f"n {self.n}: a {self.qtype} row must be a multiple of {block}")

    def ubatch_sizes(self) -> tuple[int, ...]:
        size = self.ubatch or self.rows
        full, rest = divmod(self.rows, size)
        return (size,) * full + ((rest,) if rest else ())


@dataclass(frozen=True)
class EngineBenchResult:
    config: EngineBenchConfig
    exact_s: float
    engine_s: float
    ratio: float                # engine / exact
    target: float
    meets_target: bool
    bitwise_vs_reference: bool  # the engine pass's first tile equals the numpy reference
    cpus: int
    numba_threads: int

    def to_dict(self) -> dict:
        return {"bench": "engine", **asdict(self)}


def synthetic_head(cfg: EngineBenchConfig) -> np.ndarray:
    """uint8 [vocab, row_bytes]: DISTINCT_ROWS Gaussian rows quantized to cfg.qtype, repeated."""
    from exactedit import quant

    rng = np.random.default_rng(cfg.seed)
    k = min(DISTINCT_ROWS, cfg.vocab)
    base = quant.quantize((rng.standard_normal((k, cfg.n)) * 0.02).astype(np.float32), cfg.qtype)
    reps = -(-cfg.vocab // k)
    return np.ascontiguousarray(np.tile(base, (reps, 1))[:cfg.vocab])


def run_engine_bench(cfg: EngineBenchConfig, progress: Progress | None = None) -> EngineBenchResult:
    import numba

    from exactedit.solvers.tail import engine_math as en
    from exactedit.solvers.tail.passes.vocab_pass import QuantRows, vocab_pass

    raw = synthetic_head(cfg)
    mix = np.random.default_rng(cfg.seed + 1).standard_normal((cfg.rows, cfg.n)).astype(np.float32)
    match = en.MatchEngine("llamacpp", cfg.ubatch_sizes())
    src = QuantRows(lambda a, b: raw[a:b], cfg.qtype, cfg.vocab, cfg.n)
    warm = QuantRows(lambda a, b: raw[a:b], cfg.qtype, min(64, cfg.vocab), cfg.n)
    vocab_pass(mix, warm)                                          # compile outside the clock
    vocab_pass(mix, warm, matmul=en.EngineMatmul(match))
    first = min(256, cfg.vocab)
    got = en.engine_matmul(raw[:first], cfg.qtype, cfg.n, mix, match)
    want = en.engine_matmul(raw[:first], cfg.qtype, cfg.n, mix, match, reference=True)
    bitwise = bool(np.array_equal(got.view(np.uint32), want.view(np.uint32)))
    exact_s = engine_s = float("inf")
    for rep in range(cfg.repeats):
        t = time.perf_counter()
        vocab_pass(mix, src, tile_rows=cfg.tile_rows)
        exact_s = min(exact_s, time.perf_counter() - t)
        t = time.perf_counter()
        vocab_pass(mix, src, tile_rows=cfg.tile_rows, matmul=en.EngineMatmul(match))
        engine_s = min(engine_s, time.perf_counter() - t)
        if progress is not None:
            progress(rep + 1, cfg.repeats)
    ratio = engine_s / exact_s
    return EngineBenchResult(cfg, exact_s, engine_s, ratio, TARGET_RATIO, ratio <= TARGET_RATIO,
                             bitwise, len(os.sched_getaffinity(0)), numba.get_num_threads())


def render_engine_bench(r: EngineBenchResult) -> str:
    """The text report of `exactedit bench engine`."""
    c = r.config
    return "\n".join([
        f"head {c.vocab} x {c.n} {c.qtype}, {c.rows} rows, micro-batches "
        f"{list(c.ubatch_sizes())[:4]}{'...' if len(c.ubatch_sizes()) > 4 else ''}, tile {c.tile_rows}, "
        f"{r.cpus} cpus, numba threads {r.numba_threads}, best of {c.repeats}",
        f"exact path (sgemm)         {r.exact_s:8.2f} s",
        f"--match-engine llamacpp    {r.engine_s:8.2f} s",
        f"ratio engine / exact       {r.ratio:8.2f}x  (target <= {r.target:.1f}x: "
        f"{'PASS' if r.meets_target else 'ABOVE'})",
        f"engine tile vs reference    {'bitwise' if r.bitwise_vs_reference else 'DIFFERENT'}"])
