"""write_dump: layout, coercion, refusal of bad arrays, atomic replace."""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

import exactedit.dumps.writer as writer
from exactedit.dumps import DocInfo, DumpExpect, DumpFormatError, read_dump, write_dump


@pytest.mark.parametrize("arch", ["hc4", "rmsnorm"])
def test_round_trip_layout_and_values(tmp_path, arch, make_fields, make_docs, dims):
    fields = make_fields(arch)
    originals = {k: v.copy() for k, v in fields.items()}
    path = write_dump(tmp_path / "d", arch=arch, layer=5, fields=fields, docs=make_docs(),
                      model_sha256="ab" * 32, meta={"n_batch": 512})
    assert sorted(os.listdir(tmp_path)) == ["d"], "no temporary directory may be left behind"
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest) == {"format", "version", "arch", "layer", "rows", "model_sha256", "fields", "sha256",
                             "docs", "meta"}
    assert (manifest["format"], manifest["version"], manifest["arch"]) == ("exactedit-dump", 1, arch)
    assert manifest["rows"] == dims["T"] and manifest["meta"] == {"n_batch": 512}
    assert sorted(os.listdir(path)) == sorted(["manifest.json", *(f"{k}.npy" for k in fields)])
    for name, file in manifest["fields"].items():
        digest = hashlib.sha256((path / file).read_bytes()).hexdigest()
        assert manifest["sha256"][name] == digest, name
    dump = read_dump(path, verify_hashes=True)
    want_dtype = {"tokens": np.int32, "next": np.int32, "roles": np.uint8}
    for name, value in originals.items():
        dtype = want_dtype.get(name, np.float32)
        assert dump.fields[name].dtype == dtype and dump.fields[name].dtype.byteorder in "=<|"
        assert np.array_equal(dump.fields[name], value.astype(dtype)), name
        assert np.array_equal(fields[name], value), f"writer modified its input {name}"
    assert dump.docs == tuple(make_docs()) and dump.model_sha256 == "ab" * 32 and dump.layer == 5


def test_identity_is_stable_and_content_sensitive(tmp_path, make_dump):
    a = read_dump(make_dump(tmp_path / "a")).sha256()
    b = read_dump(make_dump(tmp_path / "b")).sha256()
    c = read_dump(make_dump(tmp_path / "c", seed=1)).sha256()
    assert a == b, "the same content at another path must have the same identity"
    assert a != c


def test_refuses_existing_path_and_overwrites_only_dumps(tmp_path, make_dump):
    path = make_dump(tmp_path / "d")
    with pytest.raises(DumpFormatError, match="already exists"):
        make_dump(path)
    before = read_dump(path).sha256()
    make_dump(path, seed=3, overwrite=True)
    assert read_dump(path).sha256() != before
    assert sorted(os.listdir(tmp_path)) == ["d"]
    other = tmp_path / "notadump"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(DumpFormatError, match="not a dump directory"):
        make_dump(other, overwrite=True)
    assert (other / "keep.txt").read_text() == "mine"


def test_failed_write_leaves_nothing(tmp_path, monkeypatch, make_fields, make_docs):
    calls = []
    real = writer._write_npy

    def failing(file, arr):
        calls.append(file)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(file, arr)

    monkeypatch.setattr(writer, "_write_npy", failing)
    with pytest.raises(OSError, match="disk full"):
        write_dump(tmp_path / "d", arch="hc4", layer=47, fields=make_fields("hc4"), docs=make_docs())
    assert os.listdir(tmp_path) == []


BAD_FIELDS = [
    # (case, arch, changes as a function of the dims, field named in the error, words of the message)
    ("missing R", "hc4", lambda d: {"R": None}, "R", "required"),
    ("rmsnorm missing hh", "rmsnorm", lambda d: {"hh": None}, "hh", "required"),
    ("float tokens", "hc4", lambda d: {"tokens": np.zeros(d["T"])}, "tokens", "integer"),
    ("bool roles", "hc4", lambda d: {"roles": np.zeros(d["T"], bool)}, "roles", "integer"),
    ("object R", "hc4", lambda d: {"R": np.empty((d["T"], d["S"], d["n"]), object)}, "R", "real numeric"),
    ("string hh", "hc4", lambda d: {"hh": np.full((d["T"], d["h"]), "x")}, "hh", "real numeric"),
    ("token beyond int32", "hc4", lambda d: {"tokens": np.full(d["T"], 2 ** 40)}, "tokens", "do not fit int32"),
    ("role 256", "hc4", lambda d: {"roles": np.full(d["T"], 256)}, "roles", "do not fit uint8"),
    ("negative token", "hc4", lambda d: {"tokens": np.full(d["T"], -3)}, "tokens", "row 0"),
    ("next -2", "hc4", lambda d: {"next": np.full(d["T"], -2)}, "next", "or -1"),
    ("float64 overflow", "hc4", lambda d: {"sgv": np.r_[np.zeros(d["T"] - 1), 1e300]}, "sgv", "non-finite"),
    ("NaN row", "rmsnorm", lambda d: {"R": np.where(np.arange(d["T"])[:, None] == 4, np.nan, 1.0)
                                      * np.ones((1, d["n"]))}, "R", "row 4: non-finite"),
    ("R 2-D in hc4", "hc4", lambda d: {"R": np.zeros((d["T"], d["n"]))}, "R", "expected shape [T, S, n]"),
    ("yr width differs", "hc4", lambda d: {"yr": np.zeros((d["T"], d["n"] + 1))}, "yr", "n="),
    ("rows differ", "hc4", lambda d: {"hh": np.zeros((d["T"] - 1, d["h"]))}, "hh", "T="),
    ("empty dump", "hc4", lambda d: {"tokens": np.zeros(0, np.int32)}, "tokens", "T >= 1"),
    ("extra with bad name", "hc4", lambda d: {"bad-name": np.zeros((d["T"], 2))}, "fields", "bad field name"),
    ("extra with wrong rows", "rmsnorm", lambda d: {"post": np.zeros((d["T"] + 1, 2))}, "post", "extra field"),
]


@pytest.mark.parametrize("case, arch, changes, field, words", BAD_FIELDS, ids=[c[0] for c in BAD_FIELDS])
def test_bad_arrays_are_refused_before_writing(tmp_path, case, arch, changes, field, words, make_fields,
                                               make_docs, dims):
    with pytest.raises(DumpFormatError) as err:
        write_dump(tmp_path / "d", arch=arch, layer=1, fields=make_fields(arch, **changes(dims)), docs=make_docs())
    assert err.value.field == field and words in err.value.message and str(tmp_path / "d") in str(err.value)
    assert os.listdir(tmp_path) == []


BAD_DOCS = [
    ("gap", lambda T: [DocInfo("a", 0, 3, "s", "c"), DocInfo("b", 4, T - 4, "s", "c")], "docs", "belong to no"),
    ("overlap", lambda T: [DocInfo("a", 0, 5, "s", "c"), DocInfo("b", 4, T - 4, "s", "c")], "docs.b", "inside"),
    ("past end", lambda T: [DocInfo("a", 0, T + 1, "s", "c")], "docs.a", "run past"),
    ("duplicate", lambda T: [DocInfo("a", 0, 4, "s", "c"), DocInfo("a", 4, T - 4, "s", "c")], "docs.a", "duplicate"),
    ("short", lambda T: [DocInfo("a", 0, T - 1, "s", "c")], "docs", "belong to no document"),
    ("none", lambda T: [], "docs", "belong to no document"),
]


@pytest.mark.parametrize("case, docs, field, words", BAD_DOCS, ids=[c[0] for c in BAD_DOCS])
def test_docs_must_partition_the_rows(tmp_path, case, docs, field, words, make_fields, dims):
    with pytest.raises(DumpFormatError) as err:
        write_dump(tmp_path / "d", arch="hc4", layer=47, fields=make_fields("hc4"), docs=docs(dims["T"]))
    assert err.value.field == field and words in err.value.message


@pytest.mark.parametrize("kwargs, field", [
    ({"name": ""}, "name"), ({"first_row": -1}, "first_row"), ({"rows": 0}, "rows"),
    ({"rows": 2.0}, "rows"), ({"source": None}, "source"), ({"tags": "style"}, "tags"), ({"tags": ("",)}, "tags"),
])
def test_docinfo_validates(kwargs, field):
    args = {"name": "a", "first_row": 0, "rows": 1, "source": "s", "character": "c", **kwargs}
    with pytest.raises(DumpFormatError) as err:
        DocInfo(**args)
    assert err.value.field == field


def test_docinfo_normalizes_numpy_ints_and_tag_lists():
    doc = DocInfo("a", np.int64(2), np.int32(3), "s", "c", ["x"])
    assert (doc.first_row, doc.rows, doc.tags) == (2, 3, ("x",)) and type(doc.rows) is int


def test_other_arguments_are_checked(tmp_path, make_fields, make_docs, dims):
    args = dict(layer=47, fields=make_fields("hc4"), docs=make_docs())
    for kwargs, field in [({"arch": "llama"}, "arch"), ({"arch": "hc4", "meta": {"x": object()}}, "meta"),
                          ({"arch": "hc4", "model_sha256": "xyz"}, "model_sha256"),
                          ({"arch": "hc4", "layer": -1}, "layer")]:
        with pytest.raises(DumpFormatError) as err:
            write_dump(tmp_path / "d", **{**args, **kwargs})
        assert err.value.field == field
    with pytest.raises(DumpFormatError) as err:
        write_dump(tmp_path / "d", arch="hc4", expect=DumpExpect(n=dims["n"], h=dims["h"] + 1, vocab=50), **args)
    assert err.value.field == "hh" and "from the model" in err.value.message
    assert os.listdir(tmp_path) == []


def test_extra_float_fields_are_stored_and_listed(tmp_path, make_fields, make_docs, dims):
    T = dims["T"]
    fields = make_fields("rmsnorm", post_norm=np.ones((T, dims["n"])), scale=np.arange(T))
    dump = read_dump(write_dump(tmp_path / "d", arch="rmsnorm", layer=3, fields=fields, docs=make_docs()))
    assert dump.fields["post_norm"].dtype == np.float32 and dump.fields["scale"].shape == (T,)
    assert dump.manifest.fields["post_norm"] == "post_norm.npy"


def test_progress_reaches_total(tmp_path, make_fields, make_docs):
    seen = []
    write_dump(tmp_path / "d", arch="hc4", layer=47, fields=make_fields("hc4"), docs=make_docs(),
               progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] and all(a <= b for (a, _), (b, _) in zip(seen, seen[1:]))
