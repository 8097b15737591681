"""quant.gguf reader and quant.gguf.write writer: round trips, cross-checks against gguf-py, errors."""
from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from exactedit import quant
from exactedit.quant import gguf
from exactedit.errors import GGUFFormatError, QuantError
from exactedit.quant.gguf.write import MetaValue, TensorData, synthetic_model, write_gguf

VT = GGUFValueType

# every scalar type and array element type, with a value that would expose a wrong width or sign
SCALARS = [(VT.UINT8, 250), (VT.INT8, -120), (VT.UINT16, 65000), (VT.INT16, -32000),
           (VT.UINT32, 4_000_000_000), (VT.INT32, -2_000_000_000), (VT.UINT64, 2**63 + 5),
           (VT.INT64, -(2**62)), (VT.FLOAT32, 1.5), (VT.FLOAT64, 1e-300), (VT.BOOL, True)]
ARRAYS = {VT.UINT8: "u1", VT.INT8: "i1", VT.UINT16: "u2", VT.INT16: "i2", VT.UINT32: "u4",
          VT.INT32: "i4", VT.UINT64: "u8", VT.INT64: "i8", VT.FLOAT32: "f4", VT.FLOAT64: "f8"}


def _metadata():
    meta = {f"s.{t.name}": MetaValue(t, v) for t, v in SCALARS}
    for t, dt in ARRAYS.items():
        meta[f"a.{t.name}"] = np.arange(-3, 4).astype(dt) if dt[0] != "u" else np.arange(7, dtype=dt)
    meta.update({"str": "héllo ✓", "empty": "", "a.bool": [True, False, True],
                 "a.str": ["a", "", "日本語", "x" * 300], "a.nested": [[1, 2], ["p", "q"], [[3]]],
                 "tokenizer.ggml.tokens": ["<s>", "Ġthe", "日本", "\n", ""],
                 "tokenizer.ggml.token_type": np.array([3, 1, 1, 6, 1], np.int32)})
    return meta


def _tensors(rng):
    x = rng.standard_normal((6, 256)).astype(np.float32)
    return {"a.f32": TensorData.from_f32(x[:3, :64]),
            "b.q8": TensorData("Q8_0", (6, 256), quant.quantize(x, "Q8_0")),
            "c.q6k": TensorData("Q6_K", (2, 3, 256), quant.quantize(x, "Q6_K")),
            "d.bf16": TensorData("BF16", (6, 256), quant.quantize(x, "BF16")),
            "e.vec": TensorData.from_f32(x[0, :32])}


@pytest.mark.parametrize("version,alignment", [(3, 32), (2, 32), (3, 64), (3, 1)])
def test_round_trip(tmp_path, version, alignment):
    meta, tensors = _metadata(), _tensors(np.random.default_rng(0))
    w = write_gguf(tmp_path / "m.gguf", meta, tensors, alignment=alignment, version=version)
    with gguf.open(w.path) as g:
        assert (g.version, g.alignment, g.data_offset) == (version, alignment, w.data_offset)
        keys = list(meta) if alignment == 32 else list(meta) + ["general.alignment"]
        assert g.metadata_keys() == keys
        for t, v in SCALARS:
            got = g.get(f"s.{t.name}")
            assert got == (np.float32(v) if t == VT.FLOAT32 else v) and type(got) is type(v)
            assert g.metadata_info(f"s.{t.name}").type_name == t.name
        for t in ARRAYS:
            got = g.get(f"a.{t.name}")
            assert got.dtype == np.dtype(ARRAYS[t]) and np.array_equal(got, meta[f"a.{t.name}"])
        assert g.get("str") == "héllo ✓" and g.get("empty") == ""
        assert list(g.get("a.bool")) == [True, False, True]
        assert g.get("a.str") == meta["a.str"]
        nested = g.get("a.nested")
        assert list(nested[0]) == [1, 2] and nested[1] == ["p", "q"] and list(nested[2][0]) == [3]
        assert g.metadata_info("a.str") == gguf.MetadataInfo("a.str", "ARRAY", g.metadata_info("a.str")
                                                             .offset, "STRING", 4)
        assert g.get("missing", 7) == 7
        assert g.tokens() == meta["tokenizer.ggml.tokens"]
        assert g.token_types().dtype == np.int32 and list(g.token_types()) == [3, 1, 1, 6, 1]
        for name, t in tensors.items():
            info = g.tensors[name]
            assert (info.type_name, info.shape, info.offset) == (t.type_name, t.shape, w.offsets[name])
            assert info.offset % alignment == 0 and info.nbytes == t.raw.nbytes
            assert np.array_equal(g.read_raw(name), t.raw)
            assert np.array_equal(g.read_rows(name), quant.dequantize(t.raw, t.type_name, t.shape[-1]))
        assert np.array_equal(g.read_raw("c.q6k", 2, 5), tensors["c.q6k"].raw[2:5])
        assert np.array_equal(g.read_rows("b.q8", 1, 3),
                              quant.dequantize(tensors["b.q8"].raw[1:3], "Q8_0", 256))
        assert not g.read_raw("b.q8").flags.writeable


def test_gguf_py_writer_cross_check(tmp_path):
    """A file written by gguf-py's GGUFWriter reads back the same through our reader."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    q6 = quant.quantize(x, "Q6_K")
    w = GGUFWriter(tmp_path / "ref.gguf", "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_token_list(["a", "bb", "ccc"])
    w.add_token_types([1, 2, 3])
    w.add_tensor("f32.weight", x[:, :32].copy())
    w.add_tensor("q6.weight", q6, raw_dtype=GGMLQuantizationType.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref = GGUFReader(tmp_path / "ref.gguf")
    with gguf.open(tmp_path / "ref.gguf") as g:
        assert g.metadata_keys() == [f.name for f in ref.fields.values() if not f.name.startswith("GGUF.")]
        assert g.get("general.architecture") == "llama" and g.get("llama.block_count") == 2
        assert g.tokens() == ["a", "bb", "ccc"] and list(g.token_types()) == [1, 2, 3]
        g.tokens().append("mutated")            # decoded once, handed out as a copy each call
        assert g.tokens() == ["a", "bb", "ccc"]
        for t in ref.tensors:
            info = g.tensors[t.name]
            assert info.offset == t.data_offset and info.type_name == t.tensor_type.name
            assert info.shape == tuple(int(d) for d in reversed(t.shape))
            assert g.read_raw(t.name).tobytes() == t.data.tobytes()
        assert np.array_equal(g.read_rows("f32.weight"), x[:, :32])
        assert np.array_equal(g.read_raw("q6.weight"), q6)


def test_our_writer_read_by_gguf_py(tmp_path):
    """gguf-py's GGUFReader, an independent parser, agrees with what our writer meant to write."""
    meta, tensors = _metadata(), _tensors(np.random.default_rng(2))
    w = write_gguf(tmp_path / "m.gguf", meta, tensors, alignment=64)
    ref = GGUFReader(w.path)
    assert ref.alignment == 64
    assert ref.fields["tokenizer.ggml.tokens"].contents() == meta["tokenizer.ggml.tokens"]
    assert ref.fields["s.UINT64"].contents() == 2**63 + 5 and ref.fields["str"].contents() == "héllo ✓"
    assert ref.fields["a.str"].contents() == meta["a.str"]
    for t in ref.tensors:
        assert t.data_offset == w.offsets[t.name]
        assert t.tensor_type.name == tensors[t.name].type_name
        assert tuple(int(d) for d in reversed(t.shape)) == tensors[t.name].shape
        assert t.data.tobytes() == tensors[t.name].raw.tobytes()


def test_missing_tensor_names_near_matches(tmp_path):
    w = synthetic_model(tmp_path / "m.gguf", layers=1)
    with gguf.open(w.path) as g, pytest.raises(GGUFFormatError, match="near matches: output.weight"):
        g.read_raw("output.weigth")
    with gguf.open(w.path) as g:
        with pytest.raises(GGUFFormatError, match=r"tensor output.weight: row range \[5, 4\)"):
            g.read_raw("output.weight", 5, 4)
        with pytest.raises(GGUFFormatError, match="outside"):
            g.read_rows("output.weight", 0, 301)


def test_unsupported_type_and_missing_tokens(tmp_path):
    raw = np.zeros((2, 24), np.uint8)   # two Q5_1 rows of 32: readable raw, not dequantizable here
    w = write_gguf(tmp_path / "m.gguf", {"a": 1}, {"q4.weight": ("Q5_1", (2, 32), raw)})
    with gguf.open(w.path) as g:
        assert np.array_equal(g.read_raw("q4.weight"), raw)
        assert "Q5_1" not in quant.SUPPORTED
        with pytest.raises(GGUFFormatError, match="tensor q4.weight: cannot dequantize Q5_1"):
            g.read_rows("q4.weight")
        with pytest.raises(GGUFFormatError, match="tokenizer.ggml.tokens"):
            g.tokens()
        assert g.token_types() is None


def test_sha256_streams_and_caches(tmp_path):
    w = synthetic_model(tmp_path / "m.gguf", layers=1)
    calls = []
    with gguf.open(w.path) as g:
        digest = g.sha256(lambda d, t: calls.append((d, t)))
        assert digest == hashlib.sha256(w.path.read_bytes()).hexdigest() == w.sha256
        assert calls[-1] == (g.size, g.size)
        assert g.sha256(lambda d, t: calls.append("again")) == digest and "again" not in calls


def test_writer_rejects_bad_requests(tmp_path):
    with pytest.raises(QuantError, match="needs raw uint8"):
        TensorData("Q8_0", (2, 64), np.zeros((2, 64), np.uint8))
    with pytest.raises(QuantError, match="multiple of 256"):
        TensorData("Q6_K", (2, 100), np.zeros((2, 82), np.uint8))
    with pytest.raises(QuantError, match="cannot infer"):
        write_gguf(tmp_path / "m.gguf", {"x": object()}, {})
    write_gguf(tmp_path / "m.gguf", {"x": 1}, {})
    with pytest.raises(GGUFFormatError, match="exists"):
        write_gguf(tmp_path / "m.gguf", {"x": 2}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_open_262k_vocab_under_a_second(tmp_path):
    """The issue's bar: open + list tensors with a 262K-token table (and as many merges) in <= 1 s."""
    v = 262_144
    toks = [f"tok{i}" for i in range(v)]
    write_gguf(tmp_path / "big.gguf", {"tokenizer.ggml.tokens": toks, "tokenizer.ggml.merges": toks,
                                       "tokenizer.ggml.scores": np.zeros(v, np.float32)},
               {"output.weight": TensorData.from_f32(np.ones((4, 32), np.float32))})
    t0 = time.perf_counter()
    with gguf.open(tmp_path / "big.gguf") as g:
        names = [(t.name, t.type_name, t.shape) for t in g.tensors.values()]
        elapsed = time.perf_counter() - t0
        assert names == [("output.weight", "F32", (4, 32))]
        assert elapsed < 1.0, f"open took {elapsed:.2f} s"
        toks_back = g.tokens()
        assert len(toks_back) == v and toks_back[-1] == f"tok{v - 1}"


def test_bench_gguf_open_small(tmp_path):
    from exactedit.bench.gguf_open import GGUFOpenBenchConfig, run_gguf_open_bench

    r = run_gguf_open_bench(GGUFOpenBenchConfig(vocab=2000, repeats=2, workdir=str(tmp_path)))
    assert r.tensors_ours == r.tensors_gguf_py > 0 and r.ours_s > 0 and r.gguf_py_s > 0
    assert r.ratio == pytest.approx(r.gguf_py_s / r.ours_s)
    assert set(r.to_dict()) >= {"vocab", "ours_s", "gguf_py_s", "ratio"}
