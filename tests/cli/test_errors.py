"""The CLI's one error boundary: domain errors and OSErrors (missing directory, no permission, a
full disk) end in one clean line naming the path, exit 1, no traceback; and `exactedit logits`
verifies the dump's field hashes unless --no-verify, which its manifest records."""
from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.dumps import DocInfo, write_dump
from exactedit.files import atomic_write_bytes, writing
from exactedit.quant.gguf.write import synthetic_model
from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

N, H, V, T = 256, 32, 40, 6


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    model = synthetic_model(root / "m.gguf", vocab=V, n=N, h=H, layers=1, head_type="Q8_0")
    rng = np.random.default_rng(0)
    dump = write_dump(root / "d", arch="rmsnorm", layer=0, docs=[DocInfo("x", 0, T, "s", "c")],
                      fields={"tokens": np.zeros(T, int), "next": np.ones(T, int),
                              "R": rng.standard_normal((T, N)), "hh": rng.standard_normal((T, H))})
    w = np.zeros((1, N), np.float32)
    from exactedit import quant

    edit = TensorEdit("output.weight", "rows", "Q8_0", (V, N), quant.quantize(w, "Q8_0"), np.array([3]))
    bundle = write_bundle(root / "b", solver="test", inputs=[InputRef("model", str(model.path), model.sha256)],
                          config={}, edits=[edit]).path
    return model.path, dump, bundle


def _clean_failure(res, *needles):
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output and res.exception is not None
    for n in needles:
        assert n in res.output, res.output


def test_logits_and_apply_into_a_missing_directory(pair, tmp_path):
    model, dump, bundle = pair
    missing = tmp_path / "missing" / "dir"
    res = CliRunner().invoke(main, ["logits", "--model", str(model), "--dump", str(dump),
                                    "--out", str(missing / "x.npy")])
    _clean_failure(res, str(missing / "x.npy"), "No such file or directory")
    res = CliRunner().invoke(main, ["apply", str(bundle), "--model", str(model), "--out", str(missing / "x.gguf")])
    _clean_failure(res, str(missing), "No such file or directory")


def test_permission_error_names_the_path(pair, tmp_path, monkeypatch):
    import exactedit.solvers.tail.logits as logits

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", "/srv/locked/x.npy")

    monkeypatch.setattr(logits, "write_logits", denied)
    model, dump, _ = pair
    res = CliRunner().invoke(main, ["logits", "--model", str(model), "--dump", str(dump), "--out", "x.npy"])
    _clean_failure(res, "/srv/locked/x.npy: Permission denied")


def test_disk_full_names_the_file_being_written(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what fsync/write raise: no file name

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as err:
        atomic_write_bytes(tmp_path / "x.json", b"{}")
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "x.json.tmp")
    with pytest.raises(FileNotFoundError) as err, writing("elsewhere"):
        open(tmp_path / "no" / "such", "rb")
    assert err.value.filename == str(tmp_path / "no" / "such")  # a named error keeps its own name


def test_disk_full_from_the_cli(tmp_path, monkeypatch):
    from exactedit.evals.protocol.ledger import Ledger

    with Ledger.open(tmp_path / "ws") as led:
        led.append("note", "test", {}, {})

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    res = CliRunner().invoke(main, ["eval", "ledger", "--workspace", str(tmp_path / "ws"),
                                    "--export", str(tmp_path / "head.json")])
    _clean_failure(res, str(tmp_path / "head.json.tmp"), "No space left on device")


def _tamper(dump):
    r = np.load(dump / "R.npy")
    r[:, :50] = 0.0
    np.save(dump / "R.npy", (r * 3).astype("<f4"))


def test_logits_refuses_tampered_fields_unless_told(pair, tmp_path):
    import shutil

    model, dump, _ = pair
    d = tmp_path / "d"
    shutil.copytree(dump, d)
    _tamper(d)
    out = tmp_path / "l.npy"
    res = CliRunner().invoke(main, ["logits", "--model", str(model), "--dump", str(d), "--out", str(out)])
    _clean_failure(res, f"{d}: R: R.npy: sha256")
    assert not out.exists()
    res = CliRunner().invoke(main, ["logits", "--model", str(model), "--dump", str(d), "--out", str(out),
                                    "--no-verify", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["dump_verified"] is False
    assert json.loads((tmp_path / "l.npy.manifest.json").read_text())["dump_verified"] is False
    text = CliRunner().invoke(main, ["logits", "--model", str(model), "--dump", str(d), "--out", str(out),
                                     "--no-verify"])
    assert "NOT verified" in text.output


def test_logits_refuses_a_forged_manifest_hash(pair, tmp_path):
    import shutil

    model, dump, _ = pair
    d = tmp_path / "d"
    shutil.copytree(dump, d)
    m = json.loads((d / "manifest.json").read_text())
    m["sha256"]["R"] = "0" * 64
    (d / "manifest.json").write_text(json.dumps(m))
    for args in (["logits", "--model", str(model), "--dump", str(d), "--out", str(tmp_path / "l.npy")],
                 ["dump", "inspect", str(d)]):
        _clean_failure(CliRunner().invoke(main, args), f"{d}: R: R.npy: sha256", "0" * 64)
