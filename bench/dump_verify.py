"""`exactedit bench dump-verify`: what verifying a dump's field hashes costs when it is opened.

A synthetic hc4 dump at production width (n 2560, 4 streams, h 640) of about `mb` MiB is written
once; then, best of `repeats` each, on a warm page cache:
- a plain read of every field file through the same chunked loop, no hashing (the baseline);
- `read_dump` without verification and without the value scan (the open itself);
- `read_dump` with verification (the default), so hashing = this minus the open;
- `read_dump` again with a `VerifyCache` that already holds the dump (what a second open in one
  command costs);
- the value scan alone, for comparison (the other full pass an open makes by default).
Reported: GB/s of the verification and its ratio to the plain read of the same bytes.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit.errors import ExacteditError

Progress = Callable[[int, int], None]
N, S, H = 2560, 4, 640


@dataclass(frozen=True)
class DumpVerifyBenchConfig:
    mb: int = 1024
    repeats: int = 3
    workdir: str | None = None

    def __post_init__(self):
        if self.mb < 1 or self.repeats < 1:
            raise ExacteditError(f"bench dump-verify: mb and repeats must be >= 1, got {self}")


@dataclass(frozen=True)
class DumpVerifyBenchResult:
    rows: int
    bytes: int              # every field file, headers included (what is hashed)
    read_s: float           # plain chunked read, no hashing (baseline)
    open_s: float           # read_dump(verify_hashes=False, check_finite=False)
    verify_s: float         # read_dump(check_finite=False): the open + hashing
    cached_s: float         # read_dump with a VerifyCache that already verified this dump
    scan_s: float           # read_dump(verify_hashes=False): the open + the value scan
    hash_gbps: float        # bytes / (verify_s - open_s), 1e9 bytes per second
    read_gbps: float        # bytes / read_s
    ratio: float            # (verify_s - open_s) / read_s: hashing vs reading the same bytes

    def to_dict(self) -> dict:
        return asdict(self)


def _write(path: Path, rows: int) -> None:
    from exactedit.dumps import DocInfo, write_dump

    rng = np.random.default_rng(0)
    block = 256
    def tile(*shape):  # noqa: E306 - random values, cheaply repeated to the full size
        b = rng.standard_normal((block, *shape)).astype(np.float32)
        return np.resize(b, (rows, *shape))
    write_dump(path, arch="hc4", layer=47, docs=[DocInfo("bench", 0, rows, "bench", "bench")],
               fields={"tokens": np.zeros(rows, np.int32), "next": np.zeros(rows, np.int32),
                       "R": tile(S, N), "inj": tile(S), "hh": tile(H), "sgv": tile(), "yr": tile(N)})


def _plain_read(files) -> None:
    buf = memoryview(bytearray(8 << 20))
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def run_dump_verify_bench(cfg: DumpVerifyBenchConfig, progress: Progress | None = None) -> DumpVerifyBenchResult:
    from exactedit.dumps import VerifyCache, read_dump

    row_bytes = 4 * (S * N + S + H + 1 + N) + 2 * 4
    rows = max(1, (cfg.mb << 20) // row_bytes)
    with tempfile.TemporaryDirectory(dir=cfg.workdir) as tmp:
        path = Path(tmp) / "dump"
        _write(path, rows)
        files = sorted(path.glob("*.npy"))
        size = sum(os.path.getsize(f) for f in files)
        steps = [lambda: _plain_read(files),
                 lambda: read_dump(path, verify_hashes=False, check_finite=False),
                 lambda: read_dump(path, check_finite=False)]
        _plain_read(files)  # warm the page cache once before timing anything
        times = []
        for i, step in enumerate(steps):
            times.append(_best(step, cfg.repeats))
            if progress is not None:
                progress(i + 1, 5)
        cache = VerifyCache()
        read_dump(path, check_finite=False, cache=cache)
        cached = _best(lambda: read_dump(path, check_finite=False, cache=cache), cfg.repeats)
        if progress is not None:
            progress(4, 5)
        scan = _best(lambda: read_dump(path, verify_hashes=False), cfg.repeats)
        if progress is not None:
            progress(5, 5)
    read_s, open_s, verify_s = times
    hash_s = max(verify_s - open_s, 1e-12)
    return DumpVerifyBenchResult(rows, size, read_s, open_s, verify_s, cached, scan, size / hash_s / 1e9,
                                 size / read_s / 1e9, hash_s / read_s)


def render_dump_verify(r: DumpVerifyBenchResult) -> str:
    return "\n".join([
        f"hc4 dump, {r.rows:,} rows (n {N}, {S} streams, h {H}), {r.bytes / 1e9:.3f} GB of field files, warm cache",
        f"  plain read (baseline)          {r.read_s:8.3f} s  {r.read_gbps:6.2f} GB/s",
        f"  open, no verify, no scan       {r.open_s:8.3f} s",
        f"  open + verify (default)        {r.verify_s:8.3f} s  hashing {r.hash_gbps:6.2f} GB/s",
        f"  open + verify, cached          {r.cached_s:8.3f} s",
        f"  open + value scan, no verify   {r.scan_s:8.3f} s",
        f"  hashing / plain read           {r.ratio:8.2f}x"])
