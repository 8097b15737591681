"""`exactedit bench solve-head --device gpu` and `bench solve-wfld --device gpu`
(bench/wfld/gpu.py): the solvers' device work at production size, on synthetic inputs.

solve head (`run_gpu_solve_head`): the solver's own code on a JAX device (exact precision, inside
`solvers.tail.forward.device.scope`), from activations to the stopping rule's checkpoints:
  1. the hc4 mix of `rows` dumped rows (R' [rows, 4, n] -> z [rows, n], `hc4_mix_jax`);
  2. one full-vocab pass over them (`vocab_pass_jax`: top-(|S|+1), LSE over V \\ S, the logits of
     S, of the specials / openers / closers and of each next token), turned into train and dev
     `RowData` (`rowdata.from_pass`, as `rowdata.gather` does), then `build_batch` and the anchors' null space;
  3. `solvers.head.solve.optimize`: Adam steps (the jitted `objective_jax.train_step`) with the
     shipped edit (Q6_K round trip) scored on train and dev every `every` steps ("dev tracking",
     `solvers.head.track.DeviceTracker`, float64 on the device, as `solve head --device gpu` runs it).
Not in the clock: reading dumps and the GGUF from disk, the protocol and ledger, writing the bundle
(the synthetic head is uploaded first and timed on its own). The Adam step alone is also timed
(`bench.solve_head`'s step timing, on the device).

solve wfld: `bench/wfld/gpu.py` times the whole `solve_wfld` on the device.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from exactedit.solvers.tail.forward import device as devmod

Progress = Callable[[int, int], None]
TARGET_SOLVE_HEAD_S = 10.0
SPECIALS = (0, 1, 2, 3, 4)      # synthetic ids: <|im_start|>, <|im_end|> (turn end), <think>, </think>, eot
TURN_END = 1


@dataclass(frozen=True)
class GpuSolveHeadConfig:
    rows: int = 17352          # train + dev rows of the one pass
    dev_share: float = 0.2
    docs: int = 48
    k: int = 16                # |S|
    n: int = 2560
    d_lo: int = 320
    vocab: int = 248320
    rank: int = 1
    null_k: int = 32
    max_steps: int = 300
    every: int = 5
    step_repeats: int = 20     # timed Adam steps of the step-only measurement
    tile_rows: int = 8192
    seed: int = 0
    device: str = "gpu"

    def __post_init__(self):
        for key in ("rows", "docs", "k", "n", "d_lo", "vocab", "rank", "max_steps", "every", "step_repeats",
                    "tile_rows"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        if not 0 < self.dev_share < 1 or self.docs < 2 or self.rows < 8 * self.docs:
            raise ValueError("need 0 < dev_share < 1, docs >= 2 and at least 8 rows per document")
        if self.k + 1000 > self.vocab or self.n % 256 or not 0 <= self.null_k < self.n:
            raise ValueError("need vocab >= k + 1000, n a multiple of 256 and 0 <= null_k < n")
        devmod.DeviceConfig(self.device)


@dataclass(frozen=True)
class GpuSolveHeadResult:
    config: GpuSolveHeadConfig
    device: dict
    seconds: dict              # upload_head, mix, pass, rows, numba_warm, optimize, total (total: mix
                               # to the last checkpoint, without upload and numba_warm), checkpoint parts
    per_step_ms: float         # optimize's own per-step time (Adam only, after the compile)
    step_only: tuple           # bench.solve_head.StepTiming of rank r and full rows on the device
    term_rows: dict
    checkpoints: int
    loss_first_last: tuple[float, float]
    compiles: dict = None      # jax_cache.CompileCounter of the run: count, seconds, cache hits, by phase

    @property
    def passes(self) -> bool | None:
        """The target of the production shape (None for another shape)."""
        c = self.config
        if (c.rows, c.vocab, c.n, c.k, c.max_steps) != (17352, 248320, 2560, 16, 300):
            return None
        return self.seconds["total"] <= TARGET_SOLVE_HEAD_S

    def to_dict(self) -> dict:
        return {"config": asdict(self.config), "device": self.device, "seconds": self.seconds,
                "per_step_ms": self.per_step_ms,
                "step_only": [{**asdict(t), "median_ms": t.median_ms} for t in self.step_only],
                "term_rows": self.term_rows, "checkpoints": self.checkpoints,
                "loss_first_last": list(self.loss_first_last), "passes": self.passes,
                "target_s": TARGET_SOLVE_HEAD_S, "compiles": self.compiles}


def synthetic_tail_params(rng, n: int, d_lo: int, h: int = 640):
    """hc4 output-read weights (Hc4Head) and W_sd [n, h] of a plausible scale."""
    from exactedit.solvers.tail.forward.head_ref import Hc4Head

    head = Hc4Head((1 + 0.1 * rng.standard_normal((4, n))).astype(np.float32),
                   (rng.standard_normal((d_lo, 4 * n)) * 0.02).astype(np.float32),
                   (rng.standard_normal((4 * n, d_lo)) * 0.05).astype(np.float32))
    return head, (rng.standard_normal((n, h)) * 0.02).astype(np.float32)


def _documents(cfg: GpuSolveHeadConfig, rng, style: np.ndarray):
    """tokens, next, roles, doc index and DocMeta of `docs` chat documents: a prompt block (anchor
    rows), then a reply whose first row is step 0 and whose last predicts the turn end; one reply
    token in ten is a style token (the edit set)."""
    from exactedit.dumps.format import ROLE_PROMPT, ROLE_REPLY, ROLE_REPLY_END, ROLE_STEP0
    from exactedit.solvers.tail.scores import DocMeta

    T = cfg.rows
    bounds = np.linspace(0, T, cfg.docs + 1).astype(int)
    nxt = rng.integers(1000, cfg.vocab, T)
    roles = np.zeros(T, np.uint8)
    doc = np.zeros(T, np.int32)
    n_dev = max(1, int(round(cfg.docs * cfg.dev_share)))
    metas = []
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        p = a + (b - a) * 3 // 10
        roles[a:p] = ROLE_PROMPT
        roles[p:b] = ROLE_REPLY
        roles[p] |= ROLE_STEP0
        roles[b - 1] |= ROLE_REPLY_END
        nxt[b - 1] = TURN_END
        doc[a:b] = i
        metas.append(DocMeta(f"doc{i}", "synthetic", "dev" if i >= cfg.docs - n_dev else "train"))
    hit = np.flatnonzero(((roles & ROLE_REPLY) != 0) & (nxt != TURN_END) & (rng.random(T) < 0.1))
    nxt[hit] = rng.choice(style, size=hit.size)
    tokens = np.roll(nxt, 1)
    return tokens.astype(np.int32), nxt.astype(np.int32), roles, doc, tuple(metas), bounds[cfg.docs - n_dev]


def _checkpoint_parts(dw, rows_s, track, host_track) -> dict:
    """Seconds of each part of one dev-tracking checkpoint of `optimize` at the last edit (median of
    5): the Q6_K round trip (host), the device scoring, and the float64 numpy reference's scoring."""
    from exactedit.solvers.head.ship import shipped_edit

    def median(fn):
        return float(np.median([_timed(fn)[1] for _ in range(5)]))

    shipped, _ = shipped_edit(rows_s, dw)
    return {"ship": median(lambda: shipped_edit(rows_s, dw)), "device_scores": median(lambda: track(shipped)),
            "host_reference_scores": _timed(lambda: host_track(shipped))[1]}


def run_gpu_solve_head(cfg: GpuSolveHeadConfig, progress: Progress | None = None) -> GpuSolveHeadResult:
    import jax

    from exactedit import quant
    from exactedit.bench.head import synthetic_q6k
    from exactedit.bench.solve_head import BenchSolveHeadConfig, time_steps, synthetic_batch
    from exactedit.evals.protocol.protocol import StoppingRule
    from exactedit.solvers.head import rowdata, solve as head_solve
    from exactedit.solvers.head.batch import build_batch
    from exactedit.solvers.head.config import HeadSolveConfig
    from exactedit.solvers.tail.forward.head_fast import hc4_mix
    from exactedit.solvers.tail.forward.jax_cache import CompileCounter
    from exactedit.solvers.head.param import null_basis
    from exactedit.solvers.head.ship import HeadRows
    from exactedit.solvers.tail.passes.vocab_pass import QuantRows
    from exactedit.solvers.tail.passes.device_pass import to_device, vocab_pass_jax
    from exactedit.solvers.head.track import DeviceTracker, HostTracker

    total = cfg.max_steps + 2 * cfg.step_repeats + 4
    ticks = [0]

    def tick(step: int = 1):
        ticks[0] += step
        if progress is not None:
            progress(min(ticks[0], total), total)

    rng = np.random.default_rng(cfg.seed)
    raw = synthetic_q6k(cfg.vocab, cfg.n, cfg.seed)
    mix_params, _ = synthetic_tail_params(rng, cfg.n, cfg.d_lo)
    Rp = rng.standard_normal((cfg.rows, 4, cfg.n)).astype(np.float32)
    edit = np.sort(rng.choice(np.arange(1000, cfg.vocab), cfg.k, replace=False))
    openers, closers = tuple(range(200, 204)), (300, 301)
    sel_ids = tuple(dict.fromkeys([*SPECIALS, TURN_END, *openers, *closers]))
    tokens, nxt, roles, doc, docs, dev_start = _documents(cfg, rng, edit)
    scfg = HeadSolveConfig(rank=cfg.rank, null_k=cfg.null_k, backend="jax", w_ul=1.0, w_close=1.0,
                           openers=openers, closers=closers, tile_rows=cfg.tile_rows)
    stopping = StoppingRule(every=cfg.every, max_steps=cfg.max_steps)
    seconds = {}
    with devmod.scope(devmod.DeviceConfig(cfg.device, "exact")) as dev, CompileCounter() as compiles:
        t = time.perf_counter()
        head = to_device(QuantRows(lambda a, b: raw[a:b], "Q6_K", cfg.vocab, cfg.n), dev)
        jax.block_until_ready(head.raw)
        seconds["upload_head"] = time.perf_counter() - t
        compiles.mark("upload_head")
        tick()
        t0 = time.perf_counter()
        z = hc4_mix(Rp, mix_params)     # the solver's own mix: bucketed row chunks, weights as arguments
        seconds["mix"] = time.perf_counter() - t0
        compiles.mark("mix")
        t = time.perf_counter()
        wanted = np.concatenate([np.broadcast_to(edit, (cfg.rows, cfg.k)),
                                 np.broadcast_to(np.asarray(sel_ids), (cfg.rows, len(sel_ids))),
                                 nxt.astype(np.int64)[:, None]], axis=1)
        vp = vocab_pass_jax(z, head, token_sets=wanted, topk=cfg.k + 1, exclude=edit, tile_rows=cfg.tile_rows)
        seconds["pass"] = time.perf_counter() - t
        compiles.mark("pass")
        tick()
        t = time.perf_counter()
        rd = rowdata.from_pass(z, vp, tokens, nxt, roles, doc, docs, edit, sel_ids)
        train_rd, dev_rd = rd.take(np.arange(dev_start)), rd.take(np.arange(dev_start, cfg.rows))
        batch, counts = build_batch(train_rd, edit, SPECIALS, openers, closers, cfg.vocab)
        q = null_basis(train_rd.z[batch.anchor], cfg.null_k)
        view = quant.dequantize(raw[edit], "Q6_K", cfg.n).astype(np.float64)
        rows_s = HeadRows("output.weight", "Q6_K", (cfg.vocab, cfg.n), edit, raw[edit].copy(), view, False)
        seconds["rows"] = time.perf_counter() - t
        t = time.perf_counter()
        tracking = (batch, scfg.weights, train_rd, dev_rd, edit, edit, SPECIALS)
        track = DeviceTracker(*tracking, dev)
        seconds["tracker_upload"] = time.perf_counter() - t
        compiles.mark("rows_and_tracker")
        # numba compiles its Q6_K quantizer once per install (cached on disk): kept out of the total
        _, seconds["numba_warm"] = _timed(lambda: quant.quantize(np.ones((1, cfg.n), np.float32), "Q6_K"))
        t = time.perf_counter()
        checkpoints, saved, losses, _, per_step = head_solve.optimize(
            scfg, batch, q, rows_s, track, stopping, lambda d, tot: tick())
        seconds["optimize"] = time.perf_counter() - t
        seconds["total"] = time.perf_counter() - t0 - seconds["numba_warm"]
        compiles.mark("optimize")
        seconds["checkpoint"] = _checkpoint_parts(saved[max(saved)], rows_s, track, HostTracker(*tracking))
        bcfg = BenchSolveHeadConfig(rows=cfg.rows, k=cfg.k, n=cfg.n, null_k=cfg.null_k, steps=cfg.step_repeats,
                                    vocab=cfg.vocab, seed=cfg.seed, skip_pass=True)
        sb = synthetic_batch(np.random.default_rng(cfg.seed), cfg.rows, cfg.k, cfg.n)
        sb = sb._replace(z=sb.z.astype(np.float32))
        sq = null_basis(sb.z[sb.anchor[:4 * cfg.null_k + 1]], cfg.null_k)
        steps = tuple(time_steps(bcfg, sb, sq, r, lambda d, tot: tick()) for r in (cfg.rank, 0))
        compiles.mark("step_only")
    return GpuSolveHeadResult(cfg, devmod.describe(dev), seconds, 1000 * per_step, steps, counts, len(checkpoints),
                              (float(losses[0]), float(losses[-1])), compiles.to_dict())


def render_gpu_solve_head(r: GpuSolveHeadResult) -> str:
    c, s = r.config, r.seconds
    lines = [f"solve head on {r.device['device_kind']} (jax {r.device['jax']}), exact precision: {c.rows:,} rows "
             f"(dev share {c.dev_share}), |S| = {c.k}, n = {c.n}, V = {c.vocab:,}, rank {c.rank}, null k {c.null_k}",
             f"  head upload (Q6_K bytes)      {s['upload_head']:7.3f} s  (not in the total)",
             f"  hc4 mix of the rows            {s['mix']:7.3f} s",
             f"  full-vocab pass                {s['pass']:7.3f} s",
             f"  row data, batch, null space    {s['rows']:7.3f} s",
             f"  dev tracking data to device    {s['tracker_upload']:7.3f} s",
             f"  {c.max_steps} Adam steps + dev tracking every {c.every}: {s['optimize']:7.3f} s "
             f"({r.checkpoints} checkpoints, {r.per_step_ms:.2f} ms per step, J {r.loss_first_last[0]:.4g} -> "
             f"{r.loss_first_last[1]:.4g})",
             "  one checkpoint: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in s["checkpoint"].items()),
             f"  total                          {s['total']:7.3f} s  (target <= {TARGET_SOLVE_HEAD_S:g} s: "
             f"{_verdict(r.passes)})",
             _compile_line(r.compiles, r.device)]
    for t in r.step_only:
        lines.append(f"  Adam step alone, {t.param:<9} median {t.median_ms:7.2f} ms (compile {t.compile_s:.1f} s)")
    return "\n".join(lines)


def _compile_line(compiles: dict | None, device: dict) -> str:
    """One line: XLA compiles of the run, their seconds, persistent-cache hits and the cache's state."""
    cache = device.get("compilation_cache") or {}
    where = f"on, {cache.get('dir')}" if cache.get("on") else "off"
    c = compiles or {}
    return (f"  XLA compiles {c.get('compiles', 0)} ({c.get('compile_s', 0.0):.1f} s), persistent cache hits "
            f"{c.get('cache_hits', 0)}; compilation cache {where}")


def _verdict(passes: bool | None) -> str:
    return {None: "n/a at this shape", True: "PASS", False: "FAIL"}[passes]


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t
