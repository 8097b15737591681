"""`exactedit bench ship`: the feedback ship of an edited Q6_K tensor (quant.rounding.feedback:
the metric's plan, then `ship_rows`, as one Gauss-Newton round of `solve wfld` ships ffn_down) with
the metric's factor used as the upper triangle it is (`Metric.tri`: every product skips the zeros
below its diagonal) against the same factor used as a general one (the baseline), in one run on
the same synthetic world: a background of more rows than the FFN's width h (folded by a QR to its
R, as Qwen's background is), a tensor of `rows` rows on a random Q6_K grid and a small edit of it.
Reports each side's seconds for the plan and the ship, the ratios, and whether both shipped the
same bytes. On random weights only the timings and the agreement mean anything.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

TARGET_RATIO = 1.3     # the ship with the upper factor at least this much faster


@dataclass(frozen=True)
class BenchShipConfig:
    h: int = 8960             # the FFN's width (Qwen2.5-1.5B's)
    rows: int = 1536          # tensor rows shipped (Qwen2.5-1.5B's ffn_down has n = 1,536)
    extra: int = 512          # background rows beyond h (the factor is folded to h x h)
    seed: int = 0

    def __post_init__(self):
        for key in ("h", "rows", "extra"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        if self.h % 256:
            raise ValueError(f"h must be a multiple of 256 (Q6_K rows), got {self.h}")


@dataclass(frozen=True)
class BenchShipResult:
    config: BenchShipConfig
    plan_general_s: float          # the QR fold and the plan, the factor used as a general one
    plan_upper_s: float
    ship_general_s: float          # ship_rows (the baseline)
    ship_upper_s: float
    ship_ratio: float              # ship_general_s / ship_upper_s
    plan_ratio: float
    same_bytes: bool
    max_plan_rel: float            # largest relative difference of the plan's S_qq

    @property
    def passes(self) -> bool:
        return self.same_bytes and self.ship_ratio >= TARGET_RATIO

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(passes=self.passes, target_ratio=TARGET_RATIO)
        return d


def run_bench_ship(cfg: BenchShipConfig, progress: Callable[[int, int], None] | None = None) -> BenchShipResult:
    from exactedit import quant
    from exactedit.quant.rounding import feedback as fb

    tell = progress or (lambda done, total: None)
    rng = np.random.default_rng(cfg.seed)
    h = cfg.h
    d = np.full(h, 0.01)
    F = rng.standard_normal((h + cfg.extra, h)) / np.sqrt(h)
    raw0 = quant.quantize((rng.standard_normal((cfg.rows, h)) * 0.02).astype(np.float32), "Q6_K")
    target = quant.dequantize(raw0, "Q6_K", h).astype(np.float64) + rng.standard_normal((cfg.rows, h)) * 2e-3
    out = {}
    for i, name in enumerate(("general", "upper")):
        t = time.perf_counter()
        metric = fb.Metric(d, F, general=name == "general")
        plan = time.perf_counter() - t
        t = time.perf_counter()
        ship = fb.ship_rows(target, "Q6_K", metric, {"orig": raw0})
        out[name] = (plan, time.perf_counter() - t, np.array(ship.raw), metric.c)
        tell(i + 1, 2)
    g, u = out["general"], out["upper"]
    return BenchShipResult(cfg, g[0], u[0], g[1], u[1], g[1] / u[1], g[0] / u[0], bool(np.array_equal(g[2], u[2])),
                           float(np.max(np.abs(u[3] - g[3]) / np.abs(g[3]))))


def render_bench_ship(r: BenchShipResult) -> str:
    c = r.config
    return "\n".join([
        f"feedback ship of {c.rows} Q6_K rows of width h = {c.h}, a background of h + {c.extra} rows "
        "(folded to its upper R)",
        "                      the factor as a general one   as upper   ratio",
        f"  QR fold + plan      {r.plan_general_s:12.1f} s {r.plan_upper_s:13.1f} s {r.plan_ratio:8.2f}",
        f"  ship_rows           {r.ship_general_s:12.1f} s {r.ship_upper_s:13.1f} s {r.ship_ratio:8.2f}"
        f"   target >= {TARGET_RATIO:g} -> {'PASS' if r.passes else 'FAIL'}",
        f"  the same bytes: {'yes' if r.same_bytes else 'NO'}; the plan's S_qq within {r.max_plan_rel:.1e} relative",
    ])
