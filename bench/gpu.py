"""`exactedit bench head --device gpu`: the full-vocabulary pass on a JAX device against the plain
matmul of the same shape, measured in the same run.

The head is bench/head.py's synthetic Q6_K tensor (random valid blocks), uploaded once as its bytes.
For each precision mode (`solvers.tail.forward.device`) the pass (`device_pass.vocab_pass_jax`: per-tile dequant
from the Q6_K bytes + matmul + online LSE and argmax, mix in and results out through the host) is
timed `repeats` times after a compile run; its ceiling is the same tiles' matmul alone, on the head
dequantized beforehand into the mode's operand format (float32, TF32 values or bfloat16) and kept
on the device, with nothing else in the loop. ratio = ceiling time / pass time (best of each).
The solver's variant of the pass (top-(|S|+1), LSE over V minus S, selected logits; what `solve
head` asks for) is timed in exact mode. Two checks come with the numbers: exact mode against the
numpy pass (`stream.vocab_pass`, on the host CPU) on the first `check_rows` rows, and for each
faster mode its KL against exact mode on the first `kl_rows` rows (`measure_precision`).
Targets (at 17,352 rows x V = 248,320 x n = 2560 on one H200): exact pass <= 0.6 s and
ratio >= 0.75.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from exactedit.solvers.tail.forward import device as devmod

Progress = Callable[[int, int], None]
TARGET_PASS_S = 0.6
TARGET_RATIO = 0.75


@dataclass(frozen=True)
class GpuHeadConfig:
    rows: int = 17352
    vocab: int = 248320
    n: int = 2560
    tile_rows: int = 8192
    repeats: int = 5
    seed: int = 0
    device: str = "gpu"
    precisions: tuple[str, ...] = ("exact", "tf32", "bf16")
    edit_k: int = 16          # |S| of the solver's pass
    check_rows: int = 32      # rows checked against the numpy pass (0: no check)
    kl_rows: int = 2048       # rows on which each faster mode's KL is measured

    def __post_init__(self):
        import gguf

        for key in ("rows", "vocab", "n", "tile_rows", "repeats", "edit_k"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        for key in ("check_rows", "kl_rows"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 0:
                raise ValueError(f"{key} must be an integer >= 0, got {getattr(self, key)!r}")
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q6_K][0]
        if self.n % block:
            raise ValueError(f"n must be a multiple of the Q6_K block ({block}), got {self.n}")
        if self.edit_k >= self.vocab:
            raise ValueError(f"edit_k must be below vocab, got {self.edit_k}")
        bad = [p for p in self.precisions if p not in devmod.PRECISIONS]
        if bad or not self.precisions or len(set(self.precisions)) != len(self.precisions):
            raise ValueError(f"precisions must be distinct names from {devmod.PRECISIONS}, got {self.precisions}")
        devmod.DeviceConfig(self.device)


@dataclass(frozen=True)
class ModeTiming:
    precision: str
    pass_s: tuple[float, ...]      # each timed pass (mix from the host, results back on the host)
    ceiling_s: tuple[float, ...]   # each timed matmul-only loop over the same tiles
    compile_s: float               # the first pass (compile + run)
    flops: float

    @property
    def best_s(self) -> float:
        return min(self.pass_s)

    @property
    def ratio(self) -> float:
        return min(self.ceiling_s) / self.best_s

    @property
    def tflops(self) -> float:
        return self.flops / self.best_s / 1e12

    @property
    def ceiling_tflops(self) -> float:
        return self.flops / min(self.ceiling_s) / 1e12

    def to_dict(self) -> dict:
        return {**asdict(self), "best_s": self.best_s, "median_s": float(np.median(self.pass_s)),
                "ratio": self.ratio, "tflops": self.tflops, "ceiling_tflops": self.ceiling_tflops}


@dataclass(frozen=True)
class GpuHeadResult:
    config: GpuHeadConfig
    device: dict
    q6k_bytes: int
    upload_s: float
    tile: int
    modes: tuple[ModeTiming, ...]
    solver_pass_s: float           # exact mode, top-(k+1), LSE_rest, selected (best of repeats)
    check: dict                    # exact pass vs the numpy pass on the first check_rows rows
    kl: tuple[dict, ...]           # PrecisionReport.to_dict() of each faster mode
    compiles: dict = None          # jax_cache.CompileCounter of the run (count, seconds, cache hits)

    def mode(self, precision: str) -> ModeTiming | None:
        return next((m for m in self.modes if m.precision == precision), None)

    @property
    def passes(self) -> bool | None:
        """Targets of the production shape (None for another shape, or without an exact run)."""
        exact = self.mode("exact")
        c = self.config
        if exact is None or (c.rows, c.vocab, c.n) != (17352, 248320, 2560):
            return None
        return exact.best_s <= TARGET_PASS_S and exact.ratio >= TARGET_RATIO

    def to_dict(self) -> dict:
        return {"config": asdict(self.config), "device": self.device, "q6k_bytes": self.q6k_bytes,
                "upload_s": self.upload_s, "tile": self.tile, "modes": [m.to_dict() for m in self.modes],
                "solver_pass_s": self.solver_pass_s, "check": self.check, "kl": list(self.kl),
                "passes": self.passes, "target_pass_s": TARGET_PASS_S, "target_ratio": TARGET_RATIO,
                "compiles": self.compiles}


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def operand_head(rows, precision: str, tile: int):
    """The whole head dequantized on its device into the mode's operand format (the ceiling's W)."""
    import jax
    import jax.numpy as jnp

    from exactedit.quant import jax_dequant

    @jax.jit
    def convert(raw):
        return devmod.round_operand(jax_dequant.dequantize(raw, rows.qtype, rows.cols), precision)

    parts = [convert(rows.raw[a:min(a + tile, rows.rows)]) for a in range(0, rows.rows, tile)]
    return jnp.concatenate(parts, axis=0)


def ceiling_loop(w, mix_r, precision: str, tile: int) -> float:
    """Seconds of the matmul alone over the same tiles (each tile's logits materialized on the device)."""
    import jax

    platform = "gpu" if devmod.is_gpu(next(iter(w.devices()))) else "cpu"
    dot = jax.jit(lambda a, b: devmod.dot_nt(a, b, precision, platform))
    V = w.shape[0]
    starts = [min(a, V - tile) for a in range(0, V, tile)]
    jax.block_until_ready(dot(mix_r, w[starts[0]:starts[0] + tile]))   # compile outside the clock
    tiles = [w[s:s + tile] for s in starts]                            # slices made outside the clock
    jax.block_until_ready(tiles)
    t = time.perf_counter()
    out = None
    for wt in tiles:
        out = dot(mix_r, wt)
    jax.block_until_ready(out)
    return time.perf_counter() - t


def _exact_check(mix, raw, cfg: GpuHeadConfig, got) -> dict:
    from exactedit.solvers.tail.passes.vocab_pass import QuantRows, vocab_pass

    if not cfg.check_rows:
        return {}
    r = min(cfg.check_rows, cfg.rows)
    src = QuantRows(lambda a, b: raw[a:b], "Q6_K", cfg.vocab, cfg.n)
    t = time.perf_counter()
    want = vocab_pass(mix[:r], src, tile_rows=cfg.tile_rows)
    return {"rows": r, "cpu_s": time.perf_counter() - t,
            "max_abs_dlse": float(np.max(np.abs(got.lse[:r] - want.lse))),
            "max_abs_dmax_logit": float(np.max(np.abs(got.max_logit[:r] - want.max_logit))),
            "argmax_agree": float(np.mean(got.argmax[:r] == want.argmax)),
            "max_abs_lse": float(np.max(np.abs(want.lse)))}


def run_gpu_head(cfg: GpuHeadConfig, progress: Progress | None = None) -> GpuHeadResult:
    from exactedit.solvers.tail.forward.jax_cache import CompileCounter

    dev = devmod.select(cfg.device)
    with CompileCounter() as counter:
        r = _run_gpu_head(cfg, dev, progress)
    return dataclasses.replace(r, compiles=counter.to_dict())


def _run_gpu_head(cfg: GpuHeadConfig, dev, progress: Progress | None) -> GpuHeadResult:
    import jax

    from exactedit.bench.head import synthetic_q6k
    from exactedit.solvers.tail.passes.vocab_pass import QuantRows
    from exactedit.solvers.tail.passes.device_pass import device_tile, to_device, vocab_pass_jax
    from exactedit.solvers.tail.passes.kl_pass_jax import measure_precision

    steps = 2 + len(cfg.precisions) * (cfg.repeats + 2) + cfg.repeats + 1 + sum(p != "exact" for p in cfg.precisions)
    done = [0]

    def tick():
        done[0] += 1
        if progress is not None:
            progress(done[0], steps)

    raw = synthetic_q6k(cfg.vocab, cfg.n, cfg.seed)
    mix = np.random.default_rng(cfg.seed + 1).standard_normal((cfg.rows, cfg.n)).astype(np.float32)
    tick()
    t = time.perf_counter()
    rows = to_device(QuantRows(lambda a, b: raw[a:b], "Q6_K", cfg.vocab, cfg.n), dev)
    jax.block_until_ready(rows.raw)
    upload_s = time.perf_counter() - t
    tile = device_tile(cfg.rows, cfg.vocab, cfg.tile_rows)
    tick()
    flops = 2.0 * cfg.rows * cfg.vocab * cfg.n
    modes, exact_out = [], None
    for p in cfg.precisions:
        t = time.perf_counter()
        out = vocab_pass_jax(mix, rows, tile_rows=cfg.tile_rows, precision=p)
        compile_s = time.perf_counter() - t
        tick()
        exact_out = out if p == "exact" else exact_out
        times = []
        for _ in range(cfg.repeats):
            times.append(_timed(lambda: vocab_pass_jax(mix, rows, tile_rows=cfg.tile_rows, precision=p)))
            tick()
        w = operand_head(rows, p, tile)
        mix_r = jax.jit(lambda m: devmod.round_operand(m, p))(jax.device_put(mix, dev))
        ceiling = tuple(ceiling_loop(w, mix_r, p, tile) for _ in range(max(2, cfg.repeats // 2)))
        del w, mix_r
        tick()
        modes.append(ModeTiming(p, tuple(times), ceiling, compile_s, flops))

    rng = np.random.default_rng(cfg.seed + 2)
    edit = rng.choice(cfg.vocab, cfg.edit_k, replace=False)
    wanted = np.concatenate([np.broadcast_to(edit, (cfg.rows, cfg.edit_k)),
                             rng.integers(0, cfg.vocab, (cfg.rows, 9))], axis=1)
    solver = lambda: vocab_pass_jax(mix, rows, token_sets=wanted, topk=cfg.edit_k + 1,  # noqa: E731
                                    exclude=edit, tile_rows=cfg.tile_rows)
    solver()
    solver_s = []
    for _ in range(cfg.repeats):
        solver_s.append(_timed(solver))
        tick()
    check = _exact_check(mix, raw, cfg, exact_out) if exact_out is not None else {}
    tick()
    kl = []
    for p in cfg.precisions:
        if p != "exact" and cfg.kl_rows:
            kl.append(measure_precision(mix[:cfg.kl_rows], rows, p, tile_rows=cfg.tile_rows).to_dict())
            tick()
    return GpuHeadResult(cfg, devmod.describe(dev), int(raw.nbytes), upload_s, tile, tuple(modes),
                         min(solver_s), check, tuple(kl))


def render_gpu_head(r: GpuHeadResult) -> str:
    """The text report of `exactedit bench head --device gpu`."""
    c, gb = r.config, 1e9
    lines = [f"head {c.vocab:,} x {c.n} Q6_K ({r.q6k_bytes / gb:.3f} GB on the device, upload {r.upload_s:.2f} s), "
             f"{c.rows:,} rows, tile {r.tile}, device {r.device['device_kind']} (jax {r.device['jax']}"
             + (f", XLA_FLAGS={r.device['xla_flags']}" if r.device.get("xla_flags") else "") + ")",
             f"{'mode':<6} {'pass s':>8} {'median':>8} {'TFLOP/s':>8} {'matmul s':>9} {'TFLOP/s':>8} {'ratio':>6}"]
    for m in r.modes:
        lines.append(f"{m.precision:<6} {m.best_s:8.3f} {np.median(m.pass_s):8.3f} {m.tflops:8.1f} "
                     f"{min(m.ceiling_s):9.3f} {m.ceiling_tflops:8.1f} {m.ratio:6.3f}")
    lines.append(f"solver's pass (exact, top-{c.edit_k + 1}, LSE over V \\ S, selected): {r.solver_pass_s:.3f} s")
    if r.check:
        ch = r.check
        lines.append(f"exact vs numpy pass on {ch['rows']} rows: max |dLSE| {ch['max_abs_dlse']:.3g} "
                     f"(|LSE| <= {ch['max_abs_lse']:.1f}), argmax agree {ch['argmax_agree']:.3f}")
    for k in r.kl:
        lines.append(f"{k['precision']:<5} vs exact on {k['rows']} rows: KL mean {k['mean_kl']:.3g} "
                     f"p99 {k['p99_kl']:.3g} max {k['max_kl']:.3g}, top-1 agree {k['top1_agree']:.4f}")
    verdict = {None: "n/a (targets are for 17,352 x 248,320 x 2560)", True: "PASS", False: "FAIL"}[r.passes]
    lines.append(f"targets: exact pass <= {TARGET_PASS_S} s and ratio >= {TARGET_RATIO}: {verdict}")
    return "\n".join(lines)


def device_bench(device: str) -> bool:
    """Whether `exactedit bench ... --device DEVICE` runs the JAX device benchmark: "gpu" always (an
    error when JAX sees no GPU), "auto" when JAX sees one; "cpu" keeps the host (numpy) benchmark."""
    if device == "cpu":
        return False
    return devmod.is_gpu(devmod.select(device))


def probe_compile(rows: int = 17352, vocab: int = 248320, n: int = 2560, d_lo: int = 320, repeats: int = 3,
                  device: str = "gpu", seed: int = 0) -> dict:
    """Seconds of the first call (compile + run) and of later calls of the exact pass and of the hc4
    mix at this shape, in this process. On a GPU a fresh process's first calls are dominated by
    XLA's gemm autotuning, which XLA_FLAGS (and a persistent compilation cache) change: run this
    under each setting, in a new process each time, to compare them."""
    import os

    import jax

    from exactedit.bench.gpu_solve import synthetic_tail_params
    from exactedit.bench.head import synthetic_q6k
    from exactedit.solvers.tail.forward.head_fast import hc4_mix_jax
    from exactedit.solvers.tail.passes.vocab_pass import QuantRows
    from exactedit.solvers.tail.passes.device_pass import to_device, vocab_pass_jax

    out = {"xla_flags": os.environ.get("XLA_FLAGS", "")}
    with devmod.scope(devmod.DeviceConfig(device, "exact")) as dev:
        out["compilation_cache"] = devmod.describe(dev)["compilation_cache"]
        rng = np.random.default_rng(seed)
        raw = synthetic_q6k(vocab, n, seed)
        head = to_device(QuantRows(lambda a, b: raw[a:b], "Q6_K", vocab, n), dev)
        params, _ = synthetic_tail_params(rng, n, d_lo)
        R = jax.device_put(rng.standard_normal((rows, 4, n)).astype(np.float32), dev)
        weights = [jax.device_put(w, dev) for w in params[:3]]
        mix = lambda: jax.block_until_ready(hc4_mix_jax(R, *weights, np.float32(params.eps)))  # noqa: E731
        out["mix_first_s"] = _timed(mix)
        out["mix_s"] = min(_timed(mix) for _ in range(repeats))
        z = np.asarray(hc4_mix_jax(R, *weights, np.float32(params.eps)))
        run = lambda: vocab_pass_jax(z, head)  # noqa: E731
        out["pass_first_s"] = _timed(run)
        out["pass_s"] = min(_timed(run) for _ in range(repeats))
    return out
