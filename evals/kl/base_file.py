"""llama.cpp's KL-divergence base file: what `llama-perplexity --kl-divergence-base F` writes on a
base model and reads back with `--kl-divergence` on another (tools/perplexity/perplexity.cpp).

Layout (little-endian, no padding between fields):

| field | type | meaning |
|---|---|---|
| magic | 8 bytes | `_logits_` |
| n_ctx | int32 | tokens per chunk (read back as uint32) |
| n_vocab | int32 | vocabulary size |
| n_chunk | int32 | chunks |
| tokens | int32 [n_chunk * n_ctx] | the text's tokens, chunk after chunk (no BOS replacement) |
| rows | uint16 [n_chunk * (n_ctx - 1 - n_ctx/2), nv] | one row per scored position |

nv = 2 * ceil(n_vocab / 2) + 4. A row is float32 scale, float32 min_log_prob (the first 4 uint16),
then the n_vocab 16-bit codes (`evals.kl.llamacpp`: log p_v = scale * code_v + min_log_prob), then
one zero when n_vocab is odd. The rows of chunk c are its positions n_ctx/2 .. n_ctx-2; row j
predicts token tokens[c * n_ctx + n_ctx/2 + j + 1].

`read_base_file` refuses anything but a regular file (a FIFO or device would block or never end),
checks the header against the model it is used with (`n_vocab`) and every count against the file's
size before it allocates, and memory-maps the rows read-only. A row's two floats are checked as the
rows are read against what the tool can write: 0 <= scale, min_log_prob in
[-(LOG_WINDOW + SLACK + log n_vocab), 0] and the largest decodable log-prob, scale * 65535 +
min_log_prob, at most SLACK_TOP (a log-prob; the tool's rows give -lse <= 0): so every decoded
value, its exp and the perplexity stay finite. `BaseFileWriter` streams rows into `F.tmp` and
fsyncs and renames it when all rows are in.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exactedit.evals.kl.llamacpp import BaseRows
from exactedit.errors import FieldError
from exactedit.files import claim_tmp, file_sha256, fsync_dir, writing

MAGIC = b"_logits_"
HEADER = struct.Struct("<8siii")
MAX_CTX = 1 << 24
MAX_VOCAB = 1 << 26
LOG_WINDOW = 16.0     # nats below the top logit the codes cover (evals.kl.llamacpp.WINDOW)
SLACK = 16.0          # float32 rounding of huge logits (mx - 16 rounds at |mx| ~ 2^27): generous
SLACK_TOP = 1.0       # the largest decodable log-prob is -lse <= 0 in the tool's rows


class KldBaseFileError(FieldError):
    """A KL-divergence base file is malformed, truncated, or does not fit what it is used with."""


def row_width(n_vocab: int) -> int:
    """uint16 entries per row: 4 for the two floats, the codes padded to an even count."""
    return 2 * ((n_vocab + 1) // 2) + 4


def rows_per_chunk(n_ctx: int) -> int:
    return n_ctx - 1 - n_ctx // 2


def file_size(n_ctx: int, n_vocab: int, n_chunk: int) -> int:
    return HEADER.size + 4 * n_ctx * n_chunk + 2 * row_width(n_vocab) * rows_per_chunk(n_ctx) * n_chunk


def _check_counts(path, n_ctx: int, n_vocab: int, n_chunk: int) -> None:
    if not 3 <= n_ctx <= MAX_CTX:
        raise KldBaseFileError(path, "n_ctx", f"{n_ctx} is not in [3, {MAX_CTX}] (a chunk must score a row)", 8)
    if not 1 <= n_vocab <= MAX_VOCAB:
        raise KldBaseFileError(path, "n_vocab", f"{n_vocab} is not in [1, {MAX_VOCAB}]", 12)
    if n_chunk < 1:
        raise KldBaseFileError(path, "n_chunk", f"{n_chunk} is not >= 1", 16)


@dataclass(frozen=True)
class KldBaseFile:
    """An open base file: header counts, the token table and the rows (read-only memmap)."""

    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray        # int32 [n_chunk * n_ctx]
    raw_rows: np.ndarray      # uint16 [rows, nv]

    @property
    def first(self) -> int:
        return self.n_ctx // 2

    @property
    def rows_per_chunk(self) -> int:
        return rows_per_chunk(self.n_ctx)

    @property
    def rows(self) -> int:
        return self.raw_rows.shape[0]

    def next_tokens(self) -> np.ndarray:
        """int64 [rows]: the token each row predicts."""
        j = np.arange(self.rows_per_chunk)
        at = (np.arange(self.n_chunk)[:, None] * self.n_ctx + self.first + 1 + j[None, :]).reshape(-1)
        return self.tokens[at].astype(np.int64)

    def base_rows(self, start: int, stop: int) -> BaseRows:
        """Rows [start, stop) decoded into (scale, min_log_prob, codes), validated."""
        raw = np.asarray(self.raw_rows[start:stop])
        floats = np.ascontiguousarray(raw[:, :4]).view("<f4").astype(np.float32)
        scale, mlp = floats[:, 0].copy(), floats[:, 1].copy()
        low = np.float32(-(LOG_WINDOW + SLACK + math.log(self.n_vocab)))
        with np.errstate(over="ignore", invalid="ignore"):
            top = scale.astype(np.float64) * 65535.0 + mlp
            ok = np.isfinite(scale) & (scale >= 0) & np.isfinite(mlp) & (mlp <= 0) & (mlp >= low)
            ok &= np.isfinite(top) & (top <= SLACK_TOP)
        bad = ~ok
        if bad.any():
            r = start + int(np.flatnonzero(bad)[0])
            c, j = divmod(r, self.rows_per_chunk)
            raise KldBaseFileError(self.path, f"chunk {c + 1} row {j} (position {self.first + j})",
                                   f"scale {float(scale[r - start])!r} / min_log_prob {float(mlp[r - start])!r}: "
                                   f"expected a finite scale >= 0, a log-prob min_log_prob in [{float(low):.4g}, 0] "
                                   f"and scale * 65535 + min_log_prob <= {SLACK_TOP:g} (a log-prob)",
                                   self.row_offset(r))
        return BaseRows(scale, mlp, np.ascontiguousarray(raw[:, 4:4 + self.n_vocab]))

    def row_offset(self, row: int) -> int:
        return HEADER.size + 4 * self.tokens.size + 2 * row_width(self.n_vocab) * row

    def sha256(self) -> str:
        return file_sha256(self.path)


def read_base_file(path, n_vocab_model: int | None = None) -> KldBaseFile:
    """Open and validate a base file (header, size, token ids); rows are checked as they are read.
    `n_vocab_model`: the vocabulary of the model it is used with (the header must say the same)."""
    path = Path(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise KldBaseFileError(path, "file", "not a regular file (a FIFO, device or directory); "
                                   "expected a llama-perplexity --kl-divergence-base file")
        size = st.st_size
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))   # a FIFO swapped in cannot block
        with open(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise KldBaseFileError(path, "file", "not a regular file")
            head = fh.read(HEADER.size)
    except OSError as exc:
        raise KldBaseFileError(path, "file", f"cannot be read ({exc.strerror or exc})") from None
    if len(head) < len(MAGIC) or head[:len(MAGIC)] != MAGIC:
        raise KldBaseFileError(path, "magic", f"expected {MAGIC!r}, got {head[:len(MAGIC)]!r} "
                               f"(not a llama-perplexity --kl-divergence-base file)", 0)
    if len(head) < HEADER.size:
        raise KldBaseFileError(path, "header", f"truncated: {size} bytes, the header alone is {HEADER.size}")
    _, n_ctx, n_vocab, n_chunk = HEADER.unpack(head)
    _check_counts(path, n_ctx, n_vocab, n_chunk)
    if n_vocab_model is not None and n_vocab != n_vocab_model:
        raise KldBaseFileError(path, "n_vocab", f"{n_vocab}, but the model has {n_vocab_model} tokens: the file "
                               f"was written with another model's vocabulary", 12)
    want = file_size(n_ctx, n_vocab, n_chunk)
    tok_end = HEADER.size + 4 * n_ctx * n_chunk
    if size < tok_end:
        raise KldBaseFileError(path, "tokens", f"truncated: {n_chunk} x {n_ctx} tokens need {tok_end} bytes, "
                               f"the file has {size}", HEADER.size)
    if size != want:
        nv, rpc = row_width(n_vocab), rows_per_chunk(n_ctx)
        whole = (size - tok_end) // (2 * nv)
        what = (f"truncated in chunk {whole // rpc + 1} row {whole % rpc}" if size < want
                else f"{size - want} trailing bytes")
        raise KldBaseFileError(path, "rows", f"{what}: n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk} "
                               f"make {want} bytes, the file has {size}", min(size, want))
    tokens = np.fromfile(path, dtype="<i4", count=n_ctx * n_chunk, offset=HEADER.size).astype(np.int32)
    bad = (tokens < 0) | (tokens >= n_vocab)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise KldBaseFileError(path, f"tokens[{i}]", f"id {int(tokens[i])} is not in [0, {n_vocab})",
                               HEADER.size + 4 * i)
    tokens.setflags(write=False)
    rows = np.memmap(path, dtype="<u2", mode="r", offset=tok_end,
                     shape=(rows_per_chunk(n_ctx) * n_chunk, row_width(n_vocab)))
    return KldBaseFile(path, n_ctx, n_vocab, n_chunk, tokens, rows)


def pack_rows(rows: BaseRows, n_vocab: int) -> np.ndarray:
    """uint16 [T, nv]: rows as the file lays them out."""
    T = rows.codes.shape[0]
    if rows.codes.shape != (T, n_vocab) or rows.scale.shape != (T,) or rows.min_log_prob.shape != (T,):
        raise ValueError(f"base rows do not have n_vocab {n_vocab} columns: {rows.codes.shape}")
    out = np.zeros((T, row_width(n_vocab)), "<u2")
    floats = np.stack([rows.scale, rows.min_log_prob], axis=1).astype("<f4")
    out[:, :4] = floats.view("<u2")
    out[:, 4:4 + n_vocab] = rows.codes
    return out


class BaseFileWriter:
    """Stream a base file: header and tokens first, then `write(rows)` block by block; `close()`
    checks that every row came, fsyncs `F.tmp`, renames it to F and returns its sha256. Leaving
    the `with` block on an exception removes the temporary file."""

    def __init__(self, path, n_ctx: int, n_vocab: int, tokens):
        self.path = Path(path)
        _check_counts(self.path, n_ctx, n_vocab, len(tokens) // max(n_ctx, 1))
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.ndim != 1 or toks.size % n_ctx or toks.size == 0:
            raise KldBaseFileError(self.path, "tokens", f"{toks.size} tokens are not whole chunks of n_ctx {n_ctx}")
        if toks.min() < 0 or toks.max() >= n_vocab:
            raise KldBaseFileError(self.path, "tokens", f"ids must lie in [0, {n_vocab})")
        self.n_ctx, self.n_vocab, self.n_chunk = n_ctx, n_vocab, toks.size // n_ctx
        self.expected = rows_per_chunk(n_ctx) * self.n_chunk
        self.written = 0
        self._hash = hashlib.sha256()
        self._claim = contextlib.ExitStack()
        self.tmp = self._claim.enter_context(claim_tmp(self.path))   # a killed run's F.tmp reused, a live one's refused
        try:
            self._fh = open(self.tmp, "wb")
        except BaseException:
            self.tmp.unlink(missing_ok=True)
            self._claim.close()
            raise
        self._put(HEADER.pack(MAGIC, n_ctx, n_vocab, self.n_chunk) + toks.astype("<i4").tobytes())

    def _put(self, data: bytes) -> None:
        with writing(self.tmp):
            self._fh.write(data)
        self._hash.update(data)

    def write(self, rows: BaseRows) -> None:
        n = rows.codes.shape[0]
        if self.written + n > self.expected:
            raise KldBaseFileError(self.path, "rows", f"{self.written + n} rows exceed the "
                                   f"{self.n_chunk} x {rows_per_chunk(self.n_ctx)} of the header")
        self._put(pack_rows(rows, self.n_vocab).tobytes())
        self.written += n

    def close(self) -> str:
        if self.written != self.expected:
            raise KldBaseFileError(self.path, "rows", f"{self.written} rows written, the header says "
                                   f"{self.expected}")
        with writing(self.tmp):
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
        os.replace(self.tmp, self.path)
        self._claim.close()
        fsync_dir(self.path.parent)
        return self._hash.hexdigest()

    def abort(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        self.tmp.unlink(missing_ok=True)
        self._claim.close()

    def __enter__(self) -> BaseFileWriter:
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is not None:
            self.abort()
