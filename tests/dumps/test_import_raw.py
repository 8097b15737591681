"""dump import: raw little-endian files + dump.toml -> a v1 dump (hashes, documents, next, roles)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from exactedit.dumps import ROLE_ANCHOR, DumpFormatError, read_dump
from exactedit.dumps.import_raw import import_raw

T, S, N, H = 6, 4, 8, 5


def _raw(tmp_path, arrays: dict, dtypes: dict, extra: str = "", shapes: dict | None = None):
    d = tmp_path / "raw"
    d.mkdir(exist_ok=True)
    lines = ['arch = "hc4"', "layer = 47", extra]
    for name, a in arrays.items():
        dt = dtypes.get(name, "float32")
        disk = "<u2" if dt == "bfloat16" else np.dtype(dt).newbyteorder("<")
        a.astype(disk).tofile(d / f"{name}.bin")
        shape = (shapes or {}).get(name, ["T", *a.shape[1:]])
        lines += [f"[fields.{name}]", f'file = "{name}.bin"', f'dtype = "{dt}"', f"shape = {list(shape)!r}".replace("'", '"')]
    (d / "dump.toml").write_text("\n".join(lines) + "\n")
    return d


def _hc4(rng):
    return {"tokens": np.array([3, 1, 4, 1, 5, 9], np.int32), "R": rng.standard_normal((T, S, N)).astype(np.float32),
            "inj": rng.standard_normal((T, S)).astype(np.float32), "hh": rng.standard_normal((T, H)).astype(np.float32),
            "sgv": rng.standard_normal(T).astype(np.float32), "yr": rng.standard_normal((T, N)).astype(np.float32)}


def test_hc4_round_trip_with_docs_next_and_roles(tmp_path):
    rng = np.random.default_rng(0)
    arrays = _hc4(rng)
    docs = ('[[docs]]\nname = "a"\nrows = 4\nsource = "prod"\ntags = ["chat"]\n'
            '[[docs]]\nname = "b"\nrows = 2\ntags = ["anchor", "plain"]\n')
    src = _raw(tmp_path, arrays, {"tokens": "int32"})
    (src / "dump.toml").write_text((src / "dump.toml").read_text() + docs)
    out = import_raw(src, tmp_path / "dump", roles=lambda toks: np.full(toks.size, 1, np.uint8))
    d = read_dump(out, verify_hashes=True)
    for name, a in arrays.items():
        np.testing.assert_array_equal(np.asarray(d.field(name)), a)
    assert np.asarray(d.field("next")).tolist() == [1, 4, 1, -1, 9, -1]
    assert [(x.name, x.rows, x.source, x.tags) for x in d.docs] == [("a", 4, "prod", ("chat",)),
                                                                   ("b", 2, "raw", ("anchor", "plain"))]
    assert np.asarray(d.roles).tolist() == [1, 1, 1, 1, 1 | ROLE_ANCHOR, 1 | ROLE_ANCHOR]
    assert d.manifest.meta["import"]["roles"] == "inferred"


def test_dtypes_are_widened_exactly(tmp_path):
    rng = np.random.default_rng(1)
    arrays = _hc4(rng)
    arrays["R"] = arrays["R"].astype(np.float16).astype(np.float32)
    bf = (arrays["hh"].view(np.uint32) >> 16).astype(np.uint16)
    raw = dict(arrays, R=arrays["R"].astype(np.float16), hh=bf, tokens=arrays["tokens"].astype(np.int64))
    src = _raw(tmp_path, raw, {"R": "float16", "hh": "bfloat16", "tokens": "int64"})
    d = read_dump(import_raw(src, tmp_path / "dump"))
    np.testing.assert_array_equal(np.asarray(d.field("R")), arrays["R"])
    np.testing.assert_array_equal(np.asarray(d.field("hh")), (bf.astype(np.uint32) << 16).view(np.float32))
    assert len(d.docs) == 1 and d.docs[0].name.startswith("raw-") and d.roles is None


def test_rmsnorm(tmp_path):
    rng = np.random.default_rng(2)
    arrays = {"tokens": np.arange(T, dtype=np.int32), "R": rng.standard_normal((T, N)).astype(np.float32),
              "hh": rng.standard_normal((T, H)).astype(np.float32)}
    src = _raw(tmp_path, arrays, {"tokens": "int32"})
    (src / "dump.toml").write_text((src / "dump.toml").read_text().replace('arch = "hc4"', 'arch = "rmsnorm"'))
    assert read_dump(import_raw(src, tmp_path / "dump")).rows == T


@pytest.mark.parametrize("mutate,match", [
    (lambda d: (d / "R.bin").write_bytes((d / "R.bin").read_bytes()[:-4]), r"R: \d+ bytes, but float32 \[6, 4, 8\] needs 768"),
    (lambda d: (d / "yr.bin").unlink(), "yr: no such file"),
    (lambda d: (d / "dump.toml").write_text((d / "dump.toml").read_text().replace('dtype = "float32"', 'dtype = "f4"', 1)),
     "dtype: expected one of"),
    (lambda d: (d / "dump.toml").write_text((d / "dump.toml").read_text().replace('arch = "hc4"', 'arch = "x"')),
     "arch: expected one of"),
    (lambda d: (d / "dump.toml").write_text((d / "dump.toml").read_text() + "[[docs]]\nname = \"a\"\nrows = 5\n"),
     "documents cover 5 rows"),
    (lambda d: (d / "dump.toml").write_text((d / "dump.toml").read_text().replace('file = "yr.bin"', 'file = "../yr.bin"')),
     "inside the directory"),
    (lambda d: (d / "tokens.bin").write_bytes((d / "tokens.bin").read_bytes() + b"\0"), "whole number"),
], ids=["short-file", "missing-file", "bad-dtype", "bad-arch", "docs-rows", "escape", "tokens-size"])
def test_clear_errors(tmp_path, mutate, match):
    src = _raw(tmp_path, _hc4(np.random.default_rng(3)), {"tokens": "int32"})
    mutate(src)
    with pytest.raises(DumpFormatError, match=match):
        import_raw(src, tmp_path / "dump")
    assert not (tmp_path / "dump").exists()


# ---- the spec checked whole, links kept inside, fields copied in bounded memory -----------

def _spec(src, text_from=None, **replace):
    t = (src / "dump.toml").read_text()
    for old, new in replace.items():
        t = t.replace(old, new)
    (src / "dump.toml").write_text(t + (text_from or ""))


@pytest.mark.parametrize("extra,field,near", [
    ("lyer = 3\n", "lyer", "layer"),
    ("model_sha = \"x\"\n", "model_sha", "model_sha256"),
    ("[[docs]]\nname = \"a\"\nrows = 6\ntgas = [\"x\"]\n", "docs[0].tgas", "tags"),
])
def test_unknown_keys_name_the_nearest(tmp_path, extra, field, near):
    src = _raw(tmp_path, _hc4(np.random.default_rng(4)), {"tokens": "int32"})
    t = (src / "dump.toml").read_text()
    (src / "dump.toml").write_text(extra + t if "docs" not in extra else t + extra)
    with pytest.raises(DumpFormatError, match=f"did you mean {near!r}") as err:
        import_raw(src, tmp_path / "dump")
    assert err.value.field == field


def test_unknown_field_key(tmp_path):
    src = _raw(tmp_path, _hc4(np.random.default_rng(4)), {"tokens": "int32"})
    _spec(src, **{'file = "yr.bin"': 'file = "yr.bin"\ndtpye = "float32"'})
    with pytest.raises(DumpFormatError, match="did you mean 'dtype'") as err:
        import_raw(src, tmp_path / "dump")
    assert err.value.field == "fields.yr.dtpye"


@pytest.mark.parametrize("docs,field", [
    ('name = "a"\nrows = 6\ntags = "style"\n', "docs[0].tags"),
    ('name = "a"\nrows = 6\nsource = 3\n', "docs[0].source"),
    ('name = 7\nrows = 6\n', "docs[0].name"),
    ('name = "a"\nrows = 6\ntags = ["x", 1]\n', "docs[0].tags"),
])
def test_doc_types_are_checked(tmp_path, docs, field):
    src = _raw(tmp_path, _hc4(np.random.default_rng(4)), {"tokens": "int32"})
    _spec(src, "[[docs]]\n" + docs)
    with pytest.raises(DumpFormatError) as err:
        import_raw(src, tmp_path / "dump")
    assert err.value.field == field


def test_model_sha256_must_be_hex(tmp_path):
    src = _raw(tmp_path, _hc4(np.random.default_rng(4)), {"tokens": "int32"})
    (src / "dump.toml").write_text('model_sha256 = "abc"\n' + (src / "dump.toml").read_text())
    with pytest.raises(DumpFormatError, match="64 lowercase hex") as err:
        import_raw(src, tmp_path / "dump")
    assert err.value.field == "model_sha256"


def test_links_out_of_the_directory_are_refused(tmp_path):
    import os

    src = _raw(tmp_path, _hc4(np.random.default_rng(5)), {"tokens": "int32"})
    outside = tmp_path / "secret.bin"
    os.replace(src / "yr.bin", outside)
    (src / "yr.bin").symlink_to(outside)
    with pytest.raises(DumpFormatError, match="leads out of the directory") as err:
        import_raw(src, tmp_path / "dump")
    assert err.value.field == "fields.yr.file"
    (src / "sub").mkdir()
    os.replace(outside, src / "sub" / "yr.bin")
    (src / "yr.bin").unlink()
    (src / "yr.bin").symlink_to(src / "sub" / "yr.bin")           # a link that stays inside is fine
    assert read_dump(import_raw(src, tmp_path / "dump")).rows == T


def test_a_fifo_field_is_refused_without_blocking(tmp_path):
    import os

    src = _raw(tmp_path, _hc4(np.random.default_rng(5)), {"tokens": "int32"})
    (src / "yr.bin").unlink()
    os.mkfifo(src / "yr.bin")
    with pytest.raises(DumpFormatError, match="not a regular file"):
        import_raw(src, tmp_path / "dump")


def test_given_next_must_follow_the_tokens(tmp_path):
    arrays = _hc4(np.random.default_rng(6))
    good = np.array([1, 4, 1, 5, 9, 2], np.int32)                 # the last row: a token the engine saw
    src = _raw(tmp_path, {**arrays, "next": good}, {"tokens": "int32", "next": "int32"})
    assert np.asarray(read_dump(import_raw(src, tmp_path / "ok")).next).tolist() == good.tolist()
    src = _raw(tmp_path, {**arrays, "next": np.array([1, 4, 7, 5, 9, -1], np.int32)},
               {"tokens": "int32", "next": "int32"})
    with pytest.raises(DumpFormatError, match=r"row 2 .*next 7, but the document's next token is 1"):
        import_raw(src, tmp_path / "dump")
    _spec(src, '[[docs]]\nname = "a"\nrows = 3\n[[docs]]\nname = "b"\nrows = 3\n')   # row 2 ends document a
    assert read_dump(import_raw(src, tmp_path / "split")).rows == T


@pytest.mark.parametrize("bits", [1 | 2, 4, 8 | 1, 2 | 4 | 16])
def test_contradictory_role_bits_are_refused(tmp_path, bits):
    arrays = _hc4(np.random.default_rng(7))
    roles = np.array([1, 2, 2 | 4, 2 | 8, 1 | 64, 2 | 16 | 128], np.uint8)
    src = _raw(tmp_path, {**arrays, "roles": roles}, {"tokens": "int32", "roles": "uint8"})
    assert np.asarray(read_dump(import_raw(src, tmp_path / "ok")).roles).tolist() == roles.tolist()
    roles[3] = bits
    src = _raw(tmp_path, {**arrays, "roles": roles}, {"tokens": "int32", "roles": "uint8"})
    with pytest.raises(DumpFormatError, match="row 3: bits") as err:
        import_raw(src, tmp_path / "dump")
    assert err.value.field == "roles"


def test_tokens_outside_the_model_name_the_file_before_roles_are_read(tmp_path):
    from exactedit.dumps import DumpExpect

    src = _raw(tmp_path, _hc4(np.random.default_rng(8)), {"tokens": "int32"})
    called = []
    with pytest.raises(DumpFormatError, match=r"row 5: token id 9; expected \[0, 9\)") as err:
        import_raw(src, tmp_path / "dump", roles=called.append, expect=DumpExpect(n=N, h=H, vocab=9, streams=S))
    assert err.value.path.endswith("tokens.bin") and not called


def test_narrowing_is_range_checked(tmp_path):
    arrays = _hc4(np.random.default_rng(9))
    arrays["tokens"] = arrays["tokens"].astype(np.int64)
    arrays["tokens"][4] = 2 ** 40
    src = _raw(tmp_path, arrays, {"tokens": "int64"})
    with pytest.raises(DumpFormatError, match="row 4: value 1099511627776 does not fit int32"):
        import_raw(src, tmp_path / "dump")


def test_fields_are_copied_in_bounded_memory(tmp_path, monkeypatch):
    """A 42 MB float16 -> float32 field: converted in 1 MB chunks, never held whole (the old import
    read the file and its float32 copy: 63 MB)."""
    import tracemalloc

    from exactedit.dumps import import_raw as mod

    monkeypatch.setattr(mod, "CHUNK_BYTES", 1 << 20)
    Tb, Nb = 2560, 1024
    rng = np.random.default_rng(10)
    arrays = {"tokens": rng.integers(0, 50, Tb).astype(np.int32),
              "R": rng.standard_normal((Tb, S, Nb)).astype(np.float16), "inj": np.ones((Tb, S), np.float32),
              "hh": np.ones((Tb, H), np.float32), "sgv": np.ones(Tb, np.float32), "yr": np.ones((Tb, Nb), np.float32)}
    src = _raw(tmp_path, arrays, {"tokens": "int32", "R": "float16"})
    tracemalloc.start()
    try:
        out = import_raw(src, tmp_path / "dump")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, f"peak {peak / 2**20:.1f} MiB"
    d = read_dump(out)
    assert np.array_equal(np.asarray(d.field("R")), arrays["R"].astype(np.float32))
    assert not list(tmp_path.glob(".dump.import-*"))            # the scratch copy is gone


_TOML = st.recursive(st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False)
                     | st.sampled_from(["T", "tokens.bin", "../R.bin", "/etc/passwd", "R.bin", "int64", "bfloat16",
                                        "hc4", "", "style", "a" * 300])
                     | st.text(max_size=6),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=2),
                     max_leaves=5)


def _paths(obj, at=()):
    yield at
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from _paths(v, at + (k,))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=st.sampled_from(["value", "drop", "add", "byte"]), pick=st.integers(0, 10 ** 6), value=_TOML,
       key=st.text(max_size=6), pos=st.integers(0, 10 ** 6), byte=st.integers(0, 255))
@example(how="value", pick=0, value="style", key="", pos=0, byte=0)
@example(how="value", pick=1091, value=[], key="", pos=0, byte=0)        # dtype = []: unhashable
def test_mutated_spec_gives_our_error(tmp_path_factory, how, pick, value, key, pos, byte):
    """dump.toml mutated (a value replaced, a key dropped or added, a byte changed): a v1 dump or
    our DumpFormatError, nothing else."""
    import tomli_w
    import tomllib

    tmp = tmp_path_factory.mktemp("fz")
    src = _raw(tmp, _hc4(np.random.default_rng(11)), {"tokens": "int32"})
    _spec(src, '[[docs]]\nname = "a"\nrows = 4\ntags = ["chat"]\n[[docs]]\nname = "b"\nrows = 2\n')
    if how == "byte":
        data = bytearray((src / "dump.toml").read_bytes())
        data[pos % len(data)] = byte
        (src / "dump.toml").write_bytes(bytes(data))
    else:
        spec = tomllib.loads((src / "dump.toml").read_text())
        paths = [p for p in _paths(spec) if p] if how != "add" else [p for p in _paths(spec)
                                                                       if isinstance(_at(spec, p), dict)]
        path = paths[pick % len(paths)]
        if how == "add":
            _at(spec, path)[key] = value
        elif how == "drop":
            del _at(spec, path[:-1])[path[-1]]
        else:
            _at(spec, path[:-1])[path[-1]] = value
        try:
            (src / "dump.toml").write_text(tomli_w.dumps(spec))
        except (TypeError, ValueError):                # tomli_w cannot write it (e.g. a list of tables mixed)
            return
    try:
        out = import_raw(src, tmp / "dump")
    except DumpFormatError:
        return
    assert read_dump(out).rows >= 1


def _at(obj, path):
    for k in path:
        obj = obj[k]
    return obj
