"""quant.gguf.transplant: every byte outside the replaced tensors kept, adds keep every old tensor's bytes."""
from __future__ import annotations

import ctypes
import hashlib
import json
import os

import numpy as np
import pytest
from gguf import GGUFReader

from exactedit import quant
import exactedit.quant.gguf.transplant as tp
from exactedit.quant import gguf
from exactedit.quant.model.arch import detect_tail
from exactedit.errors import GGUFFormatError
from exactedit.quant.gguf.write import TensorData, synthetic_model
from tests import oracles


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def model(tmp_path):
    return synthetic_model(tmp_path / "src.gguf", vocab=64, n=256, h=32, layers=2).path


def _edited_rows(g, name, rows, seed=0):
    """The tensor's raw bytes with `rows` re-quantized from perturbed values (the real use)."""
    info = g.tensors[name]
    raw = np.array(g.read_raw(name))
    x = g.read_rows(name, 0, info.rows)[rows] + np.random.default_rng(seed).standard_normal(
        (len(rows), info.cols)).astype(np.float32) * 0.01
    raw[rows] = quant.quantize(x, info.type_name)
    return raw


def test_replace_keeps_every_other_byte(model, tmp_path):
    with gguf.open(model) as g:
        new_head = _edited_rows(g, "output.weight", [0, 5, 63])
        new_down = _edited_rows(g, "blk.1.ffn_down.weight", [3])
        spans = {n: (g.tensors[n].offset, g.tensors[n].nbytes) for n in ("output.weight",
                                                                        "blk.1.ffn_down.weight")}
    dst = tmp_path / "dst.gguf"
    r = tp.transplant(model, dst, {"output.weight": new_head, "blk.1.ffn_down.weight": new_down})
    a, b = np.fromfile(model, np.uint8), np.fromfile(dst, np.uint8)
    assert a.shape == b.shape
    outside = np.ones(a.shape, bool)
    for off, nb in spans.values():
        outside[off:off + nb] = False
    assert np.array_equal(a[outside], b[outside])
    assert not np.array_equal(a[~outside], b[~outside])
    with gguf.open(dst) as g:
        assert np.array_equal(g.read_raw("output.weight"), new_head)
        assert np.array_equal(g.read_raw("blk.1.ffn_down.weight"), new_down)
    assert r.src_sha256 == sha(model) and r.dst_sha256 == sha(dst) and r.dst_bytes == b.size
    assert r.bytes_from_src == int(outside.sum()) and not (tmp_path / "dst.gguf.tmp").exists()
    m = json.loads(r.manifest.read_text())
    assert r.manifest == tmp_path / "dst.gguf.manifest.json"
    assert m["src"]["sha256"] == sha(model) and m["dst"]["sha256"] == sha(dst)
    recs = {t["name"]: t for t in m["replaced"]}
    assert recs["output.weight"]["sha256"] == hashlib.sha256(new_head.tobytes()).hexdigest()
    assert recs["output.weight"]["offset"] == spans["output.weight"][0] and m["added"] == []


def test_untie_by_adding_output_weight(tmp_path):
    src = synthetic_model(tmp_path / "tied.gguf", vocab=64, n=256, h=32, layers=2, tied=True).path
    with gguf.open(src) as g:
        assert detect_tail(g).tied
        emb = g.tensors["token_embd.weight"]
        raw = np.array(g.read_raw("token_embd.weight"))
        old = {n: np.array(g.read_raw(n)) for n in g.tensors}
        keys, values = g.metadata_keys(), {k: g.get(k) for k in ("general.name", "tokenizer.ggml.tokens")}
    head = raw.copy()
    head[7] = quant.quantize(np.full((1, 256), 0.02, np.float32), emb.type_name)[0]
    dst = tmp_path / "untied.gguf"
    r = tp.transplant(src, dst, {}, add={"output.weight": (emb.type_name, emb.shape, head)},
                        manifest=tmp_path / "m.json")
    with gguf.open(dst) as g:
        tail = detect_tail(g)
        assert not tail.tied and tail.names["head"] == "output.weight"
        assert list(g.tensors)[-1] == "output.weight" and len(g.tensors) == len(old) + 1
        for n, before in old.items():
            assert np.array_equal(g.read_raw(n), before), n
        assert np.array_equal(g.read_raw("output.weight"), head)
        assert g.metadata_keys() == keys and all(g.get(k) == v for k, v in values.items())
        assert r.added[0].offset == g.tensors["output.weight"].offset
    # an independent parser agrees on the new table and data
    ref = GGUFReader(dst)
    by_name = {t.name: t for t in ref.tensors}
    assert by_name["output.weight"].data.tobytes() == head.tobytes()
    assert by_name["token_embd.weight"].data.tobytes() == raw.tobytes()
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert manifest["added"][0]["name"] == "output.weight" and manifest["dst"]["sha256"] == sha(dst)


def test_add_and_replace_together_keep_metadata_bytes(model, tmp_path):
    with gguf.open(model) as g:
        info_end, data_offset = g.info_end, g.data_offset
        new_head = _edited_rows(g, "output.weight", [1])
    extra = TensorData.from_f32(np.arange(64, dtype=np.float32).reshape(2, 32))
    dst = tmp_path / "d.gguf"
    tp.transplant(model, dst, {"output.weight": new_head}, add={"extra.weight": extra})
    a, b = model.read_bytes(), dst.read_bytes()
    assert a[:8] == b[:8] and a[16:info_end] == b[16:info_end]     # all but the tensor count
    with gguf.open(dst) as g:
        shift = g.data_offset - data_offset
        assert shift % g.alignment == 0
        head = g.tensors["output.weight"]
        assert a[data_offset:head.offset - shift] == b[g.data_offset:head.offset]
        assert np.array_equal(g.read_raw("output.weight"), new_head)
        assert np.array_equal(g.read_rows("extra.weight"), np.arange(64, dtype=np.float32).reshape(2, 32))


def test_refuses_to_overwrite_input(model, tmp_path):
    link = tmp_path / "link.gguf"
    link.symlink_to(model)
    hard = tmp_path / "hard.gguf"
    os.link(model, hard)
    before = sha(model)
    for dst in (model, link, hard, tmp_path / "." / "src.gguf"):
        with pytest.raises(GGUFFormatError, match="is the input file"):
            tp.transplant(model, dst, {}, overwrite=True)
    named_tmp = tmp_path / "a.gguf.tmp"
    named_tmp.write_bytes(model.read_bytes())
    with pytest.raises(GGUFFormatError, match="temporary output .* is the input file"):
        tp.transplant(named_tmp, tmp_path / "a.gguf", {})
    assert named_tmp.read_bytes() == model.read_bytes() and not (tmp_path / "a.gguf").exists()
    with pytest.raises(GGUFFormatError, match="is the input file"):
        tp.transplant(model, tmp_path / "x.gguf", {}, manifest=model)
    assert sha(model) == before


def test_existing_dst_needs_overwrite(model, tmp_path):
    dst = tmp_path / "d.gguf"
    dst.write_bytes(b"old")
    with pytest.raises(GGUFFormatError, match="exists; pass overwrite=True"):
        tp.transplant(model, dst, {})
    assert dst.read_bytes() == b"old"
    tp.transplant(model, dst, {}, overwrite=True)
    assert sha(dst) == sha(model)


@pytest.mark.parametrize("bad,match", [   # output.weight is Q6_K 64 x 256: raw (64, 210)
    ({"output.weight": np.zeros((63, 210), np.uint8)}, r"replacement must be uint8 \(64, 210\)"),
    ({"output.weight": np.zeros((64, 210), np.int8)}, "replacement must be uint8 .* got int8"),
    ({"output.weigth": np.zeros((64, 210), np.uint8)}, "near matches: output.weight"),
])
def test_bad_replacements(model, tmp_path, bad, match):
    with pytest.raises(GGUFFormatError, match=match):
        tp.transplant(model, tmp_path / "d.gguf", bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.gguf"]


def test_bad_additions(model, tmp_path):
    with pytest.raises(GGUFFormatError, match="already exists"):
        tp.transplant(model, tmp_path / "d.gguf", {},
                        add={"output.weight": ("F32", (2,), np.zeros((1, 8), np.uint8))})
    with pytest.raises(GGUFFormatError, match="added tensor x: .*needs raw uint8"):
        tp.transplant(model, tmp_path / "d.gguf", {}, add={"x": ("F32", (2,), np.zeros((1, 9), np.uint8))})


def test_verification_catches_a_bad_write(model, tmp_path, monkeypatch):
    """A corrupted write (simulated) is caught by the read-back and leaves no output behind."""
    real_write = tp._write

    def corrupting_write(tmp, src_mm, segs, tick):
        real_write(tmp, src_mm, segs, tick)
        with open(tmp, "r+b") as fh:
            fh.seek(100)
            byte = fh.read(1)
            fh.seek(100)
            fh.write(bytes([byte[0] ^ 1]))

    monkeypatch.setattr(tp, "_write", corrupting_write)
    with pytest.raises(GGUFFormatError, match="verify at offset 100: written bytes differ"):
        tp.transplant(model, tmp_path / "d.gguf", {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.gguf"]


def test_progress_is_monotone_to_the_bytes_moved(model, tmp_path):
    seen = []
    r = tp.transplant(model, tmp_path / "d.gguf", {}, progress=lambda d, t: seen.append((d, t)))
    done = [d for d, _ in seen]
    assert done == sorted(done) and seen[-1][0] == seen[-1][1] == model.stat().st_size + 2 * r.dst_bytes


class _GgufInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def _ggml_table(lib, path) -> tuple[int, dict[str, tuple[int, int, int]]]:
    """ggml's own C parser (gguf_init_from_file): data offset, name -> (type id, offset, size)."""
    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, _GgufInitParams]
    for fn, res in (("gguf_get_n_tensors", ctypes.c_int64), ("gguf_get_data_offset", ctypes.c_size_t)):
        getattr(lib, fn).restype, getattr(lib, fn).argtypes = res, [ctypes.c_void_p]
    for fn, res in (("gguf_get_tensor_name", ctypes.c_char_p), ("gguf_get_tensor_offset", ctypes.c_size_t),
                    ("gguf_get_tensor_type", ctypes.c_int), ("gguf_get_tensor_size", ctypes.c_size_t)):
        getattr(lib, fn).restype, getattr(lib, fn).argtypes = res, [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    ctx = lib.gguf_init_from_file(str(path).encode(), _GgufInitParams(True, None))
    assert ctx, f"ggml's gguf_init_from_file rejected {path}"
    try:
        table = {lib.gguf_get_tensor_name(ctx, i).decode(): (lib.gguf_get_tensor_type(ctx, i),
                 lib.gguf_get_tensor_offset(ctx, i), lib.gguf_get_tensor_size(ctx, i))
                 for i in range(lib.gguf_get_n_tensors(ctx))}
        return lib.gguf_get_data_offset(ctx), table
    finally:
        lib.gguf_free(ctx)


def test_ggml_parser_accepts_outputs(tmp_path):
    """ggml's C reader (what llama.cpp loads with) accepts the writer's and transplant's files and
    agrees with our reader on the data offset and each tensor's type, offset and size."""
    lib = oracles.load().lib
    src = synthetic_model(tmp_path / "tied.gguf", tail="hc4", vocab=64, n=256, h=32, layers=2, tied=True).path
    with gguf.open(src) as g:
        emb = g.tensors["token_embd.weight"]
        raw = np.array(g.read_raw("token_embd.weight"))
        head = _edited_rows(g, "blk.1.ffn_down_shexp.weight", [0, 9])
    tp.transplant(src, tmp_path / "r.gguf", {"blk.1.ffn_down_shexp.weight": head})
    tp.transplant(src, tmp_path / "a.gguf", {"blk.1.ffn_down_shexp.weight": head},
                    add={"output.weight": (emb.type_name, emb.shape, raw)})
    for path in (src, tmp_path / "r.gguf", tmp_path / "a.gguf"):
        data_offset, table = _ggml_table(lib, path)
        with gguf.open(path) as g:
            assert data_offset == g.data_offset
            ours = {t.name: (int(gguf.ggml_layout(t.type_name)[0]), t.offset - g.data_offset, t.nbytes)
                    for t in g.tensors.values()}
        assert table == ours, path
