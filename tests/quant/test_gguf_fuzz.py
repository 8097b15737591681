"""Malformed GGUFs: evil headers built with struct.pack, truncations and byte mutations of valid files.

The only acceptable outcome of reading bad input is our GGUFFormatError (with the field it names),
in bounded time and memory; a mutated file that still parses must survive the whole read API.
"""
from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactedit.quant import gguf
from exactedit.quant.model.arch import detect_tail
from exactedit.errors import GGUFFormatError
from exactedit.quant.gguf.write import synthetic_model

U32, U64, F32_TYPE, Q8_0_TYPE = "<I", "<Q", 0, 8
STRING, ARRAY, UINT32, UINT8 = 8, 9, 4, 0


def s(text: bytes | str) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack(U64, len(b)) + b


def header(n_tensors=0, n_kv=0, version=3, magic=b"GGUF") -> bytes:
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def kv(key, vtype, payload: bytes) -> bytes:
    return s(key) + struct.pack(U32, vtype) + payload


def tinfo(name, ne, type_id=F32_TYPE, offset=0, n_dims=None) -> bytes:
    n_dims = len(ne) if n_dims is None else n_dims
    return s(name) + struct.pack(f"<I{len(ne)}Q", n_dims, *ne) + struct.pack("<IQ", type_id, offset)


def pad(b: bytes, a=32) -> bytes:
    return b + bytes(-len(b) % a)


def one_tensor_file(ne=(8,), type_id=F32_TYPE, offset=0, data=32) -> bytes:
    return pad(header(1, 0) + tinfo("t.weight", ne, type_id, offset)) + bytes(data)


HUGE = 2**62
EVIL = {  # name: (file bytes, the field the error must name)
    "empty": (b"", "header"),
    "short header": (b"GGUF\x03\x00\x00\x00", "header"),
    "bad magic": (b"GGML" + bytes(20), "magic"),
    "version 1": (header(version=1), "version"),
    "big endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "version"),
    "version 99": (header(version=99), "version"),
    "huge kv count": (header(n_kv=HUGE), "kv_count"),
    "huge tensor count": (header(n_tensors=HUGE), "tensor_count"),
    "key length past eof": (header(n_kv=1) + struct.pack(U64, HUGE) + b"abc" + bytes(10), "metadata key #0"),
    "unknown value type": (header(n_kv=1) + kv("k", 13, bytes(8)), "k value type"),
    "scalar past eof": (header(n_kv=1) + kv("k", 10, b"\x01\x02"), "k"),
    "string value past eof": (header(n_kv=1) + kv("k", STRING, struct.pack(U64, 1000) + b"ab"), "k"),
    "huge string array": (header(n_kv=1) + kv("k", ARRAY, struct.pack("<IQ", STRING, HUGE)), "k"),
    "string array item past eof": (header(n_kv=1) + kv("k", ARRAY, struct.pack("<IQ", STRING, 2)
                                                       + s("a") + struct.pack(U64, 99)), "k"),
    "string array item length near 2**63": (header(n_kv=1) + kv("k", ARRAY, struct.pack("<IQ", STRING, 2)
                                                                + struct.pack(U64, 2**63 - 1)), "k"),
    "huge numeric array": (header(n_kv=1) + kv("k", ARRAY, struct.pack("<IQ", UINT32, HUGE)), "k"),
    "huge nested array": (header(n_kv=1) + kv("k", ARRAY, struct.pack("<IQ", ARRAY, HUGE)), "k"),
    "array of unknown type": (header(n_kv=1) + kv("k", ARRAY, struct.pack("<IQ", 77, 1)), "k element type"),
    "arrays nested too deep": (header(n_kv=1) + kv("k", ARRAY, struct.pack("<IQ", ARRAY, 1) * 20),
                               "k" + "[0]" * 8),
    "invalid utf-8 key": (header(n_kv=1) + kv(b"\xff\xfe", UINT8, b"\x01"), "metadata key #0"),
    "duplicate key": (header(n_kv=2) + kv("k", UINT8, b"\x01") * 2, "metadata key 'k'"),
    "alignment not uint32": (header(n_kv=1) + kv("general.alignment", UINT8, b"\x20"),
                             "general.alignment"),
    "alignment not power of 2": (header(n_kv=1) + kv("general.alignment", UINT32, struct.pack(U32, 24)),
                                 "general.alignment"),
    "alignment zero": (header(n_kv=1) + kv("general.alignment", UINT32, struct.pack(U32, 0)),
                       "general.alignment"),
    "tensor name past eof": (header(n_tensors=1) + struct.pack(U64, HUGE) + bytes(40), "tensor info #0 name"),
    "n_dims zero": (pad(header(1) + tinfo("t", (8,), n_dims=0)) + bytes(32), "tensor t n_dims"),
    "n_dims five": (pad(header(1) + tinfo("t", (8,), n_dims=5)) + bytes(32), "tensor t n_dims"),
    "unknown ggml type": (one_tensor_file(type_id=4), "tensor t.weight type"),
    "ggml type out of enum": (one_tensor_file(type_id=999), "tensor t.weight type"),
    "cols not whole blocks": (one_tensor_file(ne=(33,), type_id=Q8_0_TYPE), "tensor t.weight shape"),
    "elements overflow int64": (one_tensor_file(ne=(32, 2**40, 2**40)), "tensor t.weight shape"),
    "misaligned offset": (one_tensor_file(offset=4, data=64), "tensor t.weight offset"),
    "offset past eof": (one_tensor_file(offset=2**40), "tensor t.weight data"),
    "data truncated": (one_tensor_file(ne=(8, 8), data=100), "tensor t.weight data"),
    "data section missing": (header(1) + tinfo("t.w", (8,)), "data"),
    "data section empty": (header(1) + tinfo("t.weight", (8,)), "tensor t.weight data"),
    "duplicate tensor": (pad(header(2) + tinfo("t", (8,)) + tinfo("t", (8,), offset=32)) + bytes(64),
                         "tensor t"),
    "overlapping tensors": (pad(header(2) + tinfo("a", (16,)) + tinfo("b", (8,), offset=32))
                            + bytes(96), "tensor b offset"),
}


@pytest.mark.parametrize("name", list(EVIL))
def test_evil_header_gives_our_error(tmp_path, name):
    data, field = EVIL[name]
    path = tmp_path / "evil.gguf"
    path.write_bytes(data)
    t0 = time.perf_counter()
    with pytest.raises(GGUFFormatError) as err:
        gguf.open(path)
    assert time.perf_counter() - t0 < 1.0
    assert err.value.field == field and str(path) in str(err.value)


def test_missing_file_and_directory(tmp_path):
    for p in (tmp_path / "nope.gguf", tmp_path):
        with pytest.raises(GGUFFormatError, match="does not exist or is not a regular file"):
            gguf.open(p)


def test_well_formed_edge_cases_parse(tmp_path):
    """Zero tensors, a zero-size tensor, and an empty string array are valid, not errors."""
    cases = [header(), pad(header(1) + tinfo("z", (0,))),
             header(n_kv=1) + kv("k", ARRAY, struct.pack("<IQ", STRING, 0))]
    for i, data in enumerate(cases):
        (tmp_path / f"{i}.gguf").write_bytes(data)
        with gguf.open(tmp_path / f"{i}.gguf") as g:
            assert len(g.tensors) == (1 if i == 1 else 0)
    with gguf.open(tmp_path / "1.gguf") as g:
        assert g.read_raw("z").shape == (1, 0)
    with gguf.open(tmp_path / "2.gguf") as g:
        assert g.get("k") == []


@pytest.fixture(scope="module")
def valid_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "valid.gguf"
    synthetic_model(path, vocab=40, n=256, h=32, layers=1)
    _exercise(path)   # compiles the dequantize kernels here, not inside a timed example
    return path.read_bytes()


def _exercise(path) -> None:
    """The whole read API on a file that parsed: only our error type may come out."""
    with gguf.open(path) as g:
        for key in g.metadata_keys():
            g.metadata_info(key)
            try:
                g.get(key)
            except GGUFFormatError:
                pass
        for call in (g.tokens, g.token_types, lambda: detect_tail(g)):
            try:
                call()
            except GGUFFormatError:
                pass
        for name in g.tensors:
            g.read_raw(name)
            try:
                g.read_rows(name, 0, min(2, g.tensors[name].rows))
            except GGUFFormatError:
                pass


def _mutate(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for pos, value in edits:
        buf[pos % len(buf)] = value
    return bytes(buf)


# mutations confined to the header, metadata and tensor table, where parsing decisions are made
@settings(max_examples=250, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 2047), st.integers(0, 255)), min_size=1, max_size=6))
@example(edits=[(8, 0xFF), (15, 0x7F)])     # tensor count 2**63-ish
@example(edits=[(16, 0xFF)])                # kv count
@example(edits=[(641, 128)])                # a token's length prefix near 2**63
def test_byte_mutations(tmp_path, valid_bytes, edits):
    data = _mutate(valid_bytes, edits)
    path = tmp_path / "mut.gguf"
    path.write_bytes(data)
    try:
        _exercise(path)
    except GGUFFormatError:
        pass


@settings(max_examples=60, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10**9))
@example(cut=-1)   # only the trailing padding after the last tensor removed: still valid
def test_truncations(tmp_path, valid_bytes, cut):
    path = tmp_path / "cut.gguf"
    path.write_bytes(valid_bytes)
    with gguf.open(path) as g:
        data_end = max(t.offset + t.nbytes for t in g.tensors.values())
    cut = data_end if cut < 0 else cut % len(valid_bytes)
    path.write_bytes(valid_bytes[:cut])
    if cut >= data_end:
        gguf.open(path).close()
        return
    with pytest.raises(GGUFFormatError):
        gguf.open(path)


@settings(max_examples=100, deadline=2000)
@given(blob=st.binary(min_size=0, max_size=200), counts=st.tuples(st.integers(0, 2**64 - 1),
                                                                  st.integers(0, 2**64 - 1)))
def test_random_bodies_after_a_valid_magic(tmp_path_factory, blob, counts):
    path = tmp_path_factory.mktemp("rand") / "r.gguf"
    path.write_bytes(header(*counts) + blob)
    try:
        _exercise(path)
    except GGUFFormatError:
        pass


def test_mutated_head_bytes_still_read(tmp_path, valid_bytes):
    """Flipping tensor data bytes is not a format error: the file opens and reads what is there."""
    path = tmp_path / "m.gguf"
    path.write_bytes(valid_bytes)
    with gguf.open(path) as g:
        off = g.tensors["output.weight"].offset
    path.write_bytes(_mutate(valid_bytes, [(off + i, 0xAB) for i in range(16)]))
    with gguf.open(path) as g:
        assert np.all(g.read_raw("output.weight", 0, 1)[0, :16] == 0xAB)
