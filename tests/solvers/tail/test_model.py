"""Loading a tail from a GGUF (hc4 and rmsnorm, tied, post-FFN norm), decoding its token table,
and `write_logits` end to end against the float64 reference on the same dequantized weights."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from exactedit import quant
from exactedit.dumps import DocInfo, write_dump
from exactedit.quant import gguf
from exactedit.errors import ExacteditError, GGUFFormatError
from exactedit.quant.gguf.write import MetaValue, TensorData, synthetic_model, write_gguf
from exactedit.solvers.tail.forward.head_ref import Hc4Head, RmsnormHead, hc4_mix_ref, logits_ref, rmsnorm_mix_ref
from exactedit.solvers.tail.forward.last_layer_ref import Hc4L47, RmsnormL47, hc4_l47_ref, rmsnorm_l47_ref
from exactedit.solvers.tail.logits import parse_rows, write_logits
from exactedit.solvers.tail.model import _BYTE_DECODER, TokenTable, load_tail

U32 = 2.0 ** -24


@pytest.fixture(scope="module")
def hc4_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("hc4") / "m.gguf"
    synthetic_model(path, tail="hc4", vocab=300, n=256, h=32, d_lo=32, layers=3, seed=1)
    return path


@pytest.fixture(scope="module")
def rms_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("rms") / "m.gguf"
    synthetic_model(path, tail="rmsnorm", vocab=200, n=256, h=32, layers=2, seed=2)
    return path


def test_hc4_tail_weights_are_runtime_views(hc4_path):
    with gguf.open(hc4_path) as g:
        tail = load_tail(g)
        assert tail.kind == "hc4" and tail.spec.layer == 2 and tail.head.rows == 300
        down = g.read_rows("output_hc_down.weight")  # bf16 values, 40 rows of which 32 are read
        np.testing.assert_array_equal(tail.mix_params.w_odown, quant.runtime_q8_0(down[:32]))
        np.testing.assert_array_equal(tail.mix_params.w_oup,
                                      quant.runtime_q8_0(g.read_rows("output_hc_up.weight")))
        np.testing.assert_array_equal(tail.l47.w_sd, g.read_rows("blk.2.ffn_down_shexp.weight"))
        np.testing.assert_array_equal(tail.head.read(10, 20), g.read_rows("output.weight", 10, 20))
        assert tail.dump_expect().streams == 4 and tail.dump_expect().layer == 2


def test_rmsnorm_tail_and_tied_head(tmp_path, rms_path):
    with gguf.open(rms_path) as g:
        tail = load_tail(g)
        assert tail.kind == "rmsnorm" and tail.spec.layer == 1 and tail.l47.w_post is None
        assert tail.mix_params.eps == pytest.approx(1e-5)
        np.testing.assert_array_equal(tail.head.read(0, 5), g.read_rows("output.weight", 0, 5))
    tied = tmp_path / "tied.gguf"
    synthetic_model(tied, tail="rmsnorm", vocab=50, n=256, h=32, tied=True)
    with gguf.open(tied) as g:
        tail = load_tail(g)
        assert tail.spec.tied
        np.testing.assert_array_equal(tail.head.read(0, 50), g.read_rows("token_embd.weight"))


def _rms_gguf(path, *, post: bool, eps: bool = True, softcap: float | None = None):
    rng = np.random.default_rng(4)
    n, h, V = 32, 8, 40
    meta = {"general.architecture": "gemma2", "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": ["<s>", "</s>", "<0x0A>", "\u2581hello", "\u2581w\u00f6rld", "!"]
                                     + [f"t{i}" for i in range(V - 6)],
            "tokenizer.ggml.token_type": np.array([3, 3, 6, 1, 1, 1] + [1] * (V - 6), np.int32)}
    if eps:
        meta["gemma2.attention.layer_norm_rms_epsilon"] = MetaValue(quant.gguf.GGUFValueType.FLOAT32, 1e-6)
    if softcap is not None:
        meta["gemma2.final_logit_softcapping"] = MetaValue(quant.gguf.GGUFValueType.FLOAT32, softcap)
    tensors = {
        "output_norm.weight": TensorData.from_f32(1 + 0.1 * rng.standard_normal(n)),
        "output.weight": TensorData("Q8_0", (V, n), quant.quantize(rng.standard_normal((V, n)), "Q8_0")),
        "blk.0.ffn_down.weight": TensorData.from_f32(0.1 * rng.standard_normal((n, h))),
    }
    if post:
        tensors["blk.0.post_ffw_norm.weight"] = TensorData.from_f32(rng.standard_normal(n))
    write_gguf(path, meta, tensors)
    return path


def test_post_ffn_norm_softcap_and_spm_tokens(tmp_path):
    path = _rms_gguf(tmp_path / "g.gguf", post=True, softcap=30.0)
    with gguf.open(path) as g:
        tail = load_tail(g)
        np.testing.assert_array_equal(tail.l47.w_post, g.read_rows("blk.0.post_ffw_norm.weight")[0])
        assert tail.softcap == pytest.approx(30.0)
        assert tail.tokens.style == "spm"
        assert tail.tokens.decode([3, 4, 2, 5, 1]) == " hello w\u00f6rld\n!</s>"
        assert list(tail.tokens.special_ids()) == [0, 1]


def test_missing_eps_is_a_clear_error(tmp_path):
    path = _rms_gguf(tmp_path / "noeps.gguf", post=False, eps=False)
    with gguf.open(path) as g, pytest.raises(GGUFFormatError, match="layer_norm_rms_epsilon"):
        load_tail(g)


def test_byte_level_bpe_decode():
    # GPT-2 byte encoding: space -> U+0120, newline -> U+010A; "é" = bytes C3 A9 -> "Ã©"
    table = TokenTable(("\u0120hello", "\u010a", "caf\u00c3\u00a9", "<|im_end|>", "\u00c3"),
                       (1, 1, 1, 3, 1), "bpe")
    assert table.decode([0, 1, 2, 3]) == " hello\ncaf\u00e9<|im_end|>"
    assert table.decode([4]) == "\ufffd"  # a lone lead byte is not text
    assert table.is_special(3) and not table.is_special(0)
    with pytest.raises(IndexError):
        table.decode([5])


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(sorted(_BYTE_DECODER) + [" ", "a", "\u2581", "\u00e9", "\u4e2d", "\x00"]),
               max_size=12))
def test_bpe_token_bytes_against_the_per_character_reference(text):
    """token_bytes's translate-table path gives the bytes of the character-by-character decoder
    (every character one of the 256 byte characters), else the text's UTF-8 (an added token)."""
    table = TokenTable((text,), (1,), "bpe")
    want = bytes(_BYTE_DECODER[c] for c in text) if all(c in _BYTE_DECODER for c in text) else text.encode("utf-8")
    assert table.token_bytes(0) == want


def test_parse_rows():
    assert parse_rows(None, 10) == (0, 10) and parse_rows("2:5", 10) == (2, 5)
    assert parse_rows(":-2", 10) == (0, 8) and parse_rows("7:", 10) == (7, 10)
    for bad in ("5:2", "a:b", "1:2:3", "0:11"):
        with pytest.raises(ExacteditError):
            parse_rows(bad, 10)


def _hc4_dump(path, T=12, n=256, h=32, V=300, seed=0):
    rng = np.random.default_rng(seed)
    fields = {"tokens": rng.integers(0, V, T), "next": np.r_[rng.integers(0, V, T - 1), -1],
              "R": rng.standard_normal((T, 4, n)), "inj": rng.standard_normal((T, 4)),
              "hh": rng.standard_normal((T, h)), "sgv": rng.standard_normal(T),
              "yr": rng.standard_normal((T, n)) * 0.5}
    write_dump(path, arch="hc4", layer=2, fields=fields,
               docs=[DocInfo("d0", 0, T, "test", "none")])
    return fields


def test_write_logits_matches_float64_reference(tmp_path, hc4_path):
    """The issue's acceptance check: `exactedit logits` output reproduced by the numpy reference.

    Tolerance: float32 arithmetic through L47 (length-h products), the hc4 mix (lengths 4n and
    d_lo) and the head (length n); measured errors are ~3e-7 of the logit scale |mix|.|W|, the
    bound used is 1e-5 of it (the first-order per-stage bounds are in the forward tests)."""
    f = _hc4_dump(tmp_path / "dump")
    out = tmp_path / "logits.npy"
    calls = []
    res = write_logits(hc4_path, tmp_path / "dump", out, rows="2:10",
                       tile_rows=64, progress=lambda d, t: calls.append(d))
    got = np.load(out)
    assert got.shape == (8, 300) and got.dtype == np.float32 and calls[-1] == 300
    assert not (tmp_path / "logits.npy.tmp").exists()
    man = json.loads((tmp_path / "logits.npy.manifest.json").read_text())
    assert man["out_sha256"] == res.out_sha256 and man["rows"] == [2, 10]
    with gguf.open(hc4_path) as g:
        rows = slice(2, 10)
        l47 = Hc4L47(g.read_rows("blk.2.ffn_down_shexp.weight"))
        Rp = hc4_l47_ref(f["R"][rows], f["inj"][rows], f["hh"][rows], f["sgv"][rows], f["yr"][rows], l47)
        head = Hc4Head(g.read_rows("output_hc_norm.weight"),
                       quant.runtime_q8_0(g.read_rows("output_hc_down.weight")[:32]),
                       quant.runtime_q8_0(g.read_rows("output_hc_up.weight")))
        mix = hc4_mix_ref(Rp.astype(np.float32).astype(np.float64), head)
        W = g.read_rows("output.weight")
    ref = logits_ref(mix, W)
    scale = np.abs(mix) @ np.abs(W.astype(np.float64)).T
    assert np.all(np.abs(got - ref) <= 1e-5 * scale)
    np.testing.assert_array_equal(res.argmax, got.argmax(axis=1))
    m = ref.max(axis=1)
    np.testing.assert_allclose(res.lse, m + np.log(np.exp(ref - m[:, None]).sum(axis=1)),
                               rtol=0, atol=float(1e-5 * scale.max()))


def test_rmsnorm_end_to_end_with_post_norm_and_softcap(tmp_path):
    path = _rms_gguf(tmp_path / "g.gguf", post=True, softcap=5.0)
    rng = np.random.default_rng(7)
    T, n, h = 6, 32, 8
    R, hh = rng.standard_normal((T, n)), rng.standard_normal((T, h))
    write_dump(tmp_path / "d", arch="rmsnorm", layer=0, docs=[DocInfo("d", 0, T, "s", "c")],
               fields={"tokens": np.zeros(T, int), "next": np.ones(T, int), "R": R, "hh": hh})
    write_logits(path, tmp_path / "d", tmp_path / "o.npy")
    got = np.load(tmp_path / "o.npy")
    with gguf.open(path) as g:
        l47 = RmsnormL47(g.read_rows("blk.0.ffn_down.weight"), g.read_rows("blk.0.post_ffw_norm.weight")[0], 1e-6)
        mix = rmsnorm_mix_ref(rmsnorm_l47_ref(R.astype(np.float32), hh.astype(np.float32), l47),
                              RmsnormHead(g.read_rows("output_norm.weight")[0], 1e-6))
        W = g.read_rows("output.weight")
        ref = logits_ref(mix, W, softcap=5.0)
    scale = np.abs(mix) @ np.abs(W.astype(np.float64)).T  # the softcap's slope is <= 1
    assert np.abs(ref).max() < 5.0 and np.all(np.abs(got - ref) <= 1e-5 * scale)


def test_dump_that_does_not_fit_the_model_is_refused(tmp_path, hc4_path):
    _hc4_dump(tmp_path / "dump", n=128)
    with pytest.raises(ExacteditError):
        write_logits(hc4_path, tmp_path / "dump", tmp_path / "x.npy")
    assert not (tmp_path / "x.npy").exists()
