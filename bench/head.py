"""`exactedit bench head`: the streaming full-vocabulary pass over a synthetic Q6_K head against
numpy sgemm of the same shape on pre-dequantized float32, in the same run.

The head is random Q6_K blocks held in memory (random ql/qh/scales, fp16 d in [2^-14, 2^-11]):
a valid Q6_K tensor of the production shape, not a quantized matrix, which is all the timing
needs. The streaming pass (`vocab_pass`: dequantize a tile, sgemm, online LSE, argmax) runs
tile by tile. The baseline dequantizes the same tiles outside the clock and times only
`mix @ W_tile.T`, so its memory is bounded too. The ratio is sgemm time / streaming time, i.e.
the streaming pass's rate as a fraction of the sgemm rate. Peak memory is the process's peak
RSS during each phase (Linux VmHWM, reset per phase through /proc/self/clear_refs), reported
above the RSS before the Q6_K bytes were made, less those bytes.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Callable

import gguf
import numpy as np

from exactedit.solvers.tail.passes.vocab_pass import QuantRows, tile_size, vocab_pass

Progress = Callable[[int, int], None]
TARGET_RATIO = 0.7
TARGET_EXTRA_BYTES = 1.5e9


@dataclass(frozen=True)
class BenchHeadConfig:
    rows: int = 512
    vocab: int = 248320
    n: int = 2560
    tile_rows: int = 8192
    repeats: int = 1
    seed: int = 0

    def __post_init__(self):
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q6_K][0]
        for key in ("rows", "vocab", "n", "tile_rows", "repeats"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(f"{key} must be a positive integer, got {getattr(self, key)!r}")
        if self.n % block:
            raise ValueError(f"n must be a multiple of the Q6_K block ({block}), got {self.n}")


@dataclass(frozen=True)
class BenchHeadResult:
    config: BenchHeadConfig
    q6k_bytes: int
    stream_s: tuple[float, ...]       # per repeat
    sgemm_s: tuple[float, ...]
    dequant_s: tuple[float, ...]      # time inside the stream pass spent dequantizing
    ratio: float                      # best sgemm time / best stream time
    stream_gflops: float
    sgemm_gflops: float
    rss_before: int                   # bytes, before the Q6_K bytes were made
    peak_stream: int                  # peak RSS during the streaming pass
    peak_sgemm: int
    extra_stream: int                 # peak_stream - rss_before - q6k_bytes
    peak_is_per_phase: bool           # False where VmHWM could not be reset (then process peak)
    cpus: int
    numba_threads: int
    lse_check: float                  # max |LSE(stream) - LSE(baseline logits)| over rows

    @property
    def passes(self) -> bool:
        return self.ratio >= TARGET_RATIO and self.extra_stream <= TARGET_EXTRA_BYTES

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(passes=self.passes, target_ratio=TARGET_RATIO, target_extra_bytes=TARGET_EXTRA_BYTES)
        return d


def synthetic_q6k(vocab: int, n: int, seed: int, chunk: int = 8192) -> np.ndarray:
    """Random valid Q6_K rows uint8 [vocab, row_bytes], made in chunks (bounded transient memory)."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q6_K]
    nb = n // block
    out = np.empty((vocab, nb * size), dtype=np.uint8)
    rng = np.random.default_rng(seed)
    for a in range(0, vocab, chunk):
        b = min(a + chunk, vocab)
        blocks = out[a:b].reshape(b - a, nb, size)
        blocks[..., :size - 2] = rng.integers(0, 256, (b - a, nb, size - 2), dtype=np.uint8)
        d = 2.0 ** rng.uniform(-14, -11, (b - a, nb))
        blocks[..., size - 2:] = d.astype("<f2").view(np.uint8).reshape(b - a, nb, 2)
    return out


def _status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class _TimedRows(QuantRows):
    """QuantRows that adds up the time spent in `read` (dequantization)."""

    spent = 0.0

    def read(self, start, stop):
        t = time.perf_counter()
        out = super().read(start, stop)
        self.spent += time.perf_counter() - t
        return out


def run_bench_head(cfg: BenchHeadConfig, progress: Progress | None = None) -> BenchHeadResult:
    import numba

    from exactedit import quant

    quant.dequantize(synthetic_q6k(2, cfg.n, 1), "Q6_K", cfg.n)  # compile outside the clock
    rss_before = _status("VmRSS")
    raw = synthetic_q6k(cfg.vocab, cfg.n, cfg.seed)
    mix = np.random.default_rng(cfg.seed + 1).standard_normal((cfg.rows, cfg.n)).astype(np.float32)
    step = tile_size(cfg.rows, cfg.tile_rows)
    total = cfg.repeats * 2 * cfg.vocab
    done = 0

    def tick(d, _t):
        if progress is not None:
            progress(done + d, total)

    stream_s, sgemm_s, dequant_s = [], [], []
    per_phase = True
    peak_stream = peak_sgemm = 0
    lse_check = 0.0
    for rep in range(cfg.repeats):
        per_phase &= _reset_peak()
        src = _TimedRows(lambda a, b: raw[a:b], "Q6_K", cfg.vocab, cfg.n)
        t = time.perf_counter()
        vp = vocab_pass(mix, src, tile_rows=cfg.tile_rows, progress=tick)
        stream_s.append(time.perf_counter() - t)
        dequant_s.append(src.spent)
        peak_stream = max(peak_stream, _status("VmHWM"))
        done += cfg.vocab

        per_phase &= _reset_peak()
        spent, m, s = 0.0, np.full(cfg.rows, -np.inf), np.zeros(cfg.rows)
        for a in range(0, cfg.vocab, step):
            b = min(a + step, cfg.vocab)
            w = quant.dequantize(raw[a:b], "Q6_K", cfg.n)
            t = time.perf_counter()
            logits = mix @ w.T
            spent += time.perf_counter() - t
            if rep == 0:  # check the stream's LSE against the baseline's logits (float64)
                lg = logits.astype(np.float64)
                m_new = np.maximum(m, lg.max(axis=1))
                s = s * np.exp(m - m_new) + np.exp(lg - m_new[:, None]).sum(axis=1)
                m = m_new
            tick(b, cfg.vocab)
        sgemm_s.append(spent)
        peak_sgemm = max(peak_sgemm, _status("VmHWM"))
        done += cfg.vocab
        if rep == 0:
            lse_check = float(np.max(np.abs(vp.lse - (m + np.log(s)))))
    flops = 2.0 * cfg.rows * cfg.n * cfg.vocab
    return BenchHeadResult(
        cfg, int(raw.nbytes), tuple(stream_s), tuple(sgemm_s), tuple(dequant_s),
        min(sgemm_s) / min(stream_s), flops / min(stream_s) / 1e9, flops / min(sgemm_s) / 1e9,
        rss_before, peak_stream, peak_sgemm, peak_stream - rss_before - int(raw.nbytes), per_phase,
        len(os.sched_getaffinity(0)), numba.get_num_threads(), lse_check)


def render_bench_head(r: BenchHeadResult) -> str:
    """The text report of `exactedit bench head`."""
    c, gb = r.config, 1e9
    verdict = "PASS" if r.passes else "FAIL"
    return "\n".join([
        f"head {c.vocab} x {c.n} Q6_K ({r.q6k_bytes / gb:.3f} GB), {c.rows} rows, tile {c.tile_rows}, "
        f"{r.cpus} cpus, numba threads {r.numba_threads}",
        f"streaming pass   {min(r.stream_s):8.3f} s  {r.stream_gflops:7.1f} GFLOP/s  "
        f"(dequantize {min(r.dequant_s):.3f} s)",
        f"sgemm baseline   {min(r.sgemm_s):8.3f} s  {r.sgemm_gflops:7.1f} GFLOP/s",
        f"ratio            {r.ratio:8.3f}   (target >= {TARGET_RATIO})",
        f"peak RSS         stream {r.peak_stream / gb:.3f} GB, sgemm {r.peak_sgemm / gb:.3f} GB, "
        f"before {r.rss_before / gb:.3f} GB",
        f"extra peak       {r.extra_stream / gb:8.3f} GB above the Q6_K bytes (target <= "
        f"{TARGET_EXTRA_BYTES / gb:.1f})" + ("" if r.peak_is_per_phase else "  [process peak]"),
        f"LSE check        {r.lse_check:.3g} (stream vs float64 LSE of the baseline logits)",
        f"verdict          {verdict}"])
