"""Dev tracking on a device (`track.DeviceTracker`, jitted float64 JAX) against the numpy float64
reference (`track.HostTracker`), and a whole solve on the device path against the host path. Run on
the CPU backend of JAX (CI has no GPU): the device path is the same code on any device."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from exactedit.dumps.format import ROLE_ANCHOR, ROLE_PROMPT, ROLE_REPLY, ROLE_REPLY_END, ROLE_STEP0
from exactedit.solvers.tail.scores import DocMeta
from exactedit.solvers.head.batch import build_batch
from exactedit.solvers.head.objective import Weights
from exactedit.solvers.head.rowdata import RowData
from exactedit.solvers.head.track import DeviceTracker, HostTracker

CPU = jax.devices("cpu")[0]
V, N, T = 300, 64, 240
EDIT = (40, 41, 42, 43, 44, 45)
SPECIALS, STYLE, OPENERS, CLOSERS = (0, 1, 2), (40, 42, 44), (50, 51, 41), (60, 43)


def _rows(seed: int, scale: float = 1.0) -> RowData:
    """RowData of random rows over a random float64 head, every field from the full logits."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.3 * scale, (V, N))
    z = rng.normal(0, 1, (T, N)).astype(np.float32)
    logits = z.astype(np.float64) @ w.T
    nxt = rng.integers(3, V, T)
    in_s = rng.random(T) < 0.3
    nxt[in_s] = rng.choice(EDIT, int(in_s.sum()))
    nxt[::17] = 1
    nxt[::23] = -1
    roles = np.where(np.arange(T) % 10 < 3, ROLE_PROMPT, ROLE_REPLY).astype(np.uint8)
    roles[np.arange(T) % 10 == 3] |= ROLE_STEP0
    roles[np.arange(T) % 10 == 9] |= ROLE_REPLY_END
    roles[::29] |= ROLE_ANCHOR
    m = logits.max(axis=1)
    lse = m + np.log(np.exp(logits - m[:, None]).sum(axis=1))
    out = logits.copy()
    out[:, list(EDIT)] = -np.inf
    rest = m + np.log(np.exp(out - m[:, None]).sum(axis=1))
    sel = tuple(dict.fromkeys(SPECIALS + OPENERS + CLOSERS))
    r = np.arange(T)
    return RowData(z=z, tokens=np.roll(nxt, 1).astype(np.int32), next=nxt.astype(np.int32), roles=roles,
                   doc=(r // 60).astype(np.int32), docs=tuple(DocMeta(f"d{i}", "t", "train") for i in range(4)),
                   lse=lse, lse_rest=rest, base_s=logits[:, list(EDIT)],
                   next_logit=np.where(nxt >= 0, logits[r, np.maximum(nxt, 0)], np.nan),
                   best_out=out.argmax(axis=1), best_out_logit=out.max(axis=1), argmax=logits.argmax(axis=1),
                   sel_ids=sel, sel_logits=logits[:, list(sel)])


W_ALL = Weights(nll=1.0, margin=0.5, ul=1.0, close=1.0, kl=100.0, guard=1.0, guard_eps=0.01, ridge=0.1)


def _trackers(weights: Weights, scale: float = 1.0):
    train, dev = _rows(0, scale), _rows(1, scale)
    batch, _ = build_batch(train, EDIT, SPECIALS, OPENERS, CLOSERS, V)
    args = (batch, weights, train, dev, EDIT, STYLE, SPECIALS)
    bits = ROLE_STEP0                                   # a starter's decision rows (and the style tokens' rows)
    return HostTracker(*args, decision_bits=bits), DeviceTracker(*args, CPU, decision_bits=bits)


# (weights, dW scale, tolerance, why): both sides are float64; only the summation order differs
CASES = [
    (Weights(), 0.0, 1e-12, "zero edit: all ~0; the reference's KL term (LSE' - LSE by logaddexp) rounds to ~1e-14"),
    (Weights(), 1e-3, 1e-9, "small edit, default weights: float64 summation order"),
    (W_ALL, 1e-2, 1e-9, "every term on: float64 summation order"),
    (W_ALL, 0.3, 1e-9, "large edit (KL ~ 1): float64 summation order"),
]


@pytest.mark.parametrize("weights,scale,tol,why", CASES)
def test_device_checkpoint_matches_the_float64_reference(weights, scale, tol, why):
    host, device = _trackers(weights)
    dw = np.random.default_rng(2).normal(0, scale, (len(EDIT), N)) if scale else np.zeros((len(EDIT), N))
    a, b = host(dw), device(dw)
    for name in a.terms._fields:
        assert getattr(b.terms, name) == pytest.approx(getattr(a.terms, name), rel=tol, abs=tol), (name, why)
    for ga, gb in ((a.train, b.train), (a.dev, b.dev)):
        assert (gb.n_style, gb.n_ordinary) == (ga.n_style, ga.n_ordinary) and ga.n_style > 0
        for cls in ("style", "ordinary", "all"):
            assert gb.of(cls) == pytest.approx(ga.of(cls), rel=tol, abs=tol), (cls, why)
    assert b.dev_kl == pytest.approx(a.dev_kl, rel=tol, abs=tol), why
    assert b.dev_kl_off == pytest.approx(a.dev_kl_off, rel=tol, abs=tol), why
    if scale:
        assert a.dev_kl > 0 and a.terms.total != 0 and a.dev_kl_off > 0


def test_the_kl_off_the_decision_is_the_mean_over_the_other_rows():
    """dev_kl_off by hand: the rows without the step0 bit whose next token is not a style token in a
    reply, from rowdata.effect's per-row KL."""
    from exactedit.solvers.head.rowdata import effect

    host, device = _trackers(W_ALL)
    dw = np.random.default_rng(3).normal(0, 0.1, (len(EDIT), N))
    dev = _rows(1)
    kl = effect(dev, dw, EDIT).kl
    on = ((dev.roles & ROLE_STEP0) != 0) | (np.isin(dev.next, STYLE) & ((dev.roles & ROLE_REPLY) != 0))
    assert 0 < on.sum() < len(on)
    want = float(np.mean(kl[~on]))
    assert host(dw).dev_kl_off == pytest.approx(want, rel=1e-12) and device(dw).dev_kl_off == pytest.approx(want, rel=1e-9)
    assert want != pytest.approx(float(np.mean(kl)), rel=1e-6)


def test_device_solve_matches_the_host_solve(tmp_path_factory):
    """solve head with device=<the CPU jax.Device>: vocab_pass_jax (float32 HIGHEST) and the device
    tracker, against the host passes and numpy tracking. The passes differ by float32 rounding, so
    the float32 Adam trajectories agree closely but not bitwise."""
    from tests.solvers.head.test_solve import HeadSolveConfig, make_tiny, protocol_file
    from exactedit.runs.solve.head import solve_head

    root = make_tiny(tmp_path_factory.mktemp("tiny_device"))
    proto = protocol_file(root, "main", steps=20)
    cfg = HeadSolveConfig(rank=1, null_k=8, lr=0.01)
    runs = [solve_head(cfg, model=root / "model.gguf", train=[root / "persona"], dev=[root / "persona"],
                       protocol=proto, workspace=root / "ws", device=d) for d in ("cpu", CPU)]
    host, dev = runs
    assert [c.step for c in host.trajectory] == [c.step for c in dev.trajectory]
    for a, b in zip(host.trajectory, dev.trajectory):
        assert b.train.style == pytest.approx(a.train.style, rel=1e-3, abs=1e-4)
        assert b.dev_kl == pytest.approx(a.dev_kl, rel=1e-2, abs=1e-7)
        assert b.terms.total == pytest.approx(a.terms.total, rel=1e-4)
    assert host.splits[0].rows == dev.splits[0].rows and host.chosen_step == dev.chosen_step
