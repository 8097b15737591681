"""Bundles: write / read round trip, validation of altered or malformed bundles, and apply."""
from __future__ import annotations

import json

import numpy as np
import pytest

from exactedit import quant
from exactedit.quant import gguf
from exactedit.quant.gguf.write import synthetic_model
from exactedit.solvers.apply import apply_bundle
from exactedit.solvers.bundle import BundleError, InputRef, TensorEdit, bundle_identity, read_bundle, write_bundle
from tests.special_files import KINDS, WHY, special


def _q6k_rows(rng, k, cols=256):
    return quant.quantize(rng.standard_normal((k, cols)).astype(np.float32), "Q6_K")


def _edits(rng):
    rows = TensorEdit("output.weight", "rows", "Q6_K", (300, 256), _q6k_rows(rng, 3), np.array([7, 2, 299]))
    whole = TensorEdit("blk.1.ffn_down.weight", "tensor", "Q8_0", (4, 64),
                       quant.quantize(rng.standard_normal((4, 64)).astype(np.float32), "Q8_0"))
    return [rows, whole]


def _write(tmp_path, rng, **kw):
    return write_bundle(tmp_path / "b", solver="head", inputs=[InputRef("model", "/m.gguf", "ab" * 32)],
                        config={"rank": 1}, edits=_edits(rng), files={"report.json": b'{"x": 1}'},
                        record={"chosen_step": 30}, **kw)


def test_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    b = _write(tmp_path, rng)
    again = read_bundle(tmp_path / "b")
    assert again.sha256 == b.sha256 and again.record == {"chosen_step": 30} and again.config == {"rank": 1}
    rng = np.random.default_rng(0)
    for got, want in zip(again.edits, _edits(rng)):
        assert got.tensor == want.tensor and got.kind == want.kind and np.array_equal(got.raw, want.raw)
    assert list(again.edits[0].row_ids) == [7, 2, 299] and again.edits[1].row_ids is None
    assert again.input("model").sha256 == "ab" * 32
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == sorted(
        ["manifest.json", "report.json", "output.weight.q6k", "blk.1.ffn_down.weight.raw"])
    assert not (tmp_path / "b.tmp").exists()


def test_refuses_to_overwrite_unless_asked(tmp_path):
    rng = np.random.default_rng(0)
    _write(tmp_path, rng)
    with pytest.raises(BundleError, match="exists"):
        _write(tmp_path, rng)
    assert _write(tmp_path, rng, overwrite=True).solver == "head"


@pytest.mark.parametrize("victim", ["report.json", "output.weight.q6k", "blk.1.ffn_down.weight.raw"])
def test_altered_file_is_detected(tmp_path, victim):
    _write(tmp_path, np.random.default_rng(0))
    f = tmp_path / "b" / victim
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="altered"):
        read_bundle(tmp_path / "b")


@pytest.mark.parametrize("mutate, field", [
    (lambda m: m.pop("edits"), "edits"),
    (lambda m: m.update(kind="other"), "kind"),
    (lambda m: m["edits"][0].update(shape=[300]), "shape"),
    (lambda m: m["edits"][0].update(rows=[1, 2, 3]), "rows"),
    (lambda m: m["edits"][1].update(shape=[5, 64]), "file"),
    (lambda m: m["edits"][0].update(type="Q5_1"), "type"),
    (lambda m: m["files"].update({"../x": "00"}), "files"),
    (lambda m: m["inputs"][0].pop("sha256"), "sha256"),
    (lambda m: m["edits"][0].update(shape=[300, 100]), r"edits\[0\]\.shape: .*100"),    # a QuantError before
])
def test_malformed_manifest_names_the_field(tmp_path, mutate, field):
    _write(tmp_path, np.random.default_rng(0))
    f = tmp_path / "b" / "manifest.json"
    m = json.loads(f.read_text())
    mutate(m)
    f.write_text(json.dumps(m))
    with pytest.raises(BundleError, match=field):
        read_bundle(tmp_path / "b")


def test_not_a_bundle(tmp_path):
    with pytest.raises(BundleError, match="manifest.json"):
        read_bundle(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="JSON"):
        read_bundle(tmp_path)


def test_edit_validation():
    rng = np.random.default_rng(0)
    with pytest.raises(BundleError, match="row_ids"):
        TensorEdit("output.weight", "rows", "Q6_K", (10, 256), _q6k_rows(rng, 2), np.array([3, 3]))
    with pytest.raises(BundleError, match="row_ids"):
        TensorEdit("output.weight", "rows", "Q6_K", (10, 256), _q6k_rows(rng, 1), np.array([10]))
    with pytest.raises(BundleError, match="raw"):
        TensorEdit("output.weight", "rows", "Q6_K", (10, 512), _q6k_rows(rng, 1), np.array([0]))
    with pytest.raises(BundleError, match="whole-tensor"):
        TensorEdit("output.weight", "tensor", "Q6_K", (10, 256), _q6k_rows(rng, 9))


def test_apply_writes_exactly_the_edited_rows(tmp_path):
    rng = np.random.default_rng(1)
    model = synthetic_model(tmp_path / "m.gguf", tail="rmsnorm", vocab=300, n=256, h=64)
    with gguf.open(model.path) as g:
        down = g.tensors["blk.1.ffn_down.weight"]
        new_down = quant.quantize(rng.standard_normal(down.shape).astype(np.float32), down.type_name)
        head_before = np.array(g.read_raw("output.weight"))
    rows = TensorEdit("output.weight", "rows", "Q6_K", (300, 256), _q6k_rows(rng, 2), np.array([5, 100]))
    whole = TensorEdit("blk.1.ffn_down.weight", "tensor", down.type_name, down.shape, new_down)
    b = write_bundle(tmp_path / "b", solver="head", inputs=[InputRef("model", str(model.path), model.sha256)],
                     config={}, edits=[rows, whole])
    result = apply_bundle(b.path, model.path, tmp_path / "out.gguf")
    with gguf.open(tmp_path / "out.gguf") as g2:
        head_after = np.array(g2.read_raw("output.weight"))
        assert np.array_equal(np.array(g2.read_raw("blk.1.ffn_down.weight")), new_down)
        assert g2.sha256() == result.out_sha256
    changed = np.flatnonzero((head_after != head_before).any(axis=1))
    assert set(changed) <= {5, 100} and np.array_equal(head_after[[5, 100]], rows.raw)
    assert [(a.tensor, a.rows_replaced) for a in result.edits] == [("output.weight", 2),
                                                                   ("blk.1.ffn_down.weight", down.shape[0])]


def test_apply_refuses_another_model_or_a_mismatched_tensor(tmp_path):
    rng = np.random.default_rng(2)
    model = synthetic_model(tmp_path / "m.gguf", tail="rmsnorm", vocab=300, n=256, h=64)
    other = synthetic_model(tmp_path / "o.gguf", tail="rmsnorm", vocab=300, n=256, h=64, seed=5)
    rows = TensorEdit("output.weight", "rows", "Q6_K", (300, 256), _q6k_rows(rng, 1), np.array([5]))
    b = write_bundle(tmp_path / "b", solver="head", inputs=[InputRef("model", str(model.path), model.sha256)],
                     config={}, edits=[rows])
    with pytest.raises(BundleError, match="sha256"):
        apply_bundle(b.path, other.path, tmp_path / "out.gguf")
    wide = TensorEdit("output.weight", "rows", "Q6_K", (301, 256), _q6k_rows(rng, 1), np.array([5]))
    b2 = write_bundle(tmp_path / "b2", solver="head", inputs=[InputRef("model", str(model.path), model.sha256)],
                      config={}, edits=[wide])
    with pytest.raises(BundleError, match="shape|301"):
        apply_bundle(b2.path, model.path, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_identity_is_the_content_not_the_files(tmp_path):
    """Same inputs, config and edit bytes -> same identity (reports and creation time aside);
    any change of config, input hash or edit bytes changes it."""
    rng = np.random.default_rng(0)
    edits = _edits(rng)
    inputs = [InputRef("model", "/a/m.gguf", "ab" * 32)]
    a = write_bundle(tmp_path / "a", solver="head", inputs=inputs, config={"rank": 1}, edits=edits,
                     files={"report.txt": b"one"})
    b = write_bundle(tmp_path / "b", solver="head", inputs=[InputRef("model", "/elsewhere/m.gguf", "ab" * 32)],
                     config={"rank": 1}, edits=edits, files={"report.txt": b"two"}, record={"t": 1})
    assert a.sha256 == b.sha256 == bundle_identity("head", inputs, {"rank": 1}, edits)
    assert a.manifest_sha256 != b.manifest_sha256
    flipped = edits[0].raw.copy()
    flipped[0, 0] ^= 1
    changed = [TensorEdit(edits[0].tensor, "rows", "Q6_K", edits[0].shape, flipped, edits[0].row_ids), edits[1]]
    others = [bundle_identity("head", inputs, {"rank": 2}, edits),
              bundle_identity("head", [InputRef("model", "/a/m.gguf", "cd" * 32)], {"rank": 1}, edits),
              bundle_identity("head", inputs, {"rank": 1}, changed),
              bundle_identity("wfld", inputs, {"rank": 1}, edits)]
    assert len({a.sha256, *others}) == 5


def test_forged_identity_is_refused(tmp_path):
    _write(tmp_path, np.random.default_rng(0))
    f = tmp_path / "b" / "manifest.json"
    m = json.loads(f.read_text())
    m["config"]["rank"] = 7
    f.write_text(json.dumps(m))
    with pytest.raises(BundleError, match="identity"):
        read_bundle(tmp_path / "b")


def test_ledger_head_is_recorded_outside_the_identity(tmp_path):
    head = {"seq": 12, "hash": "c" * 64, "ledger": "/ws/ledger.sqlite"}
    b = _write(tmp_path, np.random.default_rng(0), ledger_head=head)
    assert b.ledger_head == head and read_bundle(b.path).ledger_head == head
    plain = write_bundle(tmp_path / "p", solver="head", inputs=[InputRef("model", "/m.gguf", "ab" * 32)],
                         config={"rank": 1}, edits=_edits(np.random.default_rng(0)),
                         files={"report.json": b'{"x": 1}'}, record={"chosen_step": 30})
    assert plain.ledger_head is None and plain.sha256 == b.sha256  # the head does not change what the edit is
    m = json.loads((b.path / "manifest.json").read_text())
    m["ledger_head"] = {"seq": "12", "hash": "c" * 64}
    (b.path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="ledger_head"):
        read_bundle(b.path)


def test_a_second_live_run_of_one_output_is_refused_not_clobbered(tmp_path):
    """While one run holds B's lock (writing B.tmp/), another run writing B is refused and leaves
    B.tmp/ alone; a killed run's leftovers (its lock file, its B.tmp/) are reused."""
    from exactedit.files import OutputBusyError, output_lock

    rng = np.random.default_rng(0)
    (tmp_path / "b.tmp").mkdir()
    (tmp_path / "b.tmp" / "partial").write_bytes(b"the first run's work")
    with output_lock(tmp_path / "b"):
        with pytest.raises(OutputBusyError, match="another run"):
            _write(tmp_path, rng)
        assert (tmp_path / "b.tmp" / "partial").read_bytes() == b"the first run's work"
    (tmp_path / "b.lock").write_bytes(b"")          # a killed run's lock file: no process holds it
    b = _write(tmp_path, rng)
    assert b.path == tmp_path / "b" and not (tmp_path / "b.tmp").exists() and not (tmp_path / "b.lock").exists()


# ---- a bundle directory is untrusted input (issue 38): every file read bounded ------------------

_FIELD = {"manifest.json": "manifest", "report.json": "files", "output.weight.q6k": r"edits[0].file",
          "blk.1.ffn_down.weight.raw": r"edits[1].file"}


@pytest.mark.parametrize("victim", list(_FIELD))
@pytest.mark.parametrize("kind", KINDS)
def test_special_files_in_a_bundle_are_refused_by_name(tmp_path, victim, kind):
    """Each file replaced by a FIFO, a link to /dev/zero or a symlink loop: named with its field
    (before: "missing", or, had it passed is_file(), waited on / read until memory ran out)."""
    _write(tmp_path, np.random.default_rng(0))
    (tmp_path / "b" / victim).unlink()
    bad = special(tmp_path / "b" / victim, kind)
    with pytest.raises(BundleError) as err:
        read_bundle(tmp_path / "b")
    assert str(err.value).startswith(f"{bad}: {_FIELD[victim]}: ") and WHY[kind] in str(err.value), str(err.value)


@pytest.mark.parametrize("victim, size", [("output.weight.q6k", 4 + 3 * (4 + 210)), ("blk.1.ffn_down.weight.raw", 4 * 68)])
def test_an_edit_file_is_bounded_by_the_size_its_entry_declares(tmp_path, victim, size):
    """Longer than its entry (shape, type, rows) says: refused before a byte is read (before: hashed
    and read whole, then "altered"); shorter: refused naming both sizes."""
    _write(tmp_path, np.random.default_rng(0))
    f = tmp_path / "b" / victim
    assert f.stat().st_size == size
    with open(f, "r+b") as fh:
        fh.truncate(size + (1 << 20))                       # sparse
    with pytest.raises(BundleError, match=rf"{size + (1 << 20)} bytes, over the limit of {size}$"):
        read_bundle(tmp_path / "b")
    with open(f, "r+b") as fh:
        fh.truncate(size - 1)
    with pytest.raises(BundleError, match=rf"file: {size - 1} bytes; expected {size} "):
        read_bundle(tmp_path / "b")


def test_the_manifest_is_capped_and_parsed_bounded(tmp_path):
    from exactedit.solvers.bundle import MAX_MANIFEST_BYTES

    _write(tmp_path, np.random.default_rng(0))
    f = tmp_path / "b" / "manifest.json"
    f.write_text("[" * 100_000 + "]" * 100_000)              # a RecursionError before
    with pytest.raises(BundleError, match=r"manifest\.json: not valid JSON \(nested too deeply\)"):
        read_bundle(tmp_path / "b")
    with open(f, "r+b") as fh:
        fh.truncate(MAX_MANIFEST_BYTES + 1)                 # sparse: read whole before
    with pytest.raises(BundleError, match=f"manifest: {MAX_MANIFEST_BYTES + 1} bytes, over the limit"):
        read_bundle(tmp_path / "b")


def test_a_manifest_no_reader_would_take_is_not_written(tmp_path, monkeypatch):
    from exactedit.solvers import bundle as module

    monkeypatch.setattr(module, "MAX_MANIFEST_BYTES", 100)
    with pytest.raises(BundleError, match="manifest.json: .* bytes, over the limit of 100"):
        _write(tmp_path, np.random.default_rng(0))
    assert sorted(p.name for p in tmp_path.iterdir()) == []
