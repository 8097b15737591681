"""dumps.verify: a dump's sha256 is the identity of its data. Tampered field bytes under an
untouched manifest are refused by default (naming dump and field), a cache the caller owns skips
re-hashing only while nothing changed, and `dump inspect` verifies unless --no-verify (recorded)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.dumps import DumpFormatError, VerifyCache, read_dump
from exactedit.dumps.verify import verify_key


def _scale_r(path, factor=3.0, zero_cols=50):
    """The audit's attack: R.npy scaled and some of its columns zeroed, manifest untouched."""
    r = np.load(path / "R.npy")
    r = r * factor
    r[..., :zero_cols] = 0.0
    np.save(path / "R.npy", r.astype("<f4"))


def test_default_open_verifies_and_identity_covers_data(tmp_path, make_dump):
    path = make_dump(tmp_path / "d")
    d = read_dump(path)
    assert d.verified
    before = d.sha256()
    _scale_r(path)
    with pytest.raises(DumpFormatError) as err:
        read_dump(path)
    assert err.value.field == "R" and err.value.path == str(path)
    assert "R.npy: sha256" in err.value.message and "differs from the manifest's" in err.value.message
    unverified = read_dump(path, verify_hashes=False)  # opting out still parses, and says so
    assert not unverified.verified and unverified.sha256() == before


def test_forged_manifest_hash_is_refused(tmp_path, make_dump):
    path = make_dump(tmp_path / "d")
    m = json.loads((path / "manifest.json").read_text())
    m["sha256"]["R"] = "0" * 64
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DumpFormatError, match=r": R: R.npy: sha256 [0-9a-f]{64} differs from the manifest's 0{64}"):
        read_dump(path, check_finite=False)


def test_cache_skips_unchanged_dumps_only(tmp_path, make_dump):
    path = make_dump(tmp_path / "d")
    cache = VerifyCache()
    read_dump(path, cache=cache)
    first = cache.hashed_bytes
    assert first == sum(os.path.getsize(path / f) for f in read_dump(path).manifest.fields.values())
    read_dump(path, cache=cache)
    assert (cache.hits, cache.hashed_bytes) == (1, first)  # the second open hashed nothing
    _scale_r(path)  # same size, new bytes: the file's stat changes, so the cache misses
    with pytest.raises(DumpFormatError, match="R.npy: sha256"):
        read_dump(path, cache=cache)
    assert cache.hits == 1


def test_cache_key_sees_a_same_size_rewrite(tmp_path, make_dump):
    path = make_dump(tmp_path / "d")
    d = read_dump(path)
    key = verify_key(path, d.sha256(), d.manifest.fields)
    data = (path / "hh.npy").read_bytes()
    (path / "hh.npy").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert verify_key(path, d.sha256(), d.manifest.fields) != key


def test_progress_counts_hashing_and_the_value_scan(tmp_path, make_dump):
    path = make_dump(tmp_path / "d")
    seen = []
    read_dump(path, progress=lambda done, total: seen.append((done, total)))
    totals = {t for _, t in seen}
    files = sum(os.path.getsize(p) for p in path.glob("*.npy"))
    assert len(totals) == 1 and totals.pop() > files  # hash bytes (whole files) + scanned data bytes
    assert seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_cli_dump_inspect_verifies_by_default(tmp_path, make_dump):
    path = make_dump(tmp_path / "d")
    run = CliRunner()
    ok = run.invoke(main, ["dump", "inspect", str(path), "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["hashes_verified"]
    _scale_r(path)
    bad = run.invoke(main, ["dump", "inspect", str(path)])
    assert bad.exit_code == 1 and "Traceback" not in bad.output
    assert f"{path}: R: R.npy: sha256" in bad.output
    skipped = run.invoke(main, ["dump", "inspect", str(path), "--json", "--no-verify"])
    assert skipped.exit_code == 0, skipped.output
    assert json.loads(skipped.stdout)["hashes_verified"] is False
    text = run.invoke(main, ["dump", "inspect", str(path), "--no-verify"])
    assert "NOT verified" in text.output
