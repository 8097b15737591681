"""The device vocab pass (solvers/tail/passes/device_pass.py) against the numpy pass and float64 references.

One table of pass cases, each run through `vocab_pass_jax` (exact mode) and `stream.vocab_pass` on
the same Q6_K / Q8_0 / BF16-runtime / float head. Tolerances, with u = 2^-24:
  logits: both are float32 products of length n, each within gamma_n |mix|.|W| of the float64
    value, so they differ by at most 2 gamma_n |mix|.|W| (+ 4u |l| under a softcap's tanh);
  LSE / LSE_rest: a softmax-weighted mean of logit errors plus the float32 exp of each term
    (relative 2u) and the float32 per-tile sums (relative (tile + 2) u): bounded below by TOL_LSE;
  argmax / top-k ids: identical wherever the float64 gap to the next candidate exceeds the logit
    bound (ties at that resolution may resolve either way; exact ties are tested separately).
The device is the CPU unless EXACTEDIT_TEST_DEVICE names another ("gpu" runs this table there).
"""
from __future__ import annotations

import os

import jax
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from exactedit import quant
from exactedit.bench.head import synthetic_q6k
from exactedit.solvers.tail.forward import device as devmod
from exactedit.solvers.tail.forward.head_ref import logits_ref
from exactedit.solvers.tail.passes.vocab_pass import ArrayRows, QuantRows, vocab_pass
from exactedit.solvers.tail.passes.device_pass import (device_tile, fold_lse, padded_rows, to_device, topk_rows,
    vocab_pass_jax)
from exactedit.solvers.tail.passes.kl_pass_jax import kl_pass_jax, measure_precision

DEVICE = devmod.select(os.environ.get("EXACTEDIT_TEST_DEVICE", "cpu"))
U = 2.0 ** -24


def gamma(k: int) -> float:
    return k * U / (1 - k * U)


def _head(qtype: str, V: int, n: int, seed: int):
    """(RowSource, float64 view [V, n]) of a random head stored as qtype."""
    rng = np.random.default_rng(seed)
    if qtype == "Q6_K":
        raw = synthetic_q6k(V, n, seed)
        src = QuantRows(lambda a, b: raw[a:b], "Q6_K", V, n)
    elif qtype == "BF16-runtime":  # the engine multiplies with the Q8_0 copy of BF16 values
        raw = quant.quantize(rng.standard_normal((V, n)).astype(np.float32) * 0.05, "BF16")
        src = QuantRows(lambda a, b: raw[a:b], "BF16", V, n, runtime=True)
    elif qtype == "Q8_0":
        raw = quant.quantize(rng.standard_normal((V, n)).astype(np.float32) * 0.05, "Q8_0")
        src = QuantRows(lambda a, b: raw[a:b], "Q8_0", V, n)
    else:
        src = ArrayRows(rng.standard_normal((V, n)).astype(np.float32) * 0.05)
    return src, src.read(0, V).astype(np.float64)


# name: (head type, V, n, T, tile_rows, topk, softcap, exclude, duplicated rows)
CASES = {
    "q6k_tiles": ("Q6_K", 1000, 512, 9, 256, 5, None, [3, 999, 500, 500], False),
    "q6k_slid_last": ("Q6_K", 1000, 256, 4, 300, 17, None, [0], False),
    "q6k_one_tile": ("Q6_K", 700, 256, 3, 8192, 3, 30.0, None, False),
    "q6k_ties": ("Q6_K", 640, 256, 5, 128, 9, None, [1, 2], True),
    "q8_0": ("Q8_0", 500, 64, 6, 128, 4, None, None, False),
    "bf16_runtime": ("BF16-runtime", 333, 96, 2, 100, 2, 15.0, [332], False),
    "float": ("F32", 257, 48, 7, 64, 0, None, [5], False),
    "topk_above_tile": ("F32", 90, 32, 3, 8, 20, None, None, False),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    qtype, V, n, T, tile_rows, topk, softcap, exclude, dup = CASES[request.param]
    src, W = _head(qtype, V, n, seed=list(CASES).index(request.param))
    rng = np.random.default_rng(7)
    if dup:  # exact ties: whole head rows repeated (same bytes, so bitwise equal logits)
        raw = src.read_raw(0, V).copy()
        raw[rng.integers(0, V, V // 3)] = raw[17]
        src = QuantRows(lambda a, b: raw[a:b], src.qtype, V, n)
        W = src.read(0, V).astype(np.float64)
    mix = (rng.standard_normal((T, n)) * 2.0).astype(np.float32)
    ids = np.stack([rng.permutation(np.r_[0, V - 1, -1, V, np.arange(1, 9)])[:6] for _ in range(T)])
    kw = dict(token_sets=ids, topk=topk, tile_rows=tile_rows, softcap=softcap, exclude=exclude)
    seen, ticks = [], []
    got = vocab_pass_jax(mix, to_device(src, DEVICE), sink=lambda a, b, t: seen.append((a, b, t)),
                         progress=lambda d, t: ticks.append((d, t)), **kw)
    want = vocab_pass(mix, src, **kw)
    ref = logits_ref(mix, W, softcap)
    err = 2 * gamma(n) * (np.abs(mix.astype(np.float64)) @ np.abs(W).T) + 4 * U * np.abs(ref)
    return dict(got=got, want=want, ref=ref, err=err, seen=seen, ticks=ticks, V=V, ids=ids, exclude=exclude,
                topk=topk, tile=device_tile(padded_rows(T), V, tile_rows))


def _lse(x):
    m = x.max(axis=1)
    return m + np.log(np.exp(x - m[:, None]).sum(axis=1))


def test_tiles_cover_the_head_once_in_order(case):
    V, tile = case["V"], case["tile"]
    assert [(a, b) for a, b, _ in case["seen"]] == [(a, min(a + tile, V)) for a in range(0, V, tile)]
    full = np.concatenate([t for *_, t in case["seen"]], axis=1)
    assert full.shape == case["ref"].shape and full.dtype == np.float32
    assert np.all(np.abs(full - case["ref"]) <= case["err"])
    done = [d for d, _ in case["ticks"]]
    assert done == sorted(done) and case["ticks"][-1] == (V, V)


def test_lse_and_lse_rest(case):
    got, want, ref = case["got"], case["want"], case["ref"]
    tol = case["err"].max(axis=1) + (case["tile"] + 8) * U * (1 + np.abs(want.lse))
    assert np.all(np.abs(got.lse - _lse(ref)) <= tol)
    assert np.all(np.abs(got.lse - want.lse) <= 2 * tol)
    if case["exclude"] is None:
        assert got.lse_rest is None and want.lse_rest is None
    else:
        keep = np.setdiff1d(np.arange(case["V"]), case["exclude"])
        assert np.all(np.abs(got.lse_rest - _lse(ref[:, keep])) <= tol)


def test_argmax_max_and_selected(case):
    got, want, ref, err = case["got"], case["want"], case["ref"], case["err"]
    rows = np.arange(ref.shape[0])
    top2 = np.sort(ref, axis=1)[:, -2:] if ref.shape[1] > 1 else np.hstack([ref - 1e9, ref])
    clear = top2[:, 1] - top2[:, 0] > 2 * err.max(axis=1)
    np.testing.assert_array_equal(got.argmax[clear], want.argmax[clear])
    assert np.all(np.abs(got.max_logit - ref.max(axis=1)) <= err.max(axis=1))
    assert np.all(np.abs(ref[rows, got.argmax] - ref.max(axis=1)) <= 2 * err.max(axis=1))
    ids = case["ids"]
    inside = (ids >= 0) & (ids < case["V"])
    assert np.all(np.isnan(got.selected[~inside]))
    r, c = np.nonzero(inside)
    assert np.all(np.abs(got.selected[r, c] - ref[r, ids[r, c]]) <= err[r, ids[r, c]])


def test_topk(case):
    got, want, ref, err = case["got"], case["want"], case["ref"], case["err"]
    k = min(case["topk"], case["V"])
    assert got.topk_ids.shape == want.topk_ids.shape == (ref.shape[0], k)
    if not k:
        return
    srt = -np.sort(-ref, axis=1)
    gaps = np.abs(np.diff(srt[:, :min(k + 1, ref.shape[1])], axis=1)).min(axis=1)
    clear = gaps > 2 * err.max(axis=1)
    np.testing.assert_array_equal(got.topk_ids[clear], want.topk_ids[clear])
    rows = np.arange(ref.shape[0])[:, None]
    assert np.all(np.abs(ref[rows, got.topk_ids] - srt[:, :k]) <= 2 * err.max(axis=1, keepdims=True))
    assert np.all(np.diff(got.topk_logits, axis=1) <= 0)
    assert all(len(set(r)) == k for r in got.topk_ids.tolist())


def test_exact_ties_go_to_the_lower_id():
    """Repeated head rows give bitwise-equal logits: argmax and top-k take the lower id first,
    across tiles and inside the two-stage top-k, as the numpy pass does."""
    src, _ = _head("Q6_K", 1024, 256, seed=3)
    raw = src.read_raw(0, 1024).copy()
    raw[[40, 300, 301, 700, 1023]] = raw[5]
    src = QuantRows(lambda a, b: raw[a:b], "Q6_K", 1024, 256)
    mix = np.random.default_rng(2).standard_normal((6, 256)).astype(np.float32)
    mix[:3] = src.read(5, 6) * 50  # these rows' best logit is the repeated row's
    got = vocab_pass_jax(mix, to_device(src, DEVICE), topk=8, tile_rows=256)
    want = vocab_pass(mix, src, topk=8, tile_rows=256)
    np.testing.assert_array_equal(got.argmax[:3], 5)
    np.testing.assert_array_equal(got.topk_ids[:3, :6], [[5, 40, 300, 301, 700, 1023]] * 3)
    np.testing.assert_array_equal(got.topk_ids, want.topk_ids)
    on_device = vocab_pass_jax(jax.device_put(mix, DEVICE), to_device(src, DEVICE), topk=8, tile_rows=256)
    for a, b in zip(on_device, got):  # activations already on the device: the same pass
        np.testing.assert_array_equal(a, b)


@settings(max_examples=15, deadline=None)
@given(data=st.data())
@example(data=None)
def test_topk_rows_matches_numpy_order(data):
    """Two-stage top-k == lexsort by (-value, column) on rows with many exact ties."""
    if data is None:
        x, k = np.zeros((2, 128), np.float32), 5
    else:
        T, L = data.draw(st.integers(1, 4)), 32 * data.draw(st.integers(1, 8))
        k = data.draw(st.integers(1, min(L, 12)))
        seed = data.draw(st.integers(0, 2**32 - 1))
        x = np.random.default_rng(seed).integers(-3, 4, (T, L)).astype(np.float32)
    vals, idx = (np.asarray(a) for a in jax.jit(topk_rows, static_argnums=1)(jax.device_put(x, DEVICE), k))
    order = np.lexsort((np.broadcast_to(np.arange(x.shape[1]), x.shape), -x), axis=1)[:, :k]
    np.testing.assert_array_equal(idx, order)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, order, axis=1))


def test_padded_rows_and_tiles():
    assert [padded_rows(t) for t in (1, 8, 9, 1000, 1024, 1025, 17352)] == [8, 8, 16, 1024, 1024, 2048, 17408]
    assert device_tile(17408, 248320, 8192) == 8192
    assert device_tile(1 << 20, 248320, 8192) == 256      # the logits tile stays <= 2^28 floats
    assert device_tile(4, 90, 8192) == 90


def test_fold_lse_matches_whole_row():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 300)) * 30
    x[0, :150] = -np.inf
    x[1] = -np.inf
    parts = np.split(x, [100, 150, 290], axis=1)
    mx = np.stack([p.max(axis=1) for p in parts])
    shift = np.where(np.isfinite(mx), mx, 0)
    sm = np.stack([np.exp(p - s[:, None]).sum(axis=1) for p, s in zip(parts, shift)])
    with np.errstate(divide="ignore"):
        got = fold_lse(mx.astype(np.float32), sm.astype(np.float32))
    assert got[1] == -np.inf
    np.testing.assert_allclose(got[[0, 2, 3, 4]], _lse(x[[0, 2, 3, 4]]), rtol=1e-6)


def _round_tf32_np(x):
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0xFFF + ((b >> 13) & 1)) & 0xFFFFE000).astype(np.uint32)
    return b.view(np.float32)


def _round_bf16_np(x):
    return quant.dequantize(quant.quantize(x, "BF16"), "BF16", x.shape[1])


@pytest.mark.parametrize("precision,round_np", [("tf32", _round_tf32_np), ("bf16", _round_bf16_np)])
def test_fast_modes_are_their_rounded_operands(precision, round_np):
    """tf32 / bf16 mode == the float64 product of the operands rounded to that format (to float32
    accumulation), and measure_precision's KL == the float64 KL between exact and that product."""
    src, W = _head("Q6_K", 768, 256, seed=11)
    mix = np.random.default_rng(4).standard_normal((6, 256)).astype(np.float32)
    rows = to_device(src, DEVICE)
    got = vocab_pass_jax(mix, rows, tile_rows=256, precision=precision)
    fast = round_np(mix).astype(np.float64) @ round_np(W.astype(np.float32)).astype(np.float64).T
    exact = logits_ref(mix, W)
    bound = 2 * gamma(256) * (np.abs(mix.astype(np.float64)) @ np.abs(W).T).max(axis=1)
    assert np.all(np.abs(got.lse - _lse(fast)) <= bound + 300 * U * np.abs(_lse(fast)))
    # the mode's rounding, not exact mode's: the pass sits far closer to the rounded product
    # (float32 accumulation, ~sqrt(n) u |l|) than the two modes are from each other (~1e-3 here)
    assert np.max(np.abs(got.lse - _lse(fast))) < 0.1 * np.min(np.abs(_lse(fast) - _lse(exact)))
    rep = measure_precision(mix, rows, precision, tile_rows=256)
    lp, lq = exact - _lse(exact)[:, None], fast - _lse(fast)[:, None]
    kl = np.sum(np.exp(lp) * (lp - lq), axis=1)
    assert rep.rows == 6 and rep.kl.shape == (6,)
    np.testing.assert_allclose(rep.kl, kl, rtol=0.05, atol=1e-9)
    assert rep.max_kl == pytest.approx(kl.max(), rel=0.05)
    assert rep.top1_agree == np.mean(np.argmax(exact, 1) == np.argmax(fast, 1))


def test_exact_mode_kl_is_zero():
    src, _ = _head("Q8_0", 200, 64, seed=1)
    mix = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    rep = measure_precision(mix, to_device(src, DEVICE), "exact", tile_rows=64)
    assert rep.max_kl == 0.0 and rep.top1_agree == 1.0 and rep.max_abs_dlse == 0.0


def test_to_device_keeps_bytes_and_types():
    src, _ = _head("Q6_K", 40, 256, seed=0)
    rows = to_device(src, DEVICE)
    assert rows.qtype == "Q6_K" and rows.raw.shape == (40, 210) and rows.nbytes == 40 * 210
    np.testing.assert_array_equal(np.asarray(rows.raw), src.read_raw(0, 40))
    bf, W = _head("BF16-runtime", 10, 64, seed=0)
    rb = to_device(bf, DEVICE)
    assert rb.qtype == "Q8_0"  # the runtime copy, as the engine holds it
    np.testing.assert_array_equal(quant.dequantize(np.asarray(rb.raw), "Q8_0", 64), W.astype(np.float32))
    fl, W = _head("F32", 10, 8, seed=0)
    assert to_device(fl, DEVICE).qtype == "F32"


def test_bad_arguments():
    src, _ = _head("F32", 10, 8, seed=0)
    rows = to_device(src, DEVICE)
    with pytest.raises(ValueError, match=r"mix must be \[T, 8\]"):
        vocab_pass_jax(np.zeros((2, 9), np.float32), rows)
    with pytest.raises(ValueError, match="tile_rows"):
        vocab_pass_jax(np.zeros((2, 8), np.float32), rows, tile_rows=0)
    with pytest.raises(ValueError, match="token_sets"):
        vocab_pass_jax(np.zeros((2, 8), np.float32), rows, token_sets=np.zeros((3, 2), int))


# ---- solvers/tail/forward/device.py ------------------------------------------------------------------------------

def test_device_config_validates():
    assert devmod.DeviceConfig() == devmod.DeviceConfig("auto", "exact")
    with pytest.raises(ValueError, match="device must be one of cpu, gpu, auto"):
        devmod.DeviceConfig(device="tpu")
    with pytest.raises(ValueError, match="precision must be one of exact, tf32, bf16"):
        devmod.DeviceConfig(precision="fp8")


def test_select_and_scope():
    cpu = devmod.select("cpu")
    assert cpu.platform == "cpu"
    auto = devmod.select("auto")
    if devmod.gpu_devices():
        assert devmod.is_gpu(auto) and devmod.is_gpu(devmod.select("gpu"))
    else:
        assert auto == cpu
        with pytest.raises(devmod.DeviceError, match="--device gpu: JAX sees no CUDA device"):
            devmod.select("gpu")
    with pytest.raises(devmod.DeviceError, match="expected one of cpu, gpu, auto"):
        devmod.select("npu")
    with devmod.scope(devmod.DeviceConfig("cpu", "exact")) as dev:
        y = jax.numpy.ones(3) * 2
        assert dev == cpu and y.devices() == {cpu}
        assert jax.config.jax_default_matmul_precision == "highest"
    assert devmod.describe(cpu)["platform"] == "cpu"


def test_round_tf32_to_nearest_even():
    x = np.array([1 + 2**-11, 1 + 2**-10 + 2**-11, 1 + 2**-11 + 2**-20, -3.0, np.inf, np.nan,
                  np.finfo(np.float32).max], np.float32)
    got = np.asarray(devmod.round_tf32(jax.numpy.asarray(x)))
    np.testing.assert_array_equal(got[:4], np.array([1, 1 + 2**-9, 1 + 2**-10, -3.0], np.float32))
    assert got[4] == np.inf and np.isnan(got[5]) and got[6] == np.inf
    np.testing.assert_array_equal(got[:4], _round_tf32_np(x[:4]))
