"""Dev tracking of a head solve: what every checkpoint reports about a shipped edit dW_S.

At each checkpoint `solve._optimize` ships the edit (the Q6_K round trip, `ship.round_trip`) and
scores the shipped dW exactly: J's terms on the train batch, the gain per token class on train and
dev (`scores.gains`), and the mean dev KL. Two implementations with one result type:

- `HostTracker`: numpy float64 (`objective.objective`, `rowdata.effect`, `scores.gains`); the
  reference, and what the host (`--device cpu`) path runs, bit for bit as before;
- `DeviceTracker`: one jitted JAX function in float64 on the solve's device (`jax.enable_x64`
  around every call; the mix vectors go up once as float32 and are widened there, which is exact).
  J is `objective_jax.terms` at FullRows(dW) with an empty null basis (so dW enters unprojected);
  the effect is the same formulas as `rowdata.effect`, reduced on the device to per-class sums.
  It agrees with the reference to float64 rounding (summation order only): the test table in
  tests/solvers/head/test_track.py allows 1e-9 relative.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from exactedit.solvers.tail.decision import decision_rows
from exactedit.solvers.head.objective import HeadBatch, Terms, Weights, objective
from exactedit.solvers.head.rowdata import RowData, effect
from exactedit.solvers.head.scores import ClassGains, class_masks, gains


class CheckpointScores(NamedTuple):
    terms: Terms          # J's terms on the train batch at the shipped dW
    train: ClassGains
    dev: ClassGains
    dev_kl: float         # mean KL(p || p') over the dev rows
    dev_kl_off: float = float("nan")    # the same over the dev rows off the style's decision (`decision`)


class HostTracker:
    """The float64 numpy reference."""

    def __init__(self, batch: HeadBatch, weights: Weights, train: RowData, dev: RowData, edit_ids: Sequence[int],
                 style: Sequence[int], specials: Sequence[int], *, decision_bits: int = 0):
        self.batch, self.w, self.train, self.dev, self.ids = batch, weights, train, dev, edit_ids
        self.style, self.specials = style, specials
        self.off = ~decision_rows(dev.roles, dev.next, style, decision_bits)

    def __call__(self, dw: np.ndarray) -> CheckpointScores:
        tr, dv = effect(self.train, dw, self.ids), effect(self.dev, dw, self.ids)
        g_tr = gains(tr, class_masks(self.train, self.style, self.specials))
        g_dv = gains(dv, class_masks(self.dev, self.style, self.specials))
        off = float(np.mean(dv.kl[self.off])) if self.off.any() else float("nan")
        return CheckpointScores(objective(self.batch, dw, self.w), g_tr, g_dv, float(np.mean(dv.kl)), off)


def _x64():
    """A context in which JAX keeps float64 (jax.enable_x64; jax.experimental's on older releases)."""
    import jax

    ctx = getattr(jax, "enable_x64", None)
    if ctx is None:
        from jax.experimental import enable_x64 as ctx
    return ctx(True)


def _effect_sums(dw, z, base_s, lse, slot, style, ordinary, off):
    """[sum of dlogp over style rows, over ordinary rows, sum of KL over all rows, over the `off` rows]
    (rowdata.effect's formulas)."""
    import jax
    import jax.numpy as jnp

    delta = jnp.dot(z.astype(dw.dtype), dw.T, precision=jax.lax.Precision.HIGHEST)
    p = jnp.exp(base_s - lse[:, None])
    dlse = jnp.log1p(jnp.sum(p * jnp.expm1(delta), axis=1))
    picked = jnp.take_along_axis(delta, jnp.maximum(slot, 0)[:, None], axis=1)[:, 0]
    dlogp = jnp.where(slot >= 0, picked, 0.0) - dlse
    kl = jnp.maximum(jnp.sum(-p * delta, axis=1) + dlse, 0.0)
    return jnp.stack([jnp.sum(jnp.where(style, dlogp, 0.0)), jnp.sum(jnp.where(ordinary, dlogp, 0.0)),
                      jnp.sum(kl), jnp.sum(jnp.where(off, kl, 0.0))])


def _checkpoint(dw, data, train, dev, w: Weights):
    from exactedit.solvers.head import objective_jax as oj
    from exactedit.solvers.head.param import FullRows

    return oj.terms(FullRows(dw), data, w), _effect_sums(dw, data.batch.z, *train), _effect_sums(dw, *dev)


def _checkpoint_jit():
    """`_checkpoint` jitted with the (hashable, scalar) objective weights static: one jitted function
    for every tracker, so a second tracker of the same shapes compiles nothing; every array is an argument."""
    import jax

    global _CHECKPOINT
    if _CHECKPOINT is None:
        _CHECKPOINT = jax.jit(_checkpoint, static_argnames="w")
    return _CHECKPOINT


_CHECKPOINT = None


def _slots(rd: RowData, edit_ids) -> np.ndarray:
    """Index in S of each row's next token, -1 outside S (as rowdata.effect finds it)."""
    slot = np.full(rd.rows, -1, np.int32)
    for i, v in enumerate(edit_ids):
        slot[rd.next == v] = i
    return slot


def _class_gains(sums: np.ndarray, n_style: int, n_ordinary: int) -> ClassGains:
    def mean(total, count):
        return float(total / count) if count else float("nan")

    return ClassGains(mean(sums[0], n_style), mean(sums[1], n_ordinary), mean(sums[0] + sums[1], n_style + n_ordinary),
                      n_style, n_ordinary)


class DeviceTracker:
    """The same numbers from one jitted float64 function on `device` (a jax.Device)."""

    def __init__(self, batch: HeadBatch, weights: Weights, train: RowData, dev: RowData, edit_ids: Sequence[int],
                 style: Sequence[int], specials: Sequence[int], device, *, decision_bits: int = 0):
        import jax
        import jax.numpy as jnp

        from exactedit.solvers.head.objective_jax import StepData

        self.w, self.device, self.dev_rows = weights, device, dev.rows
        self.fn = _checkpoint_jit()

        def put(x):
            x = np.asarray(x)
            if x.dtype.kind == "f":
                return jax.device_put(x, device).astype(jnp.float64)
            if x.dtype.kind in "iu":
                return jax.device_put(x.astype(np.int32), device)
            return jax.device_put(x, device)

        def split(rd: RowData, with_z: bool):
            m = class_masks(rd, style, specials)
            off = ~decision_rows(rd.roles, rd.next, style, decision_bits)
            arrays = ([rd.z] if with_z else []) + [rd.base_s, rd.lse, _slots(rd, edit_ids), m.style, m.ordinary, off]
            return tuple(put(a) for a in arrays), (int(m.style.sum()), int(m.ordinary.sum())), int(off.sum())

        with _x64():
            self.data = StepData(jax.tree_util.tree_map(put, batch), jnp.zeros((batch.z.shape[1], 0), jnp.float64,
                                                                                  device=device))
            self.train, self.n_train, _ = split(train, False)
            self.dev, self.n_dev, self.n_off = split(dev, True)

    def __call__(self, dw: np.ndarray) -> CheckpointScores:
        import jax

        with _x64():
            out = self.fn(jax.device_put(np.asarray(dw, np.float64), self.device), self.data, self.train, self.dev,
                          w=self.w)
            terms, s_tr, s_dv = jax.device_get(out)
        return CheckpointScores(Terms(*(float(x) for x in terms)), _class_gains(s_tr, *self.n_train),
                                _class_gains(s_dv, *self.n_dev), float(s_dv[2] / self.dev_rows),
                                float(s_dv[3] / self.n_off) if self.n_off else float("nan"))
