"""`exactedit bench frontier`: the dense edit's strength search (a coordinate search over the
phrases' strengths, `solvers.l47.frontier.search_strengths`) along lines
(`solvers.tail.passes.line_pass`)
against the same search scoring every point with its own full-vocabulary pass (`frontier.frontier`,
the baseline), both in one run on the same synthetic plain-RMSNorm tail (Qwen2.5-1.5B's shape by
default: n = 1536, h = 8960, V = 151,936; random valid Q6_K head bytes, as bench head makes them)
and the same rows, phrase parts (unformed for the lines, as the solve hands them; formed for the
baseline, outside its clock) and grid. Reports each side's seconds, points and head passes, the
ratio, whether both chose the same strengths, and how far their points' cuts and collateral
means are apart. On random weights only the timings and the agreement mean anything.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

TARGET_RATIO = 3.0     # the line search at least this much faster than a pass per point


@dataclass(frozen=True)
class BenchFrontierConfig:
    n: int = 1536
    h: int = 8960
    vocab: int = 151936
    rows: int = 256           # frontier rows: half slop positions, half legitimate uses
    phrases: int = 4
    conditions: int = 512     # rows of the Gram solve the phrase parts come from
    grid: tuple = (0.2, 0.3, 0.45, 0.6, 0.8, 1.0)
    seed: int = 0

    def __post_init__(self):
        for key in ("n", "h", "vocab", "rows", "phrases", "conditions"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        if self.n % 256:
            raise ValueError(f"n must be a multiple of 256 (Q6_K rows), got {self.n}")
        if self.rows < 2 * self.phrases or len(self.grid) < 2 or min(self.grid) <= 0:
            raise ValueError("rows must be >= 2 x phrases, and the grid >= 2 strengths > 0")


@dataclass(frozen=True)
class BenchFrontierResult:
    config: BenchFrontierConfig
    points: int                    # points the search measured (the same on both sides)
    direct_s: float                # the baseline: a full-vocabulary pass per point
    line_s: float                  # the line search
    line_passes: int               # head products the line search made
    ratio: float                   # direct_s / line_s
    same_choice: bool
    max_cut_diff: float            # over every point and phrase
    max_mean_diff: float           # over every point and word

    @property
    def passes(self) -> bool:
        return self.same_choice and self.ratio >= TARGET_RATIO

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(passes=self.passes, target_ratio=TARGET_RATIO)
        return d


def _world(cfg: BenchFrontierConfig):
    from exactedit.bench.head import synthetic_q6k
    from exactedit.solvers.l47.frontier import FrontierRows
    from exactedit.solvers.l47.gauss_newton import PartFactors
    from exactedit.solvers.l47.jacobian import RowSet
    from exactedit.solvers.tail.forward.head_ref import RmsnormHead
    from exactedit.solvers.tail.forward.last_layer_ref import RmsnormL47
    from exactedit.solvers.tail.model import RmsnormTail
    from exactedit.solvers.tail.passes.vocab_pass import QuantRows

    rng = np.random.default_rng(cfg.seed)
    n, h, T, P = cfg.n, cfg.h, cfg.rows, cfg.phrases
    raw = synthetic_q6k(cfg.vocab, n, cfg.seed)
    head = QuantRows(lambda a, b: raw[a:b], "Q6_K", cfg.vocab, n)
    w_down = (rng.standard_normal((n, h)) * 0.02).astype(np.float32)
    tail = RmsnormTail(None, "<synthetic>", RmsnormL47(w_down), RmsnormHead(1 + 0.1 * rng.standard_normal(n)),
                       head, None)
    rows = RowSet(rng.standard_normal((T, n), dtype=np.float32), rng.standard_normal((T, h), dtype=np.float32))
    slop = T // 2
    fr = FrontierRows(rows, rng.integers(0, cfg.vocab, T), slop, np.arange(slop) % P,
                      np.arange(T - slop) % max(1, P // 2))
    # the solve's parts come unformed from its Gram solve (gauss_newton.PartFactors): the line search
    # reads them so, the baseline gets them formed
    K = cfg.conditions
    lam = rng.standard_normal((K, P))
    U = rng.standard_normal((K, n))
    G = rng.standard_normal((K, h))
    f = PartFactors(U, lam, G)
    scale = 0.05 * float(np.abs(w_down).mean()) / float(np.abs(f.dense()[0]).mean())
    return tail, fr, PartFactors(U, lam * scale, G)


def run_bench_frontier(cfg: BenchFrontierConfig, progress: Callable[[int, int], None] | None = None
                       ) -> BenchFrontierResult:
    from exactedit.solvers.l47 import frontier as F
    from exactedit.solvers.tail.passes.line_pass import HeadTiles

    tail, fr, factors = _world(cfg)
    grid = sorted(set(float(g) for g in cfg.grid))
    combos = [(g,) * cfg.phrases for g in grid]
    pick = dict(min_mean=F.BarD.min_mean, max_low_share=F.BarD.max_low_share)
    tell = progress or (lambda done, total: None)

    t = time.perf_counter()
    scorer = F.line_scorer(tail, factors, fr.rows, fr.token, head=HeadTiles(tail))
    lines = F.search_strengths(combos, grid, lambda cs: F.line_frontier(scorer, fr, cs), progress=tell, **pick)
    line_s = time.perf_counter() - t

    parts = factors.dense()
    t = time.perf_counter()
    base = F.frontier_base(tail, fr)
    direct = F.search_strengths(combos, grid, lambda cs: F.frontier(tail, parts, fr, cs, base=base), progress=tell,
                                **pick)
    direct_s = time.perf_counter() - t

    cut = mean = 0.0
    for a, b in zip(lines[0], direct[0]):
        cut = max([cut] + [abs(a.cut[k] - b.cut[k]) for k in b.cut])
        mean = max([mean] + [abs(a.mean[k] - b.mean[k]) for k in b.mean])
    same = [p.strength for p in lines[0]] == [p.strength for p in direct[0]] and \
        lines[1].strength == direct[1].strength
    return BenchFrontierResult(cfg, len(direct[0]), direct_s, line_s, scorer.passes, direct_s / line_s, same,
                               cut, mean)


def render_bench_frontier(r: BenchFrontierResult) -> str:
    c = r.config
    return "\n".join([
        f"strength search at n = {c.n}, h = {c.h}, V = {c.vocab:,}: {c.rows} rows, {c.phrases} phrases, "
        f"grid {list(c.grid)}: {r.points} points",
        f"  a pass per point (baseline) {r.direct_s:8.1f} s",
        f"  along lines                 {r.line_s:8.1f} s   ({r.line_passes} head passes)",
        f"  ratio                       {r.ratio:8.2f}   target >= {TARGET_RATIO:g} -> "
        f"{'PASS' if r.passes else 'FAIL'}",
        f"  same points and choice      {'yes' if r.same_choice else 'NO'}; largest difference: "
        f"cut {r.max_cut_diff:.1e}, collateral mean {r.max_mean_diff:.1e}",
    ])
