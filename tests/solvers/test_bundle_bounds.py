"""What a bundle's edits declare is bounded before any edit file is read (issue 38): by the target
model's tensors when applying (each edit one of its tensors, of its type and shape, no tensor twice,
at most its rows) and by MAX_EDIT_BYTES in all; and `write_bundle` refuses what these readers would
refuse. Before: a crafted entry declaring a huge shape, over a sparse file of that size, was read
whole (a memory bomb) before anything looked at the model."""
from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from exactedit import quant
from exactedit.quant import gguf
from exactedit.quant.gguf.write import synthetic_model
from exactedit.solvers import bundle as module
from exactedit.solvers.apply import apply_bundle
from exactedit.solvers.bundle import BundleError, InputRef, TensorEdit, read_bundle, write_bundle

DOWN = "blk.1.ffn_down.weight"


@pytest.fixture
def world(tmp_path):
    """A model and a bundle for it: a row patch of its head and a whole-tensor edit of its ffn_down."""
    rng = np.random.default_rng(0)
    model = synthetic_model(tmp_path / "m.gguf", tail="rmsnorm", vocab=300, n=256, h=64)
    with gguf.open(model.path) as g:
        down = g.tensors[DOWN]
        new_down = quant.quantize(rng.standard_normal(down.shape).astype(np.float32), down.type_name)
    head = quant.quantize(rng.standard_normal((2, 256)).astype(np.float32), "Q6_K")
    edits = [TensorEdit("output.weight", "rows", "Q6_K", (300, 256), head, np.array([5, 100])),
             TensorEdit(DOWN, "tensor", down.type_name, down.shape, new_down)]
    write_bundle(tmp_path / "b", solver="head", inputs=[InputRef("model", str(model.path), model.sha256)],
                 config={}, edits=edits)
    return model, tmp_path / "b", down


def _mutate(bundle, fn) -> dict:
    f = bundle / "manifest.json"
    m = json.loads(f.read_text())
    fn(m)
    f.write_text(json.dumps(m))
    return m


def test_a_huge_declared_shape_is_refused_by_the_model_before_its_file_is_read(world, tmp_path):
    """The whole-tensor edit's entry says 2^20 rows and its file is a sparse file of that size: the
    model's tensor has 64, so `apply` refuses naming the field, having read none of it (before: all
    64 MiB read, then "altered")."""
    model, b, down = world

    def grow(m):
        m["edits"][1]["shape"] = [1 << 20, down.shape[1]]

    m = _mutate(b, grow)
    f = b / m["edits"][1]["file"]
    with open(f, "r+b") as fh:
        fh.truncate((1 << 20) * quant.row_bytes(down.type_name, down.shape[1]))     # sparse, 68 MiB
    tracemalloc.start()
    try:
        with pytest.raises(BundleError) as err:
            apply_bundle(b, model.path, tmp_path / "e.gguf")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value) == (f"{b}: edits[1].shape: {down.type_name} [{1 << 20}, {down.shape[1]}]; the model's "
                              f"{DOWN} is {down.type_name} {list(down.shape)}"), str(err.value)
    assert peak < 16 << 20, peak
    assert not (tmp_path / "e.gguf").exists()


@pytest.mark.parametrize("change, field, says", [
    (lambda m: m["edits"][0].update(tensor="no.such.weight"), "edits[0].tensor", "is not a tensor of the model"),
    (lambda m: m["edits"][0].update(type="Q8_0"), "edits[0].shape",
     "Q8_0 [300, 256]; the model's output.weight is Q6_K"),
    (lambda m: m["edits"][0].update(shape=[300, 512]), "edits[0].shape", "Q6_K [300, 512]; the model's output.weight"),
    (lambda m: m["edits"][0].update(rows=list(range(301))), "edits[0].rows", "301 row ids for a tensor of 300 rows"),
    (lambda m: m["edits"].append(dict(m["edits"][1])), "edits[2].tensor", f"'{DOWN}' is edited twice"),
])
def test_each_edit_is_checked_against_the_model_naming_its_field(world, tmp_path, change, field, says):
    model, b, _ = world
    _mutate(b, change)
    with pytest.raises(BundleError) as err:
        apply_bundle(b, model.path, tmp_path / "e.gguf")
    assert str(err.value).startswith(f"{b}: {field}: ") and says in str(err.value), str(err.value)


def test_edits_are_capped_in_all_before_any_is_read(world, monkeypatch):
    """Without a model (read_bundle alone) the edits may declare MAX_EDIT_BYTES in all: the first
    edit past it is named, before its file is read (before: read whole, then "altered")."""
    _, b, down = world
    monkeypatch.setattr(module, "MAX_EDIT_BYTES", 1 << 20, raising=False)
    rows = (2 << 20) // quant.row_bytes(down.type_name, down.shape[1])

    def grow(m):
        m["edits"][1]["shape"] = [rows, down.shape[1]]

    m = _mutate(b, grow)
    size = rows * quant.row_bytes(down.type_name, down.shape[1])
    with open(b / m["edits"][1]["file"], "r+b") as fh:
        fh.truncate(size)
    with pytest.raises(BundleError) as err:
        read_bundle(b)
    assert str(err.value).startswith(f"{b}: edits[1].shape: declares {size} bytes (") \
        and str(err.value).endswith(f"over the limit of {1 << 20} bytes of edits in a bundle"), str(err.value)


def test_a_bundle_no_reader_would_take_is_not_written(tmp_path, monkeypatch):
    """Edits over MAX_EDIT_BYTES, or a report over MAX_FILE_BYTES: refused before anything is
    written (before: written, then unreadable)."""
    rng = np.random.default_rng(1)
    edit = TensorEdit("output.weight", "rows", "Q6_K", (300, 256),
                      quant.quantize(rng.standard_normal((4, 256)).astype(np.float32), "Q6_K"), np.arange(4))
    kw = dict(solver="head", inputs=[InputRef("model", "/m.gguf", "ab" * 32)], config={}, edits=[edit])
    monkeypatch.setattr(module, "MAX_EDIT_BYTES", 4 + 4 * (4 + 210) - 1, raising=False)
    with pytest.raises(BundleError, match=r"b: edits: 860 bytes of edits, over the limit of 859$"):
        write_bundle(tmp_path / "b", **kw)
    monkeypatch.setattr(module, "MAX_EDIT_BYTES", 1 << 20, raising=False)
    monkeypatch.setattr(module, "MAX_FILE_BYTES", 10)
    with pytest.raises(BundleError, match=r"b: report\.json: 11 bytes, over the limit of 10 for a bundle's file$"):
        write_bundle(tmp_path / "b", files={"report.json": b"x" * 11}, **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    write_bundle(tmp_path / "b", files={"report.json": b"x" * 10}, **kw)
    assert len(read_bundle(tmp_path / "b").edits) == 1
