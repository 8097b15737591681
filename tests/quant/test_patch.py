"""quant.gguf.patch: the row patch file (SPEC.md section 3) written, read back, validated and applied."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactedit import quant
from exactedit.quant import gguf
from exactedit.quant.gguf import transplant as tp
from exactedit.quant.gguf.write import synthetic_model
from exactedit.quant.gguf.patch import RowPatch, RowPatchError, apply_row_patch, read_row_patch, write_row_patch


def test_layout_is_count_then_id_and_bytes(tmp_path):
    """Q6_K rows of n = 2560 are 2,100 bytes; the file is uint32 count, then (uint32 id, row) each."""
    rows = quant.quantize(np.random.default_rng(0).standard_normal((3, 2560)).astype(np.float32), "Q6_K")
    assert rows.shape == (3, 2100)
    path = write_row_patch(tmp_path / "p.bin", [248_000, 7, 12], rows)
    data = path.read_bytes()
    assert len(data) == 4 + 3 * (4 + 2100)
    assert struct.unpack_from("<I", data, 0) == (3,)
    for i, rid in enumerate([248_000, 7, 12]):
        at = 4 + i * 2104
        assert struct.unpack_from("<I", data, at) == (rid,)
        assert data[at + 4:at + 2104] == rows[i].tobytes()
    p = read_row_patch(path, row_bytes=2100)
    assert list(p.row_ids) == [248_000, 7, 12] and np.array_equal(p.raw, rows)
    assert p.row_ids.dtype == np.uint32 and not p.raw.flags.writeable


@settings(max_examples=40, deadline=None)
@given(k=st.integers(0, 6), rb=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_round_trip(tmp_path_factory, k, rb, seed):
    rng = np.random.default_rng(seed)
    ids = rng.choice(2**32, size=k, replace=False)
    raw = rng.integers(0, 256, (k, rb), dtype=np.uint8)
    path = write_row_patch(tmp_path_factory.mktemp("p") / "p.bin", ids, raw)
    for given_width in (rb, None):
        p = read_row_patch(path, row_bytes=given_width)
        assert np.array_equal(p.row_ids, ids.astype(np.uint32))
        assert np.array_equal(p.raw, raw) or (k == 0 and given_width is None and p.raw.shape == (0, 0))


@pytest.mark.parametrize("data,row_bytes,field", [
    (b"", None, "count"),
    (b"\x01\x00", None, "count"),
    (struct.pack("<I", 0) + b"x", None, "count"),
    (struct.pack("<I", 2**32 - 1) + bytes(20), None, "count"),           # count larger than the bytes
    (struct.pack("<I", 2) + bytes(13), None, "count"),                    # not whole records
    (struct.pack("<I", 2) + bytes(8), None, "count"),                     # records with no row bytes
    (struct.pack("<I", 1) + bytes(4 + 10), 12, "rows"),                   # wrong width for the tensor
    (struct.pack("<I", 2) + (struct.pack("<I", 5) + bytes(3)) * 2, None, "row ids"),  # repeated row
])
def test_malformed_files(tmp_path, data, row_bytes, field):
    path = tmp_path / "bad.bin"
    path.write_bytes(data)
    with pytest.raises(RowPatchError) as err:
        read_row_patch(path, row_bytes=row_bytes)
    assert err.value.field == field and str(path) in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(RowPatchError, match="does not exist"):
        read_row_patch(tmp_path / "nope.bin")


def test_write_validates_and_never_overwrites(tmp_path):
    with pytest.raises(RowPatchError, match="distinct"):
        write_row_patch(tmp_path / "p.bin", [1, 1], np.zeros((2, 4), np.uint8))
    with pytest.raises(RowPatchError, match=r"\[0, 2\*\*32\)"):
        write_row_patch(tmp_path / "p.bin", [-1], np.zeros((1, 4), np.uint8))
    with pytest.raises(RowPatchError, match="uint8 raw"):
        write_row_patch(tmp_path / "p.bin", [1], np.zeros((1, 4), np.float32))
    write_row_patch(tmp_path / "p.bin", [1], np.zeros((1, 4), np.uint8))
    with pytest.raises(RowPatchError, match="exists"):
        write_row_patch(tmp_path / "p.bin", [2], np.ones((1, 4), np.uint8))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.bin"]


def test_apply_copies_and_checks(tmp_path):
    tensor = np.arange(5 * 6, dtype=np.uint8).reshape(5, 6)
    before = tensor.copy()
    patch = RowPatch(np.array([4, 1]), np.full((2, 6), 200, np.uint8))
    out = apply_row_patch(tensor, patch)
    assert np.array_equal(tensor, before)
    assert np.array_equal(out[[1, 4]], np.full((2, 6), 200)) and np.array_equal(out[[0, 2, 3]], before[[0, 2, 3]])
    with pytest.raises(RowPatchError, match="outside the tensor's 5 rows"):
        apply_row_patch(tensor, RowPatch(np.array([5]), np.zeros((1, 6), np.uint8)))
    with pytest.raises(RowPatchError, match="rows of 4 bytes cannot patch a tensor with 6-byte rows"):
        apply_row_patch(tensor, RowPatch(np.array([0]), np.zeros((1, 4), np.uint8)))
    assert np.array_equal(apply_row_patch(tensor, RowPatch(np.zeros(0, np.uint32), np.zeros((0, 0), np.uint8))),
                          before)


def test_patch_into_a_gguf_head(tmp_path):
    """The intended path: edited head rows -> patch file -> applied to the original bytes -> transplant."""
    src = synthetic_model(tmp_path / "m.gguf", vocab=32, n=256, h=32, layers=1).path
    with gguf.open(src) as g:
        original = np.array(g.read_raw("output.weight"))
        rows = np.array([3, 30])
        edited = quant.quantize(g.read_rows("output.weight")[rows] * 1.5, "Q6_K")
    path = write_row_patch(tmp_path / "head.patch", rows, edited)
    new = apply_row_patch(original, read_row_patch(path, row_bytes=original.shape[1]))
    tp.transplant(src, tmp_path / "out.gguf", {"output.weight": new})
    with gguf.open(tmp_path / "out.gguf") as g:
        got = g.read_raw("output.weight")
        assert np.array_equal(got[rows], edited)
        keep = np.setdiff1d(np.arange(32), rows)
        assert np.array_equal(got[keep], original[keep])
