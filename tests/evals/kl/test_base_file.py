"""llama-perplexity's KL-divergence base file: the layout byte by byte, writer -> reader round trip,
and evil files (bad headers, truncation, trailing bytes, mutations) ending in our own error."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from exactedit.evals.kl.llamacpp import BaseRows, encode_base
from exactedit.evals.kl.base_file import (
    BaseFileWriter, KldBaseFileError, file_size, read_base_file, row_width, rows_per_chunk,
)


def _rows(n_rows: int, V: int, seed: int = 0) -> BaseRows:
    rng = np.random.default_rng(seed)
    rows, _ = encode_base((rng.standard_normal((n_rows, V)) * 3).astype(np.float32), np.zeros(n_rows, np.int64))
    return rows


def _write(path, n_ctx=8, V=7, n_chunk=2, seed=0, blocks=2):
    tokens = np.random.default_rng(seed).integers(0, V, n_ctx * n_chunk)
    rows = _rows(rows_per_chunk(n_ctx) * n_chunk, V, seed)
    with BaseFileWriter(path, n_ctx, V, tokens) as w:
        for part in np.array_split(np.arange(rows.codes.shape[0]), blocks):
            w.write(BaseRows(rows.scale[part], rows.min_log_prob[part], rows.codes[part]))
        sha = w.close()
    return tokens, rows, sha


def test_layout_byte_by_byte(tmp_path):
    """n_ctx 8 (rows 4..6 of each chunk: 3 rows), odd n_vocab 7: nv = 12 uint16 per row."""
    f = tmp_path / "b.kld"
    tokens, rows, sha = _write(f)
    data = f.read_bytes()
    assert len(data) == file_size(8, 7, 2) == 20 + 4 * 16 + 2 * 12 * 6
    assert data[:8] == b"_logits_" and struct.unpack("<iii", data[8:20]) == (8, 7, 2)
    assert np.array_equal(np.frombuffer(data[20:84], "<i4"), tokens)
    row1 = data[84 + 24:84 + 48]
    scale, mlp = struct.unpack("<ff", row1[:8])
    assert (np.float32(scale), np.float32(mlp)) == (rows.scale[1], rows.min_log_prob[1])
    assert np.array_equal(np.frombuffer(row1[8:22], "<u2"), rows.codes[1]) and row1[22:] == b"\0\0"  # pad
    assert row_width(7) == 12 and row_width(8) == 12
    import hashlib
    assert sha == hashlib.sha256(data).hexdigest()


def test_round_trip_and_next_tokens(tmp_path):
    f = tmp_path / "b.kld"
    tokens, rows, _ = _write(f, n_ctx=10, V=6, n_chunk=3, blocks=4)
    b = read_base_file(f)
    assert (b.n_ctx, b.n_vocab, b.n_chunk, b.rows, b.first, b.rows_per_chunk) == (10, 6, 3, 12, 5, 4)
    got = b.base_rows(0, b.rows)
    assert all(np.array_equal(x, y) for x, y in zip(got, rows))
    # chunk c row j predicts tokens[c * n_ctx + n_ctx/2 + j + 1]
    want = [tokens[c * 10 + 5 + j + 1] for c in range(3) for j in range(4)]
    assert np.array_equal(b.next_tokens(), want)
    part = b.base_rows(5, 7)
    assert np.array_equal(part.codes, rows.codes[5:7])


def test_writer_refuses_wrong_counts_and_leaves_no_file(tmp_path):
    f = tmp_path / "b.kld"
    rows = _rows(3, 7)
    with pytest.raises(KldBaseFileError, match="rows written"):
        with BaseFileWriter(f, 8, 7, np.zeros(16, np.int64)) as w:
            w.write(rows)                     # 3 of the 6 rows
            w.close()
    assert not f.exists() and not (tmp_path / "b.kld.tmp").exists()
    with pytest.raises(KldBaseFileError, match="exceed"):
        with BaseFileWriter(f, 8, 7, np.zeros(8, np.int64)) as w:
            w.write(_rows(4, 7))
    with pytest.raises(KldBaseFileError, match="whole chunks"):
        BaseFileWriter(f, 8, 7, np.zeros(12, np.int64))
    with pytest.raises(KldBaseFileError, match="ids"):
        BaseFileWriter(f, 8, 7, np.full(8, 7))
    assert not f.exists() and not (tmp_path / "b.kld.tmp").exists()


def _evil(tmp_path, data: bytes):
    f = tmp_path / "evil.kld"
    f.write_bytes(data)
    return f


@pytest.mark.parametrize("mutate,field", [
    (lambda d: b"_logitz_" + d[8:], "magic"),
    (lambda d: d[:5], "magic"),
    (lambda d: d[:14], "header"),
    (lambda d: d[:8] + struct.pack("<i", 2) + d[12:], "n_ctx"),
    (lambda d: d[:8] + struct.pack("<i", -8) + d[12:], "n_ctx"),
    (lambda d: d[:12] + struct.pack("<i", 0) + d[16:], "n_vocab"),
    (lambda d: d[:16] + struct.pack("<i", -1) + d[20:], "n_chunk"),
    (lambda d: d[:16] + struct.pack("<i", 1 << 30) + d[20:], "tokens"),
    (lambda d: d[:60], "tokens"),
    (lambda d: d[:-3], "rows"),
    (lambda d: d + b"\0\0", "rows"),
    (lambda d: d[:20] + struct.pack("<i", 7) + d[24:], "tokens[0]"),
    (lambda d: d[:20] + struct.pack("<i", -2) + d[24:], "tokens[0]"),
])
def test_evil_headers_name_the_field(tmp_path, mutate, field):
    _write(tmp_path / "ok.kld")
    f = _evil(tmp_path, mutate((tmp_path / "ok.kld").read_bytes()))
    with pytest.raises(KldBaseFileError) as err:
        read_base_file(f)
    assert err.value.field == field and str(f) in str(err.value)


def test_bad_row_floats_name_chunk_and_row(tmp_path):
    _write(tmp_path / "ok.kld")
    data = bytearray((tmp_path / "ok.kld").read_bytes())
    at = 84 + 24 * 4                      # chunk 2, row 1
    data[at:at + 4] = struct.pack("<f", float("nan"))
    b = read_base_file(_evil(tmp_path, bytes(data)))
    with pytest.raises(KldBaseFileError, match="chunk 2 row 1") as err:
        b.base_rows(0, b.rows)
    assert err.value.offset == at
    b.base_rows(0, 4)                     # rows before it read fine


@settings(max_examples=150, deadline=None)
@given(pos=st.integers(0, 10_000), value=st.integers(0, 255), cut=st.integers(-40, 0))
def test_mutated_files_give_our_error_or_valid_rows(tmp_path_factory, pos, value, cut):
    tmp = tmp_path_factory.mktemp("fuzz")
    _write(tmp / "ok.kld")
    data = bytearray((tmp / "ok.kld").read_bytes())
    data[pos % len(data)] = value
    data = bytes(data[:len(data) + cut] if cut else data)
    try:
        b = read_base_file(_evil(tmp, data))
        rows = b.base_rows(0, b.rows)
    except KldBaseFileError:
        return
    assert rows.codes.shape == (b.rows, b.n_vocab) and np.all(rows.scale >= 0) and np.all(rows.min_log_prob <= 0)
    assert np.isfinite(rows.decoded()).all() and np.all(np.exp(rows.decoded().astype(np.float64)) < 3)


# ---- bounded, validated against the model, never a FIFO -------------------------------

def test_fifo_and_directory_are_refused_without_blocking(tmp_path):
    import os
    import signal

    fifo = tmp_path / "pipe.kld"
    os.mkfifo(fifo)
    old = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("read_base_file blocked on a FIFO"))
    signal.alarm(5)
    try:
        for f in (fifo, tmp_path):
            with pytest.raises(KldBaseFileError, match="not a regular file") as err:
                read_base_file(f)
            assert err.value.field == "file"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_n_vocab_of_another_model_is_refused(tmp_path):
    _write(tmp_path / "ok.kld", V=7)
    assert read_base_file(tmp_path / "ok.kld", 7).n_vocab == 7
    with pytest.raises(KldBaseFileError, match="the model has 8 tokens") as err:
        read_base_file(tmp_path / "ok.kld", 8)
    assert err.value.field == "n_vocab" and err.value.offset == 12


@pytest.mark.parametrize("scale,mlp", [
    (3e38, -1.0),            # finite, huge: decodes to inf
    (1e-3, -1e30),           # finite, huge: exp and the perplexity overflow
    (1e-3, -60.0),           # below what the tool writes for V = 7 (-16 - log 7)
    (1.0, -2.0),             # the top decodes to a log-prob of 65533
    (float("inf"), -1.0), (0.0, float("nan")), (-1e-3, -1.0), (1e-4, 0.5),
])
def test_extreme_row_floats_are_refused(tmp_path, scale, mlp):
    _write(tmp_path / "ok.kld")
    data = bytearray((tmp_path / "ok.kld").read_bytes())
    data[84:92] = struct.pack("<ff", scale, mlp)           # chunk 1, row 0
    b = read_base_file(_evil(tmp_path, bytes(data)))
    with pytest.raises(KldBaseFileError, match="chunk 1 row 0") as err:
        b.base_rows(0, 1)
    assert err.value.offset == 84


def test_rows_the_tool_writes_stay_accepted(tmp_path):
    """Extreme but real logits: a flat row (scale 0, min_log_prob -log V), a 1e4-wide spread."""
    V = 50
    lg = np.stack([np.zeros(V), np.linspace(-1e4, 1e4, V), np.r_[1e5, np.zeros(V - 1)]]).astype(np.float32)
    rows, _ = encode_base(lg, np.zeros(3, np.int64))
    f = tmp_path / "x.kld"
    with BaseFileWriter(f, 8, V, np.zeros(8, np.int64)) as w:
        w.write(rows)
        w.close()
    got = read_base_file(f, V).base_rows(0, 3)
    assert np.isfinite(got.decoded()).all() and np.array_equal(got.codes, rows.codes)
