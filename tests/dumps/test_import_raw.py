"""dump import: raw little-endian files + dump.toml -> a v1 dump (hashes, documents, next, roles)."""
from __future__ import annotations

import numpy as np
import pytest

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
