"""Fuzz the reader: hand-made evil dumps and random mutations of valid ones. The only acceptable
outcomes are a valid Dump or a DumpFormatError naming the dump and a field; never another error."""
from __future__ import annotations

import io
import json
import pickle
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactedit.dumps import DumpExpect, DumpFormatError, read_dump


def _manifest(path: Path, **changes) -> None:
    """Rewrite manifest.json with top-level keys changed (a value of ... deletes the key)."""
    obj = json.loads((path / "manifest.json").read_text())
    for key, value in changes.items():
        if value is ...:
            del obj[key]
        else:
            obj[key] = value(obj) if callable(value) else value
    (path / "manifest.json").write_text(json.dumps(obj))


def _npy(path: Path, name: str, arr: np.ndarray) -> None:
    """Replace a field file with `arr` saved as-is (any dtype, order)."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=True)
    (path / f"{name}.npy").write_bytes(buf.getvalue())


def _raw(path: Path, name: str, edit) -> None:
    file = path / f"{name}.npy"
    file.write_bytes(edit(file.read_bytes()))


def _doc(i: int, **changes):
    def change(obj):
        obj["docs"][i].update(changes)
        return obj["docs"]
    return change


def _header(descr: str, shape) -> bytes:
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    text += " " * (63 - (len(text) + 10) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


T, N, H, S = 12, 8, 6, 4
EVIL = [
    # (case, mutation of a valid hc4 dump directory, field the error must name)
    ("no manifest", lambda p: (p / "manifest.json").unlink(), "manifest.json"),
    ("manifest not json", lambda p: (p / "manifest.json").write_text("{'format': 1"), "manifest.json"),
    ("manifest not utf-8", lambda p: (p / "manifest.json").write_bytes(b"\xff\xfe{}"), "manifest.json"),
    ("manifest a list", lambda p: (p / "manifest.json").write_text("[1, 2]"), "manifest"),
    ("manifest NaN", lambda p: (p / "manifest.json").write_text('{"rows": NaN}'), "manifest.json"),
    ("manifest deep", lambda p: (p / "manifest.json").write_text("[" * 100000 + "]" * 100000), "manifest.json"),
    ("wrong format", lambda p: _manifest(p, format="npz"), "format"),
    ("version 2", lambda p: _manifest(p, version=2), "version"),
    ("version string", lambda p: _manifest(p, version="1"), "version"),
    ("version true", lambda p: _manifest(p, version=True), "version"),
    ("arch unknown", lambda p: _manifest(p, arch="llama"), "arch"),
    ("rows zero", lambda p: _manifest(p, rows=0), "rows"),
    ("rows float", lambda p: _manifest(p, rows=12.0), "rows"),
    ("rows too many", lambda p: _manifest(p, rows=13), "docs"),
    ("layer negative", lambda p: _manifest(p, layer=-1), "layer"),
    ("unknown key", lambda p: _manifest(p, extra=1), "extra"),
    ("no docs key", lambda p: _manifest(p, docs=...), "docs"),
    ("model sha bad", lambda p: _manifest(p, model_sha256="A" * 64), "model_sha256"),
    ("meta a list", lambda p: _manifest(p, meta=[1]), "meta"),
    ("fields a list", lambda p: _manifest(p, fields=["R.npy"]), "fields"),
    ("required field dropped", lambda p: _manifest(p, fields=lambda o: {k: v for k, v in o["fields"].items()
                                                                          if k != "yr"}), "fields.yr"),
    ("path traversal", lambda p: _manifest(p, fields=lambda o: {**o["fields"], "R": "../R.npy"}), "fields.R"),
    ("absolute path", lambda p: _manifest(p, fields=lambda o: {**o["fields"], "R": "/etc/passwd"}), "fields.R"),
    ("file name not str", lambda p: _manifest(p, fields=lambda o: {**o["fields"], "R": 3}), "fields.R"),
    ("two fields one file", lambda p: _manifest(p, fields=lambda o: {**o["fields"], "yr": "R.npy"}), "fields"),
    ("file missing", lambda p: (p / "inj.npy").unlink(), "inj"),
    ("file is a directory", lambda p: ((p / "inj.npy").unlink(), (p / "inj.npy").mkdir()), "inj"),
    ("sha256 lacks a field", lambda p: _manifest(p, sha256=lambda o: {k: v for k, v in o["sha256"].items()
                                                                        if k != "hh"}), "sha256.hh"),
    ("sha256 not hex", lambda p: _manifest(p, sha256=lambda o: {**o["sha256"], "hh": "z" * 64}), "sha256.hh"),
    ("docs overlap", lambda p: _manifest(p, docs=_doc(1, first_row=3, rows=T - 3)), "docs.anchor-plain"),
    ("docs gap", lambda p: _manifest(p, docs=_doc(1, first_row=5, rows=T - 5)), "docs"),
    ("doc past end", lambda p: _manifest(p, docs=_doc(1, rows=T)), "docs.anchor-plain"),
    ("doc rows string", lambda p: _manifest(p, docs=_doc(0, rows="4")), "docs[0].rows"),
    ("doc tags string", lambda p: _manifest(p, docs=_doc(0, tags="style")), "docs[0].tags"),
    ("doc tags numbers", lambda p: _manifest(p, docs=_doc(0, tags=[1])), "docs[0].tags"),
    ("doc unknown key", lambda p: _manifest(p, docs=_doc(0, colour="red")), "docs[0].colour"),
    ("doc not object", lambda p: _manifest(p, docs=lambda o: [1] + o["docs"][1:]), "docs[0]"),
    ("npy truncated", lambda p: _raw(p, "R", lambda b: b[:-5]), "R"),
    ("npy trailing bytes", lambda p: _raw(p, "R", lambda b: b + b"\0" * 4), "R"),
    ("npy empty file", lambda p: _raw(p, "R", lambda b: b""), "R"),
    ("npy header only", lambda p: _raw(p, "R", lambda b: b[:9]), "R"),
    ("npy bad magic", lambda p: _raw(p, "R", lambda b: b"\x93NUMPZ" + b[6:]), "R"),
    ("npy version 3", lambda p: _raw(p, "R", lambda b: b[:6] + b"\x03\x00" + b[8:]), "R"),
    ("npy header garbage", lambda p: _raw(p, "R", lambda b: b[:10] + b"{__import__('os')}" + b[28:]), "R"),
    ("npy negative dim", lambda p: _raw(p, "sgv", lambda b: _header("<f4", (-12,)) + b[128:]), "sgv"),
    ("npy structured dtype", lambda p: _raw(p, "sgv", lambda b: _header("[('a', '<f4')]", (T,)) + b[128:]), "sgv"),
    ("npy bogus dtype", lambda p: _raw(p, "sgv", lambda b: _header("<q9", (T,)) + b[128:]), "sgv"),
    ("pickle not npy", lambda p: _raw(p, "R", lambda b: pickle.dumps([1, 2])), "R"),
    ("object array", lambda p: _npy(p, "R", np.array([[None] * N] * T, dtype=object)), "R"),
    ("float64 R", lambda p: _npy(p, "R", np.zeros((T, S, N))), "R"),
    ("big-endian R", lambda p: _npy(p, "R", np.zeros((T, S, N), ">f4")), "R"),
    ("fortran R", lambda p: _npy(p, "yr", np.asfortranarray(np.zeros((T, N), "<f4"))), "yr"),
    ("int64 tokens", lambda p: _npy(p, "tokens", np.zeros(T, np.int64)), "tokens"),
    ("float roles", lambda p: _npy(p, "roles", np.zeros(T, np.float32)), "roles"),
    ("R 2-D", lambda p: _npy(p, "R", np.zeros((T, S * N), "<f4")), "R"),
    ("R zero streams", lambda p: _npy(p, "R", np.zeros((T, 0, N), "<f4")), "R"),
    ("inj streams differ", lambda p: _npy(p, "inj", np.zeros((T, S + 1), "<f4")), "inj"),
    ("hh rows differ", lambda p: _npy(p, "hh", np.zeros((T + 1, H), "<f4")), "hh"),
    ("sgv scalar", lambda p: _npy(p, "sgv", np.zeros((), "<f4")), "sgv"),
    ("NaN row", lambda p: _npy(p, "yr", np.where(np.arange(T)[:, None] == 7, np.nan, 0).astype("<f4")
                               * np.ones((1, N), "<f4")), "yr"),
    ("inf value", lambda p: _npy(p, "inj", np.full((T, S), np.inf, "<f4")), "inj"),
    ("token out of vocab", lambda p: _npy(p, "tokens", np.full(T, 50, "<i4")), "tokens"),
    ("token negative", lambda p: _npy(p, "tokens", np.full(T, -1, "<i4")), "tokens"),
    ("next below -1", lambda p: _npy(p, "next", np.full(T, -7, "<i4")), "next"),
    ("extra field int", lambda p: (_npy(p, "x", np.zeros(T, "<i4")),
                                   _manifest(p, fields=lambda o: {**o["fields"], "x": "x.npy"},
                                             sha256=lambda o: {**o["sha256"], "x": "0" * 64})), "x"),
]


@pytest.mark.parametrize("case, mutate, field", EVIL, ids=[c[0] for c in EVIL])
def test_evil_dumps_raise_dump_format_error(tmp_path, make_dump, case, mutate, field):
    path = make_dump(tmp_path / "d")
    mutate(path)
    with pytest.raises(DumpFormatError) as err:
        read_dump(path, DumpExpect(n=N, h=H, vocab=50))
    assert err.value.field == field, str(err.value)
    assert str(err.value).startswith(str(path))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, make_dump):
    """One valid dump's files, as bytes, to mutate in memory."""
    path = make_dump(tmp_path_factory.mktemp("pristine") / "d")
    return {f.name: f.read_bytes() for f in path.iterdir()}


def _read_mutated(pristine: dict[str, bytes], name: str, data: bytes, verify_hashes: bool = True) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d"
        path.mkdir()
        for file, content in pristine.items():
            (path / file).write_bytes(data if file == name else content)
        try:
            read_dump(path, DumpExpect(n=N, h=H, vocab=50), verify_hashes=verify_hashes)
        except DumpFormatError as err:
            assert err.path == str(path) and err.field


_mutation = st.tuples(st.sampled_from(["flip", "cut", "insert", "set"]), st.integers(0, 1 << 20),
                      st.binary(min_size=1, max_size=8))


def _mutate(data: bytes, edits) -> bytes:
    out = bytearray(data)
    for kind, pos, blob in edits:
        pos %= max(1, len(out))
        if kind == "flip" and out:
            out[pos] ^= blob[0] or 1
        elif kind == "cut":
            del out[pos:pos + len(blob)]
        elif kind == "insert":
            out[pos:pos] = blob
        else:
            out[pos:pos + len(blob)] = blob
    return bytes(out)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["manifest.json", "R.npy", "tokens.npy", "roles.npy", "sgv.npy"]),
       st.lists(_mutation, min_size=1, max_size=4), st.booleans())
@example("manifest.json", [("set", 0, b"\x00")], True)
@example("R.npy", [("cut", 8, b"\x00\x00")], True)
@example("R.npy", [("set", 20, b"\\K")], False)  # odd escape in the header literal
@example("sgv.npy", [("set", 1 << 20, b"\xff\xff\xff\xff")], False)  # NaN in the data
def test_byte_mutations_only_raise_our_error(pristine, name, edits, verify_hashes):
    """verify_hashes=False lets mutated data (not only headers) reach the value checks."""
    _read_mutated(pristine, name, _mutate(pristine[name], edits), verify_hashes)


_json = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False)
                     | st.text(max_size=8), lambda kids: st.lists(kids, max_size=3)
                     | st.dictionaries(st.text(max_size=6), kids, max_size=3), max_leaves=8)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(st.sampled_from(
    ["format", "version", "arch", "layer", "rows", "fields", "sha256", "docs", "meta", "model_sha256", 0, 1,
     "R", "tokens", "name", "first_row", "rows", "tags", "x"]), min_size=1, max_size=3), _json),
    min_size=1, max_size=3))
@example([(["docs", 0, "first_row"], 2 ** 70)])
@example([(["rows"], 2 ** 64)])
def test_manifest_value_mutations_only_raise_our_error(pristine, edits):
    obj = json.loads(pristine["manifest.json"])
    for keys, value in edits:
        node = obj
        for key in keys[:-1]:
            if isinstance(node, dict) and isinstance(key, str) and isinstance(node.get(key), (dict, list)):
                node = node[key]
            elif isinstance(node, list) and isinstance(key, int) and key < len(node):
                node = node[key]
        last = keys[-1]
        if isinstance(node, dict) and isinstance(last, str):
            node[last] = value
        elif isinstance(node, list) and isinstance(last, int) and last < len(node):
            node[last] = value
    _read_mutated(pristine, "manifest.json", json.dumps(obj).encode())
