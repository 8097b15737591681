"""The row plumbing the format modules share: a format writes only its row kernels, numba
functions that do one row (its blocks, in order) into a preallocated output row, and builds its
fast paths here.

    parallel_rows(kernel, *consts) -> run(src, dst)
        kernel(src[r], dst[r], *consts) for every row r of dst, rows in parallel (numba prange)

The loop is compiled like the kernels (no fastmath, numpy's error model) but not cached on disk:
numba keys a cached closure by a pickle of the kernel it closes over, which differs in every
process, so a cache would miss every time and grow by one file per process. The kernels it calls
stay cached; compiling the loop around one, once a process, takes 0.4 to 1.4 s (Q4_0 to Q4_K).
"""
from __future__ import annotations

from typing import Callable

import numba
from numba import prange

__all__ = ["parallel_rows"]


def parallel_rows(kernel, *consts) -> Callable:
    """`run(src, dst)`: kernel(src[r], dst[r], *consts) for every row r of dst, in parallel. With
    no consts, `run` is the numba function itself; `consts` (a lookup table, search parameters)
    are passed to the kernel unchanged."""

    @numba.njit(parallel=True, error_model="numpy")
    def loop(src, dst, *args):
        for r in prange(dst.shape[0]):
            kernel(src[r], dst[r], *args)

    if not consts:
        return loop

    def run(src, dst) -> None:
        loop(src, dst, *consts)

    return run
