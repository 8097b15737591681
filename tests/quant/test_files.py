"""files: the outputs-vs-inputs guard (`refuse_clobber`), the claimed temporary file
(`claim_tmp`: a killed run's leftover is reused, a live run's is refused), `preallocate`, and
`read_utf8` (what open(path, encoding="utf-8").read() gave, bounded: issue 38's untrusted inputs)."""
from __future__ import annotations

import errno
import fcntl
import os

import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactedit import files
from exactedit.errors import FieldError
from exactedit.files import (ClobberError, OutputBusyError, atomic_write_bytes, claim_tmp, preallocate, read_utf8,
                             refuse_clobber)
from tests.special_files import KINDS, WHY, special
from tests.strategies import TEXT_PIECES


@pytest.fixture
def world(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF model bytes")
    dump = tmp_path / "d"
    dump.mkdir()
    (dump / "R.npy").write_bytes(b"field")
    return tmp_path, model, dump


def _refused(outputs, inputs, *needles, **kw):
    with pytest.raises(ClobberError) as err:
        refuse_clobber(outputs, inputs, **kw)
    assert isinstance(err.value, FieldError)
    for n in needles:
        assert str(n) in str(err.value), str(err.value)


def test_an_output_that_is_an_input_is_refused(world):
    root, model, dump = world
    _refused({"--out": model}, {"--model": model, "--dump": dump}, model, "--model", "--out")
    _refused({"--out": root / "." / "m.gguf"}, {"--model": model}, "--model")


def test_a_symlink_or_hard_link_to_an_input_is_refused(world):
    root, model, _ = world
    (root / "link.gguf").symlink_to(model)
    os.link(model, root / "hard.gguf")
    _refused({"--out": root / "link.gguf"}, {"--model": model}, root / "link.gguf", model)
    _refused({"--out": root / "hard.gguf"}, {"--model": model}, root / "hard.gguf", model)
    _refused({"--out": model}, {"--model": root / "link.gguf"}, "--model")


def test_an_output_inside_an_input_directory_is_refused(world):
    root, model, dump = world
    _refused({"--out": dump / "R.npy"}, {"--dump": dump}, dump / "R.npy", "inside", dump)
    _refused({"--out": dump / "new.npy"}, {"--dump": dump}, "inside")
    _refused({"--out": dump}, {"--dump": dump}, "--dump")
    (root / "dlink").symlink_to(dump)
    _refused({"--out": root / "dlink" / "x.npy"}, {"--dump": dump}, "inside")


def test_a_directory_output_holding_an_input_is_refused_unless_reports_go_into_it(world):
    root, model, dump = world
    _refused({"--out": root}, {"--dump": dump}, "holds", dump)
    _refused({"--out": root}, {"--model": model}, "holds", model)
    refuse_clobber({"--out": root}, {"--model": model}, holds_inputs=True)


def test_an_input_as_the_outputs_temporary_file_is_refused(world):
    root, _, _ = world
    (root / "m.tmp").write_bytes(b"an input that happens to end in .tmp")
    _refused({"--out": root / "m"}, {"--model": root / "m.tmp"}, "--model", "temporary")


def test_two_outputs_on_one_path_are_refused(world):
    root, model, dump = world
    _refused({"--write-base": root / "x", "--rows-out": root / "x"}, {"--model": model}, "--rows-out", "--write-base")


def test_distinct_paths_pass(world):
    root, model, dump = world
    refuse_clobber({"--out": root / "out.npy", "--png": None}, {"--model": model, "--dump": [dump], "--x": None})
    refuse_clobber(root / "sibling.gguf", [model, dump])
    refuse_clobber({"--out": root / "m.gguf.2"}, {"--model": model})


def test_a_special_file_as_an_output_is_refused_never_replaced(tmp_path):
    """Adversarial pass: `discover --out /dev/full`, run as root, renamed its JSON over the device
    node: /dev/full became a regular file. A FIFO, a device or a link to one is refused by name, by
    refuse_clobber (following links: the command's check) and by the writer itself (the path's own
    entry: a link is replaced as a link, its target untouched)."""
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    link = tmp_path / "null.json"
    link.symlink_to("/dev/null")
    with pytest.raises(ClobberError, match=r"out\.json: --out: is a FIFO: refusing to write over it; give another"):
        refuse_clobber({"--out": fifo}, {})
    with pytest.raises(ClobberError, match=r"null\.json: --png: is a character device"):
        refuse_clobber({"--png": link}, {})
    with pytest.raises(ClobberError, match=r"out\.json: output: is a FIFO"):
        atomic_write_bytes(fifo, b"{}")
    assert fifo.is_fifo() and not (tmp_path / "out.json.tmp").exists()
    atomic_write_bytes(link, b"{}")                     # the link replaced; /dev/null is still a device
    assert link.read_bytes() == b"{}" and not link.is_symlink() and os.path.exists("/dev/null")
    refuse_clobber({"--out": tmp_path, "--json": tmp_path / "new.json"}, {})     # a directory, a new file: fine


def test_claim_reuses_a_killed_runs_leftover(tmp_path):
    out = tmp_path / "x.npy"
    tmp_path.joinpath("x.npy.tmp").write_bytes(b"half a file from a killed run")
    with claim_tmp(out) as tmp:
        assert tmp == files.tmp_path(out) and tmp.read_bytes() == b""
        tmp.write_bytes(b"new")
        os.replace(tmp, out)
    assert out.read_bytes() == b"new" and not files.tmp_path(out).exists()


def test_claim_refuses_a_temporary_file_a_live_run_holds(tmp_path):
    out = tmp_path / "x.npy"
    fd = os.open(files.tmp_path(out), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"the other run's bytes")
        with pytest.raises(OutputBusyError) as err, claim_tmp(out):
            pass
        assert "another run" in str(err.value) and str(files.tmp_path(out)) in str(err.value)
        with pytest.raises(OutputBusyError):
            atomic_write_bytes(out, b"{}")
        assert files.tmp_path(out).read_bytes() == b"the other run's bytes"     # not truncated, not removed
    finally:
        os.close(fd)
    atomic_write_bytes(out, b"{}")          # released: the next run may reuse it
    assert out.read_bytes() == b"{}" and not files.tmp_path(out).exists()


def test_claim_removes_the_temporary_file_when_the_writer_fails(tmp_path):
    out = tmp_path / "x.npy"
    with pytest.raises(RuntimeError), claim_tmp(out) as tmp:
        tmp.write_bytes(b"partial")
        raise RuntimeError("writer failed")
    assert not files.tmp_path(out).exists() and not out.exists()


def test_preallocate_reserves_blocks_and_keeps_bytes(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"header")
    with open(p, "rb+") as fh:
        fh.truncate(1 << 20)                      # sparse, as np.lib.format.open_memmap leaves it
        preallocate(fh.fileno(), 1 << 20)
    st = os.stat(p)
    assert st.st_size == 1 << 20 and st.st_blocks * 512 >= 1 << 20
    assert p.read_bytes()[:6] == b"header"


def test_preallocate_falls_back_to_writing_where_fallocate_is_unsupported(tmp_path, monkeypatch):
    def unsupported(fd, offset, size):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    p = tmp_path / "f"
    p.write_bytes(b"header")
    with open(p, "rb+") as fh:
        fh.truncate(1 << 20)
        preallocate(fh.fileno(), 1 << 20)
    assert os.stat(p).st_blocks * 512 >= 1 << 20 and p.read_bytes()[:6] == b"header"


def test_preallocate_reports_a_full_disk(tmp_path, monkeypatch):
    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with open(tmp_path / "f", "wb") as fh, pytest.raises(OSError) as err:
        preallocate(fh.fileno(), 10)
    assert err.value.errno == errno.ENOSPC


# ---- read_utf8: a user's text file read whole, bounded ------------------------------------------

@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=48) | st.lists(st.sampled_from(TEXT_PIECES) | st.text(max_size=4), max_size=8).map(
    lambda xs: "".join(xs).encode("utf-8", "surrogatepass")))
@example(data=b"\xef\xbb\xbfa\r\nb\rc\n\r\n")
@example(data=b"a \xed\xa0\x80 b")                 # an encoded lone surrogate: not UTF-8
def test_read_utf8_is_what_open_read_or_our_error(tmp_path, data):
    """The readers it replaced (`engine dump --text`, `engine perplexity-chunks --text`, `verify live
    --text`) read with open(encoding="utf-8"): the same text (a BOM kept, universal newlines), or a
    FieldError naming the file, the field and the byte where open() raised UnicodeDecodeError."""
    f = tmp_path / "t.txt"
    f.write_bytes(data)
    try:
        with open(f, encoding="utf-8") as fh:
            want = fh.read()
    except UnicodeDecodeError:
        with pytest.raises(FieldError, match=re.escape(f"{f}: --text: not UTF-8 text (")):
            read_utf8(f, 1000, FieldError, "--text")
        return
    assert read_utf8(f, 1000, FieldError, "--text") == want


@pytest.mark.parametrize("kind", KINDS)
def test_read_utf8_refuses_special_files_by_name(tmp_path, kind):
    """A FIFO was waited on for ever (open() blocks for a writer), /dev/zero read until memory ran out."""
    bad = special(tmp_path / "t.txt", kind)
    with pytest.raises(FieldError, match=re.escape(f"{bad}: --text: ") + ".*" + re.escape(WHY[kind])):
        read_utf8(bad, 1000, FieldError, "--text")


def test_read_utf8_is_capped_before_reading(tmp_path):
    f = tmp_path / "big.txt"
    with open(f, "wb") as fh:
        fh.truncate(1001)                                   # sparse
    with pytest.raises(FieldError, match=re.escape(f"{f}: text: 1001 bytes, over the limit of 1000")):
        read_utf8(f, 1000)
    assert read_utf8(f, 1001) == "\x00" * 1001
