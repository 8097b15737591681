"""read_dump: memory-mapped and read-only, checked against a model, row selection by docs and roles."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from exactedit.dumps import (
    ROLE_ANCHOR, ROLE_REPLY, ROLE_THINK, DumpExpect, DumpFormatError, read_dump, write_dump,
)
from exactedit.dumps.summary import format_table, inspect_dump


def test_fields_are_read_only_memmaps(tmp_path, make_dump, dims):
    dump = read_dump(make_dump(tmp_path / "d"))
    assert isinstance(dump.R, np.memmap) and dump.R.shape == (dims["T"], dims["S"], dims["n"])
    with pytest.raises(ValueError, match="read-only"):
        dump.R[0, 0, 0] = 1.0
    with pytest.raises(TypeError):
        dump.fields["R"] = np.zeros(1)
    assert dict(dump.dims) == {"S": dims["S"], "n": dims["n"], "h": dims["h"]}
    assert (dump.arch, dump.layer, dump.rows, dump.meta["n_batch"]) == ("hc4", 47, dims["T"], 512)


@pytest.mark.parametrize("arch", ["hc4", "rmsnorm"])
def test_matching_model_expectation_passes(tmp_path, make_dump, dims, arch):
    dump = read_dump(make_dump(tmp_path / "d", arch=arch),
                     DumpExpect(dims["n"], dims["h"], dims["vocab"], dims["S"], arch, 47 if arch == "hc4" else 23))
    assert dump.arch == arch


EXPECT_MISMATCHES = [
    # (case, DumpExpect overrides, field named, words)
    ("width", {"n": 9}, "R", "n=9 (from the model)"),
    ("hidden", {"h": 7}, "hh", "h=7 (from the model)"),
    ("streams", {"streams": 2}, "R", "S=2 (from the model)"),
    ("vocab", {"vocab": 3}, "tokens", "expected [0, 3)"),
    ("arch", {"arch": "rmsnorm"}, "arch", "expects a 'rmsnorm' dump"),
    ("layer", {"layer": 12}, "layer", "edited layer is 12"),
]


@pytest.mark.parametrize("case, overrides, field, words", EXPECT_MISMATCHES, ids=[c[0] for c in EXPECT_MISMATCHES])
def test_model_mismatch_names_field(tmp_path, make_dump, dims, case, overrides, field, words):
    path = make_dump(tmp_path / "d")
    expect = DumpExpect(**{"n": dims["n"], "h": dims["h"], "vocab": dims["vocab"], **overrides})
    with pytest.raises(DumpFormatError) as err:
        read_dump(path, expect)
    assert err.value.field == field and words in err.value.message and str(path) in str(err.value)


@pytest.mark.parametrize("kwargs", [{"n": 0}, {"vocab": -1}, {"streams": 0}, {"arch": "x"}, {"layer": -1},
                                    {"h": 1.5}])
def test_expect_validates(kwargs):
    with pytest.raises(DumpFormatError):
        DumpExpect(**{"n": 1, "h": 1, "vocab": 1, **kwargs})


def test_unknown_next_is_allowed_and_next_is_range_checked(tmp_path, make_fields, make_docs, dims):
    T, V = dims["T"], dims["vocab"]
    fields = make_fields("hc4", next=np.full(T, -1))
    dump = read_dump(write_dump(tmp_path / "a", arch="hc4", layer=47, fields=fields, docs=make_docs()),
                     DumpExpect(dims["n"], dims["h"], V))
    assert (np.asarray(dump.next) == -1).all()
    fields = make_fields("hc4", next=np.r_[np.zeros(T - 1, int), V])
    path = write_dump(tmp_path / "b", arch="hc4", layer=47, fields=fields, docs=make_docs())
    with pytest.raises(DumpFormatError) as err:
        read_dump(path, DumpExpect(dims["n"], dims["h"], V))
    assert err.value.field == "next" and f"row {T - 1}: token id {V}" in err.value.message


def test_arch_fields_and_missing_attributes(tmp_path, make_dump):
    dump = read_dump(make_dump(tmp_path / "d", arch="rmsnorm"))
    assert dump.R.ndim == 2 and dump.hh.ndim == 2 and dump.tokens.dtype == np.int32
    for name in ("inj", "sgv", "yr"):
        with pytest.raises(DumpFormatError) as err:
            getattr(dump, name)
        assert err.value.field == name and "rmsnorm" in err.value.message


def test_docs_and_roles_select_rows(tmp_path, make_fields, make_docs, dims):
    T = dims["T"]
    roles = np.zeros(T, np.uint8)
    roles[[1, 2, 3]] = ROLE_REPLY
    roles[2] |= ROLE_THINK
    roles[[7, 8]] = ROLE_ANCHOR
    docs = make_docs()
    dump = read_dump(write_dump(tmp_path / "d", arch="hc4", layer=47, fields=make_fields("hc4", roles=roles),
                                docs=docs))
    assert dump.doc(docs[1].name) == slice(docs[1].first_row, T)
    assert list(dump.doc_index()) == [0] * docs[0].rows + [1] * docs[1].rows
    assert list(dump.rows_where(ROLE_REPLY)) == [1, 2, 3]
    assert list(dump.rows_where(ROLE_REPLY, exclude=ROLE_THINK)) == [1, 3]
    assert list(dump.rows_where(ROLE_REPLY | ROLE_ANCHOR)) == [1, 2, 3, 7, 8]
    assert dump.role_counts()["reply"] == 3 and dump.role_counts()["think"] == 1
    with pytest.raises(DumpFormatError, match="no document named 'nope'"):
        dump.doc("nope")


def test_dump_without_roles(tmp_path, make_fields, make_docs):
    fields = make_fields("hc4", with_roles=False)
    dump = read_dump(write_dump(tmp_path / "d", arch="hc4", layer=47, fields=fields, docs=make_docs()))
    assert dump.roles is None and dump.role_counts() == {}
    with pytest.raises(DumpFormatError) as err:
        dump.rows_where(ROLE_REPLY)
    assert err.value.field == "roles"


def test_hash_verification_catches_same_size_edits(tmp_path, make_dump):
    path = make_dump(tmp_path / "d")
    data = bytearray((path / "hh.npy").read_bytes())
    data[-1] ^= 0x01  # flip a mantissa bit: still finite, same size
    (path / "hh.npy").write_bytes(bytes(data))
    assert not read_dump(path, verify_hashes=False).verified  # without verification the dump still parses
    with pytest.raises(DumpFormatError) as err:
        read_dump(path)  # verified by default
    assert err.value.field == "hh" and "differs from the manifest's" in err.value.message
    assert str(path) in str(err.value)


def test_identity_ignores_path_and_whitespace(tmp_path, make_dump):
    path = make_dump(tmp_path / "d")
    identity = read_dump(path).sha256()
    copy = tmp_path / "elsewhere"
    shutil.copytree(path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps(manifest))  # compact, different bytes
    assert read_dump(copy).sha256() == identity
    manifest["meta"]["n_batch"] = 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert read_dump(copy).sha256() != identity


def test_value_scan_can_be_skipped_and_reports_progress(tmp_path, make_dump):
    path = make_dump(tmp_path / "d")
    data = bytearray((path / "sgv.npy").read_bytes())
    data[-4:] = np.array([np.nan], "<f4").tobytes()
    (path / "sgv.npy").write_bytes(bytes(data))
    assert np.isnan(read_dump(path, check_finite=False, verify_hashes=False).sgv[-1])
    seen = []
    with pytest.raises(DumpFormatError, match="non-finite"):
        read_dump(path, verify_hashes=False, progress=lambda done, total: seen.append((done, total)))
    seen.clear()
    data[-4:] = np.array([0.5], "<f4").tobytes()
    (path / "sgv.npy").write_bytes(bytes(data))
    read_dump(path, verify_hashes=False, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] > 0


def test_summary_json_and_table(tmp_path, make_dump, dims):
    path = make_dump(tmp_path / "d")
    summary = inspect_dump(path, verify_hashes=True)
    js = summary.to_json()
    json.dumps(js)
    assert js["rows"] == dims["T"] and js["hashes_verified"] and js["sha256"] == read_dump(path).sha256()
    assert {f["name"]: f["shape"] for f in js["fields"]}["R"] == [dims["T"], dims["S"], dims["n"]]
    assert [d["name"] for d in js["docs"]] == ["train-a", "anchor-plain"]
    table = format_table(summary)
    assert "R       12x4x8  float32" in table and "anchor-plain" in table and "reply_end" in table


def test_cli_dump_inspect(tmp_path, make_dump, dims):
    from click.testing import CliRunner

    from exactedit import cli

    path = make_dump(tmp_path / "d")
    result = CliRunner().invoke(cli.main, ["dump", "inspect", str(path), "--json"])
    assert result.exit_code == 0, result.output
    js = json.loads(result.stdout)
    assert js["arch"] == "hc4" and js["rows"] == dims["T"] and js["hashes_verified"]
    result = CliRunner().invoke(cli.main, ["dump", "inspect", str(path)])
    assert result.exit_code == 0 and "anchor-plain" in result.stdout and "role" in result.stdout
    (path / "R.npy").write_bytes(b"")
    result = CliRunner().invoke(cli.main, ["dump", "inspect", str(path)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert f"{path}: R: R.npy: not an .npy file" in result.output
