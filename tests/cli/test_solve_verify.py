"""Both solvers refuse a dump whose field bytes no longer match its manifest, from the CLI, before
any solving: the verification lives where dumps are opened (dumps.read_dump), so every solver entry
gets it. On a copy of the bundled fixture, registered and split while pristine, then tampered."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit.cli import main

F = Path(__file__).resolve().parents[2] / "fixtures" / "default"


@pytest.fixture
def fixture(tmp_path):
    if not (F / "model.gguf").is_file():
        pytest.fail(f"{F}: the bundled fixture is missing (it ships with the repository)")
    root = tmp_path / "f"
    shutil.copytree(F, root)
    ws = tmp_path / "ws"
    for args in (["eval", "register", str(root / "protocol.toml")],
                 ["eval", "split", "--protocol", str(root / "protocol.toml")]):
        res = CliRunner().invoke(main, [*args, "--workspace", str(ws)])
        assert res.exit_code == 0, res.output
    return root, ws


def _tamper(dump: Path) -> None:
    hh = np.load(dump / "hh.npy")
    hh[:, :5] = 0.0
    np.save(dump / "hh.npy", (3 * hh).astype("<f4"))


def _refused(res, dump: Path) -> None:
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output and f"{dump}: hh: hh.npy: sha256" in res.output


def test_solve_head_refuses_a_tampered_dump(fixture, tmp_path):
    root, ws = fixture
    d = root / "dumps"
    _tamper(d / "dev")
    res = CliRunner().invoke(main, ["solve", "head", "--model", str(root / "model.gguf"), "--train", str(d / "train"),
                                    "--dev", str(d / "dev"), "--protocol", str(root / "protocol.toml"),
                                    "--rank", "1", "--workspace", str(ws), "--out", str(tmp_path / "b")])
    _refused(res, d / "dev")
    assert not (tmp_path / "b").exists()


def test_solve_wfld_refuses_a_tampered_dump(fixture, tmp_path):
    root, ws = fixture
    d = root / "dumps"
    _tamper(d / "anchors")
    res = CliRunner().invoke(main, ["solve", "wfld", "--model", str(root / "model.gguf"),
                                    "--phrases", str(root / "phrases.txt"), "--train", str(d / "train"),
                                    "--anchors", str(d / "anchors"), "--protocol", str(root / "protocol.toml"),
                                    "--workspace", str(ws), "--out", str(tmp_path / "b")])
    _refused(res, d / "anchors")
    assert not (tmp_path / "b").exists()
