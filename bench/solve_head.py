"""`exactedit bench solve-head`: one Adam step of the head solver at production size, and the
full-vocab pass it needs once, against sgemm of the same shape.

The step works on synthetic arrays of the production shape (rows x |S| x n); its cost does not
depend on the values. The full-vocab pass is bench/head.py's measurement, reused as is.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from exactedit.solvers.head.objective import HeadBatch, MarginTerm, SetTerm, TargetTerm, logsumexp


def synthetic_batch(rng: np.random.Generator, rows: int, k: int, n: int, *, z_scale: float = 1.0,
                    share: float = 0.5) -> HeadBatch:
    """A random, self-consistent HeadBatch: every term has about `share` of the rows, targets and
    set members both inside and outside S, base LSE = logaddexp(LSE_rest, logsumexp(base_s))."""
    z = rng.standard_normal((rows, n)) * (z_scale / np.sqrt(n))
    base_s = rng.normal(0.0, 1.5, (rows, k))
    lse_rest = rng.normal(2.0, 1.0, rows)
    lse = np.logaddexp(lse_rest, logsumexp(base_s))

    def pick():
        m = max(1, int(round(share * rows)))
        return np.sort(rng.choice(rows, size=m, replace=False))

    def target(rows_):
        slot = rng.integers(-1, k, len(rows_))
        logit = lse[rows_] - rng.exponential(3.0, len(rows_))
        return TargetTerm(rows_, logit, slot)

    def set_term(rows_):
        mask = rng.random((len(rows_), k)) < 0.3
        lse_out = lse_rest[rows_] - rng.exponential(2.0, len(rows_))  # members outside S are in the rest
        lse_out[rng.random(len(rows_)) < 0.3] = -np.inf
        return SetTerm(rows_, mask, lse_out)

    mrows = pick()
    cho, rej = target(mrows), target(mrows)
    return HeadBatch(z=z, base_s=base_s, lse_rest=lse_rest, lse=lse, nll=target(pick()),
                     margin=MarginTerm(cho, rej), opener=set_term(pick()),
                     closer=set_term(pick()), anchor=pick(), guard=pick())


TARGET_STEP_MS = 50.0


@dataclass(frozen=True)
class BenchSolveHeadConfig:
    """rows x |S| x n of the Adam step (the persona dump's 17,352 rows, |S| = 16, n = 2560); the
    full-vocab pass over `pass_rows` rows of a synthetic Q6_K head of `vocab` rows."""

    rows: int = 17352
    k: int = 16
    n: int = 2560
    null_k: int = 32
    steps: int = 20
    vocab: int = 248320
    pass_rows: int = 512
    tile_rows: int = 8192
    seed: int = 0
    skip_pass: bool = False

    def __post_init__(self):
        for key in ("rows", "k", "n", "steps", "vocab", "pass_rows", "tile_rows"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        if not 0 <= self.null_k < self.n:
            raise ValueError(f"null_k must be in [0, n), got {self.null_k}")
        if self.k >= self.vocab:
            raise ValueError(f"k must be below vocab, got {self.k}")


@dataclass(frozen=True)
class StepTiming:
    param: str              # "rank 1" or "full rows"
    n_params: int
    compile_s: float
    step_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return float(np.median(self.step_ms))


@dataclass(frozen=True)
class BenchSolveHeadResult:
    config: BenchSolveHeadConfig
    steps: tuple[StepTiming, ...]
    pass_s: float            # the solver's pass (top-(|S|+1), LSE over V \ S, selected logits)
    plain_pass_s: float      # bench head's plain streaming pass
    sgemm_s: float           # bench head's sgemm of the same shape
    pass_ratio: float        # sgemm / solver pass
    plain_ratio: float       # sgemm / plain pass (bench head's ratio)

    @property
    def passes(self) -> bool:
        return all(t.median_ms <= TARGET_STEP_MS for t in self.steps if t.param == "rank 1")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["steps"] = [{**asdict(t), "median_ms": t.median_ms} for t in self.steps]
        d.update(passes=self.passes, target_step_ms=TARGET_STEP_MS)
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in d.items()}


def time_steps(cfg: BenchSolveHeadConfig, batch, q, rank: int, tick) -> StepTiming:
    import jax
    import jax.numpy as jnp

    from exactedit.solvers.head import objective_jax as oj
    from exactedit.solvers.head.adam import AdamConfig, AdamState
    from exactedit.solvers.head.objective import Weights
    from exactedit.solvers.head.param import FullRows, LowRank

    rng = np.random.default_rng(cfg.seed + rank)
    if rank == 0:
        params = FullRows(jnp.zeros((cfg.k, cfg.n), jnp.float32))
    else:
        params = LowRank(jnp.zeros((cfg.k, rank), jnp.float32),
                         jnp.asarray(rng.standard_normal((cfg.n, rank)) / np.sqrt(cfg.n), jnp.float32))
    data = oj.to_device(batch, q)
    scfg = oj.StepConfig(Weights(nll=1.0, margin=0.5, ul=1.0, close=1.0, kl=100.0, guard=1.0, ridge=1e-3),
                         AdamConfig(lr=1e-3))
    zeros = type(params)(*(jnp.zeros_like(x) for x in params))
    state = AdamState(jnp.zeros((), jnp.int32), zeros, zeros)
    fn = oj.train_step_jit
    t = time.perf_counter()
    params, state, _ = fn(params, state, data, cfg=scfg)
    jax.block_until_ready(params)
    compile_s = time.perf_counter() - t
    times = []
    for i in range(cfg.steps):
        t = time.perf_counter()
        params, state, _ = fn(params, state, data, cfg=scfg)
        jax.block_until_ready(params)
        times.append(1000 * (time.perf_counter() - t))
        tick(i + 1, cfg.steps)
    n_par = int(sum(np.size(x) for x in params))
    return StepTiming("full rows" if rank == 0 else f"rank {rank}", n_par, compile_s, tuple(times))


def _solver_pass_s(cfg: BenchSolveHeadConfig, tick) -> float:
    """The solve's vocab pass (what `rowdata.gather` asks for) on bench head's synthetic head."""
    from exactedit.bench.head import synthetic_q6k
    from exactedit.solvers.tail.passes.vocab_pass import QuantRows, vocab_pass

    raw = synthetic_q6k(cfg.vocab, cfg.n, cfg.seed)
    rng = np.random.default_rng(cfg.seed + 1)
    mix = rng.standard_normal((cfg.pass_rows, cfg.n)).astype(np.float32)
    edit = rng.choice(cfg.vocab, cfg.k, replace=False)
    wanted = np.concatenate([np.broadcast_to(edit, (cfg.pass_rows, cfg.k)),
                             rng.integers(0, cfg.vocab, (cfg.pass_rows, 8))], axis=1)
    src = QuantRows(lambda a, b: raw[a:b], "Q6_K", cfg.vocab, cfg.n)
    t = time.perf_counter()
    vocab_pass(mix, src, token_sets=wanted, topk=cfg.k + 1, exclude=edit, tile_rows=cfg.tile_rows, progress=tick)
    return time.perf_counter() - t


def run_bench_solve_head(cfg: BenchSolveHeadConfig, progress: Callable[[int, int], None] | None = None
                         ) -> BenchSolveHeadResult:
    from exactedit.bench.head import BenchHeadConfig, run_bench_head
    from exactedit.solvers.head.param import null_basis

    phases = 2 * cfg.steps + (0 if cfg.skip_pass else 3 * cfg.vocab)
    done = [0]

    def phase(size):
        base = done[0]
        done[0] += size
        return lambda d, t: progress(base + int(size * d / max(t, 1)), phases) if progress else None

    rng = np.random.default_rng(cfg.seed)
    batch = synthetic_batch(rng, cfg.rows, cfg.k, cfg.n)
    batch = batch._replace(z=batch.z.astype(np.float32))
    q = null_basis(batch.z[batch.anchor[:4 * cfg.null_k + 1]], cfg.null_k)
    steps = tuple(time_steps(cfg, batch, q, rank, phase(cfg.steps)) for rank in (1, 0))
    del batch
    if cfg.skip_pass:
        nan = float("nan")
        return BenchSolveHeadResult(cfg, steps, nan, nan, nan, nan, nan)
    head = run_bench_head(BenchHeadConfig(cfg.pass_rows, cfg.vocab, cfg.n, cfg.tile_rows, 1, cfg.seed),
                          progress=phase(2 * cfg.vocab))
    solver_s = _solver_pass_s(cfg, phase(cfg.vocab))
    sgemm = min(head.sgemm_s)
    return BenchSolveHeadResult(cfg, steps, solver_s, min(head.stream_s), sgemm, sgemm / solver_s, head.ratio)


def render_bench_solve_head(r: BenchSolveHeadResult) -> str:
    c = r.config
    lines = [f"Adam step of solve head: {c.rows:,} rows x |S| = {c.k} x n = {c.n}, null space k = {c.null_k}, "
             f"JAX float32 (jit), {c.steps} timed steps"]
    for t in r.steps:
        lines.append(f"  {t.param:<10} {t.n_params:>8,} params  median {t.median_ms:8.2f} ms  "
                     f"min {min(t.step_ms):8.2f} ms  (compile {t.compile_s:.1f} s)")
    lines.append(f"  target: rank 1 <= {TARGET_STEP_MS:g} ms per step -> {'PASS' if r.passes else 'FAIL'}")
    if np.isfinite(r.pass_s):
        lines += [f"full-vocab pass: {c.pass_rows} rows x V = {c.vocab:,} Q6_K, tile {c.tile_rows}",
                  f"  solver's pass (top-{c.k + 1}, LSE over V \\ S, selected) {r.pass_s:8.3f} s  "
                  f"sgemm/pass {r.pass_ratio:.3f}",
                  f"  plain streaming pass (bench head)              {r.plain_pass_s:8.3f} s  "
                  f"sgemm/pass {r.plain_ratio:.3f}",
                  f"  sgemm of the same shape                        {r.sgemm_s:8.3f} s"]
    return "\n".join(lines)
