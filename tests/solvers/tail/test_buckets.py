"""Bucketed row chunks of the jitted tail functions (solvers/tail/forward/buckets.py): the bucket table; the
bucketed host wrappers against one unpadded call of the same jitted function; padding rows change
no bit of the real rows; one compile per bucket.

Against the unpadded call: bit for bit wherever the function is products and elementwise math
(the layer-47 writes without a norm: XLA:CPU's dot gives each row the same bits at every row
count), and at row counts that are bucket sizes; the functions with a row RMS norm (the mixes, the
post-FFN norm) are within a few float32 ulps at other row counts, because XLA:CPU vectorizes the
per-row mean over n differently for different shapes (the unpadded call's own bits depend on T;
the bucketed ones only on the bucket). Bit for bit in every case: the same row's output whatever
rows (zeros or data) fill the rest of its bucket."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from exactedit.solvers.tail.forward import buckets
from exactedit.solvers.tail.forward import head_fast, last_layer_fast as l47_fast
from exactedit.solvers.tail.forward.head_ref import Hc4Head, RmsnormHead
from exactedit.solvers.tail.forward.jax_cache import CompileCounter
from exactedit.solvers.tail.forward.last_layer_ref import Hc4L47, RmsnormL47

ROWS = [0, 1, 7, 63, 64, 65, 200, 4096, 4097]


@pytest.mark.parametrize("rows,bucket", [(0, 64), (1, 64), (64, 64), (65, 128), (1000, 1024), (4096, 4096)])
def test_bucket_rows(rows, bucket):
    assert buckets.bucket_rows(rows) == bucket


def test_row_chunks_cover_every_row_once():
    for rows in [0, 1, 4095, 4096, 4097, 9000, 17352]:
        chunks = buckets.row_chunks(rows)
        assert sum(b - a for a, b, _ in chunks) == rows
        assert all(b - a <= p <= buckets.MAX_ROWS and p in (64, 128, 256, 512, 1024, 2048, 4096)
                   for a, b, p in chunks)
        assert [a for a, _, _ in chunks][1:] == [b for _, b, _ in chunks][:-1]
    with pytest.raises(ValueError):
        buckets.bucket_rows(buckets.MAX_ROWS + 1)


def _hc4(n=64, d_lo=8, h=24, seed=0):
    rng = np.random.default_rng(seed)
    head = Hc4Head((1 + 0.1 * rng.standard_normal((4, n))).astype(np.float32),
                   (rng.standard_normal((d_lo, 4 * n)) * 0.1).astype(np.float32),
                   (rng.standard_normal((4 * n, d_lo)) * 0.1).astype(np.float32), 1e-6)
    return head, Hc4L47((rng.standard_normal((n, h)) * 0.05).astype(np.float32))


def _f32(x):
    return jnp.asarray(np.asarray(x, np.float32))


@pytest.mark.parametrize("rows", ROWS)
def test_hc4_mix_and_l47_bitwise(rows):
    head, l47 = _hc4()
    rng = np.random.default_rng(rows)
    R = rng.standard_normal((rows, 4, 64)).astype(np.float32)
    inj, hh = rng.standard_normal((rows, 4)).astype(np.float32), rng.standard_normal((rows, 24)).astype(np.float32)
    sgv, yr = rng.standard_normal(rows).astype(np.float32), rng.standard_normal((rows, 64)).astype(np.float32)
    got = l47_fast.hc4_l47(R, inj, hh, sgv, yr, l47)
    want = np.asarray(l47_fast.hc4_l47_jax(*map(_f32, (R, inj, hh, sgv, yr, l47.w_sd))))
    assert got.shape == want.shape and np.array_equal(got, want)
    mix = head_fast.hc4_mix(got, head)
    want = np.asarray(head_fast.hc4_mix_jax(_f32(got), _f32(head.w_onorm), _f32(head.w_odown), _f32(head.w_oup),
                                            jnp.float32(head.eps)))
    assert mix.shape == (rows, 64)
    _same_or_ulps(mix, want, exact=rows in (64, 4096))


def _same_or_ulps(got, want, *, exact: bool):
    if exact:
        assert np.array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=4 * 2.0 ** -24, atol=4 * 2.0 ** -24 * float(np.max(np.abs(want),
                                                                                                       initial=0)))


@pytest.mark.parametrize("rows", [1, 7, 63, 65, 200, 4097])
def test_padding_rows_change_no_bit(rows):
    """Row t's output is the same bits whatever fills the rest of its bucket (zeros or other rows)."""
    head, l47 = _hc4()
    rng = np.random.default_rng(rows)
    full = buckets.row_chunks(rows)[-1][2] + buckets.MAX_ROWS * (len(buckets.row_chunks(rows)) - 1)
    R = rng.standard_normal((full, 4, 64)).astype(np.float32)
    rest = [rng.standard_normal((full,) + s).astype(np.float32) for s in ((4,), (24,), (), (64,))]
    alone = l47_fast.hc4_l47(R[:rows], *(x[:rows] for x in rest), l47)
    filled = l47_fast.hc4_l47(R, *rest, l47)
    assert np.array_equal(alone, filled[:rows])
    assert np.array_equal(head_fast.hc4_mix(alone, head), head_fast.hc4_mix(filled, head)[:rows])


@pytest.mark.parametrize("post", [False, True])
@pytest.mark.parametrize("rows", [1, 65, 4097])
def test_rmsnorm_mix_and_l47_bitwise(rows, post):
    rng = np.random.default_rng(rows)
    n, h = 64, 24
    w_down = (rng.standard_normal((n, h)) * 0.05).astype(np.float32)
    w_post = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32) if post else None
    R, hh = rng.standard_normal((rows, n)).astype(np.float32), rng.standard_normal((rows, h)).astype(np.float32)
    got = l47_fast.rmsnorm_l47(R, hh, RmsnormL47(w_down, w_post, 1e-6))
    if post:
        want = l47_fast.rmsnorm_post_l47_jax(_f32(R), _f32(hh), _f32(w_down), _f32(w_post), jnp.float32(1e-6))
    else:
        want = l47_fast.rmsnorm_l47_jax(_f32(R), _f32(hh), _f32(w_down))
    _same_or_ulps(got, np.asarray(want), exact=not post)
    w_norm = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    mix = head_fast.rmsnorm_mix(got, RmsnormHead(w_norm, 1e-6, None))
    _same_or_ulps(mix, np.asarray(head_fast.rmsnorm_mix_jax(_f32(got), _f32(w_norm), jnp.float32(1e-6))), exact=False)


def test_same_bucket_compiles_once():
    """A second call with another row count in the same bucket (and new weights) compiles nothing."""
    head, _ = _hc4(n=96, d_lo=4, seed=1)           # a shape no other test uses
    rng = np.random.default_rng(0)
    head_fast.hc4_mix(rng.standard_normal((70, 4, 96)).astype(np.float32), head)     # bucket 128
    other, _ = _hc4(n=96, d_lo=4, seed=2)
    with CompileCounter() as c:
        head_fast.hc4_mix(rng.standard_normal((100, 4, 96)).astype(np.float32), other)
        head_fast.hc4_mix(rng.standard_normal((128, 4, 96)).astype(np.float32), head)
    assert c.compiles == 0, c.to_dict()
    with CompileCounter() as c:                     # the counter does count: a new bucket compiles
        head_fast.hc4_mix(rng.standard_normal((129, 4, 96)).astype(np.float32), head)
    assert c.compiles >= 1 and c.compile_s > 0
