"""A full disk and the leftovers of a killed run: `logits` reserves its output's blocks
before writing through a memory map, so ENOSPC is one clean line (it was a SIGBUS) and no OUT.tmp is
left; a stale OUT.tmp of a killed run is reused by the next run of logits / apply / kld --write-base,
and one that a live run of the same output holds (flock) is refused, untouched."""
from __future__ import annotations

import errno
import fcntl
import os

import pytest
from click.testing import CliRunner

from exactedit.cli import main
from tests.cli.io_world import T, V, make_inputs


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    make_inputs(root)
    return root


def _logits(world, out):
    return CliRunner().invoke(main, ["logits", "--model", str(world / "m.gguf"), "--dump", str(world / "d"),
                                     "--out", str(out)])


def _apply(world, out):
    return CliRunner().invoke(main, ["apply", str(world / "b"), "--model", str(world / "m.gguf"), "--out", str(out)])


def _kld_base(world, out):
    return CliRunner().invoke(main, ["kld", "--model", str(world / "m.gguf"), "--dump", str(world / "d"),
                                     "--doc-rows", "3:5", "--write-base", str(out)])


def _clean_failure(res, *needles):
    assert res.exit_code == 1, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]   # progress lines aside
    assert "Traceback" not in res.output and len(errors) == 1, res.output
    for n in needles:
        assert n in res.output, res.output


def test_logits_on_a_full_disk_is_a_clean_error_without_leftovers(world, tmp_path, monkeypatch):
    calls = []

    def full(fd, offset, size):
        calls.append(size)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    out = tmp_path / "l.npy"
    _clean_failure(_logits(world, out), f"{out}.tmp: No space left on device")
    assert calls and calls[0] >= T * V * 4          # the whole array was reserved before any tile was written
    assert sorted(os.listdir(tmp_path)) == []


def test_apply_on_a_full_disk_is_a_clean_error_without_leftovers(world, tmp_path, monkeypatch):
    def fsync_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync_full)
    out = tmp_path / "e.gguf"
    _clean_failure(_apply(world, out), f"{out}.tmp: No space left on device")
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("run", [_logits, _apply, _kld_base], ids=["logits", "apply", "kld --write-base"])
def test_a_killed_runs_temporary_file_is_reused(world, tmp_path, run):
    out = tmp_path / "o"
    (tmp_path / "o.tmp").write_bytes(b"\x00" * 4096)          # what kill -9 in the middle leaves
    res = run(world, out)
    assert res.exit_code == 0, res.output
    assert out.stat().st_size > 0 and not (tmp_path / "o.tmp").exists()


@pytest.mark.parametrize("run", [_logits, _apply, _kld_base], ids=["logits", "apply", "kld --write-base"])
def test_a_temporary_file_a_live_run_holds_is_refused(world, tmp_path, run):
    out = tmp_path / "o"
    fd = os.open(tmp_path / "o.tmp", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)                   # a concurrent run writing the same output
        os.write(fd, b"the other run's bytes")
        _clean_failure(run(world, out), f"{out}.tmp is being written by another run")
        assert (tmp_path / "o.tmp").read_bytes() == b"the other run's bytes" and not out.exists()
    finally:
        os.close(fd)
