"""No jitted tail or solver function bakes an array into its program: weights, heads and rows are
arguments. Each function is lowered at a small shape and its StableHLO scanned for non-splat
constant literals over LIMIT bytes (a captured array shows up as one); a control closure over an
array must be caught. Also: the head VJP's row buckets against the unpadded call."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from exactedit.bench.head import synthetic_q6k
from exactedit.solvers.tail.passes import device_pass, kl_pass_jax
from exactedit.solvers.tail.forward import head_fast, last_layer_fast as l47_fast
from exactedit.solvers.tail.forward.jax_cache import CompileCounter
from exactedit.solvers.tail.passes.vocab_pass import QuantRows

LIMIT = 4096  # bytes: a few KB
_BYTES = {"f64": 8, "f32": 4, "i32": 4, "ui32": 4, "bf16": 2, "f16": 2, "i16": 2, "ui16": 2, "i8": 1, "ui8": 1,
          "i1": 1, "i64": 8, "ui64": 8}
_CONST = re.compile(r"(?:stablehlo|mhlo)\.constant\s+(dense(?:_resource)?<(.{0,2}))[^\n]*?:\s*tensor<([^>]*)>")


def large_constants(text: str, limit: int = LIMIT) -> list[str]:
    """The tensor types of the non-splat constants over `limit` bytes in a StableHLO module."""
    found = []
    for m in _CONST.finditer(text):
        head, first, ty = m.groups()
        splat = head == "dense<" and first[:1] not in ("[", '"')
        if splat:
            continue
        *dims, dtype = ty.split("x")
        size = int(np.prod([int(d) for d in dims])) if dims else 1
        if size * _BYTES.get(dtype, 4) > limit:
            found.append(ty)
    return found


def lowered_text(fn, *args, **kw) -> str:
    return fn.lower(*args, **kw).as_text()


def test_control_closure_is_caught():
    w = jnp.asarray(np.random.default_rng(0).standard_normal((64, 64)), jnp.float32)
    x = jnp.ones((8, 64), jnp.float32)
    assert large_constants(lowered_text(jax.jit(lambda a: a @ w), x)) == ["64x64xf32"]
    assert large_constants(lowered_text(jax.jit(lambda a, b: a @ b), x, w)) == []
    assert large_constants(lowered_text(jax.jit(lambda a: a + 1.0), x)) == []   # a splat is not a capture


N, D_LO, H, V = 256, 16, 64, 1024


def _rng():
    return np.random.default_rng(0)


def _f32(*shape):
    return jnp.asarray(_rng().standard_normal(shape), jnp.float32)


def _tail_cases():
    eps = jnp.float32(1e-6)
    rows = device_pass.to_device(QuantRows(lambda a, b: synthetic_q6k(V, N, 0)[a:b], "Q6_K", V, N),
                                 jax.devices("cpu")[0])
    mix = device_pass.prepare(_f32(64, N), "exact", 64)
    i32 = lambda *s: jnp.zeros(s, jnp.int32)  # noqa: E731
    static = dict(qtype="Q6_K", cols=N, tile=512, precision="exact", platform="cpu", softcap=None)
    return {
        "hc4_mix_jax": (head_fast.hc4_mix_jax, (_f32(64, 4, N), _f32(4, N), _f32(D_LO, 4 * N), _f32(4 * N, D_LO), eps), {}),
        "rmsnorm_mix_jax": (head_fast.rmsnorm_mix_jax, (_f32(64, N), _f32(N), eps), {}),
        "hc4_l47_jax": (l47_fast.hc4_l47_jax, (_f32(64, 4, N), _f32(64, 4), _f32(64, H), _f32(64), _f32(64, N),
                                               _f32(N, H)), {}),
        "rmsnorm_l47_jax": (l47_fast.rmsnorm_l47_jax, (_f32(64, N), _f32(64, H), _f32(N, H)), {}),
        "rmsnorm_post_l47_jax": (l47_fast.rmsnorm_post_l47_jax, (_f32(64, N), _f32(64, H), _f32(N, H), _f32(N), eps),
                                 {}),
        "_pass_tile": (device_pass._pass_tile, (rows.raw, mix, jnp.int32(0), jnp.int32(0), i32(3), i32(64, 4),
                                                jnp.zeros((64, 4), jnp.float32)),
                       dict(static, k=5, has_exclude=True, want_logits=False)),
        "_kl_tile": (kl_pass_jax._kl_tile, (rows.raw, mix, mix, jnp.int32(0), jnp.int32(0), i32(64)), static),
        "prepare": (device_pass.prepare, (_f32(50, N), "exact", 64), {}),
        "_merge_topk": (device_pass._merge_topk, (_f32(64, 10), i32(64, 10), 5), {}),
    }


@pytest.mark.parametrize("name", list(_tail_cases()))
def test_tail_functions_capture_no_array(name):
    fn, args, kw = _tail_cases()[name]
    static = [a for a in args if isinstance(a, (str, int)) and not isinstance(a, jax.Array)]
    if static:  # positional statics (prepare's precision and rows, _merge_topk's k) go by name
        names = {"prepare": ("precision", "rows"), "_merge_topk": ("k",)}[name]
        kw = dict(kw, **dict(zip(names, static)))
        args = tuple(a for a in args if not (isinstance(a, (str, int)) and not isinstance(a, jax.Array)))
    assert large_constants(lowered_text(fn, *args, **kw)) == []


def test_head_vjps_capture_no_array():
    from exactedit.solvers.l47 import jacobian

    eps = jnp.float32(1e-6)
    hc4 = lowered_text(jacobian._hc4_vjp, _f32(64, 4, N), _f32(64, 8, N), _f32(4, N), _f32(D_LO, 4 * N),
                       _f32(4 * N, D_LO), eps)
    rms = lowered_text(jacobian._rms_vjp, _f32(64, N), _f32(64, 8, N), _f32(N), eps)
    post = lowered_text(jacobian._post_vjp, _f32(64, H), _f32(64, 8, N), _f32(N, H), _f32(N), eps)
    assert large_constants(hc4) == [] and large_constants(rms) == [] and large_constants(post) == []


def test_head_solver_steps_capture_no_array():
    from exactedit.bench.solve_head import synthetic_batch
    from exactedit.solvers.head import objective_jax as oj
    from exactedit.solvers.head.adam import AdamConfig, AdamState
    from exactedit.solvers.head.objective import Weights
    from exactedit.solvers.head.param import LowRank
    from exactedit.solvers.head.track import _checkpoint_jit

    batch = synthetic_batch(_rng(), 300, 4, N)
    data = oj.to_device(batch, np.zeros((N, 0)))
    params = LowRank(jnp.zeros((4, 1), jnp.float32), _f32(N, 1))
    zeros = LowRank(jnp.zeros((4, 1), jnp.float32), jnp.zeros((N, 1), jnp.float32))
    cfg = oj.StepConfig(Weights(nll=1.0, margin=0.5, ul=1.0, close=1.0, kl=100.0, guard=1.0, ridge=1e-3),
                        AdamConfig(lr=1e-3))
    text = lowered_text(oj.train_step_jit, params, AdamState(jnp.zeros((), jnp.int32), zeros, zeros), data, cfg=cfg)
    assert large_constants(text) == []
    f = lambda *s: jnp.zeros(s, jnp.float32)  # noqa: E731
    b = lambda *s: jnp.zeros(s, bool)  # noqa: E731
    train = (f(300, 4), f(300), jnp.zeros(300, jnp.int32), b(300), b(300), b(300))     # ..., style, ordinary, off
    dev = (f(50, N), f(50, 4), f(50), jnp.zeros(50, jnp.int32), b(50), b(50), b(50))
    text = lowered_text(_checkpoint_jit(), f(4, N), data, train, dev, w=cfg.weights)
    assert large_constants(text) == []


def _hc4_tail(n=64, d_lo=8, seed=0):
    from exactedit.solvers.tail.forward.head_ref import Hc4Head

    rng = np.random.default_rng(seed)

    class Tail:
        kind = "hc4"
        mix_params = Hc4Head((1 + 0.1 * rng.standard_normal((4, n))).astype(np.float32),
                             (rng.standard_normal((d_lo, 4 * n)) * 0.1).astype(np.float32),
                             (rng.standard_normal((4 * n, d_lo)) * 0.1).astype(np.float32), 1e-6)
    return Tail()


@pytest.mark.parametrize("rows,m", [(1, 1), (5, 3), (64, 8), (64, 17), (70, 13)])
def test_head_vjp_buckets(rows, m):
    """The bucketed VJP (rows to 64, 128, ...) against the unpadded call: bit for bit at bucket
    shapes, within a few ulps elsewhere (the row norm, see tests/solvers/tail/test_buckets.py)."""
    from exactedit.solvers.l47 import jacobian

    tail = _hc4_tail()
    rng = np.random.default_rng(rows * 100 + m)
    Rp, cot = rng.standard_normal((rows, 4, 64)), rng.standard_normal((rows, m, 64))
    got = jacobian.head_vjp_jax(tail, Rp, cot)
    p = tail.mix_params
    want = np.asarray(jacobian._hc4_vjp(*(jnp.asarray(np.asarray(x, np.float32)) for x in
                                          (Rp, cot, p.w_onorm, p.w_odown, p.w_oup)), jnp.float32(p.eps)))
    assert got.shape == (rows, m, 4, 64)
    if rows == 64:
        assert np.array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.max(np.abs(want)))
    # the rows filling the rest of the bucket change no bit of the real ones
    more = jacobian.head_vjp_jax(tail, np.concatenate([Rp, rng.standard_normal((2, 4, 64))]),
                                 np.concatenate([cot, rng.standard_normal((2, m, 64))]))
    if rows + 2 <= 64:
        assert np.array_equal(more[:rows], got)


def test_linearize_chunks_compile_once():
    """The second VJP call at another row count in the same bucket compiles nothing."""
    from exactedit.solvers.l47 import jacobian

    tail = _hc4_tail(n=80, seed=3)             # a width no other test uses
    rng = np.random.default_rng(0)
    jacobian.head_vjp_jax(tail, rng.standard_normal((64, 4, 80)), rng.standard_normal((64, 5, 80)))
    with CompileCounter() as c:
        jacobian.head_vjp_jax(tail, rng.standard_normal((17, 4, 80)), rng.standard_normal((17, 5, 80)))
    assert c.compiles == 0, c.to_dict()
