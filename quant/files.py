"""File hashing and crash-safe writes, shared by every package that records or replaces a file.

    file_sha256(path, progress=None) -> hex str      streamed; progress(bytes done, bytes total)
    fsync_dir(directory)                              makes a rename inside `directory` durable
    fsync_replace(tmp, dst)                           fsync tmp, os.replace(tmp, dst), fsync dst's directory
    atomic_write_bytes(path, data) / atomic_write_text(path, text)
                                                      write `path.tmp`, fsync, rename over `path`

    writing(path)                                     context: an OSError without a file name (a full
                                                      disk on write or fsync) gets `path` attached

Errors are the plain OSErrors of the underlying calls (the CLI reports them as `PATH: reason`);
callers wrap them where they know the field.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Callable, Iterator

CHUNK = 1 << 24


def file_sha256(path, progress: Callable[[int, int], None] | None = None, chunk: int = CHUNK) -> str:
    """sha256 of a file, read in chunks; progress(bytes done, bytes total) after each."""
    total, done, h = os.path.getsize(path), 0, hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
            done += len(block)
            if progress is not None:
                progress(done, total)
    return h.hexdigest()


@contextlib.contextmanager
def writing(path) -> Iterator[None]:
    """Re-raise an OSError that names no file (ENOSPC from write() or fsync()) with `path`."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            raise type(exc)(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def fsync_dir(directory) -> None:
    """fsync a directory, so that renames and creations inside it survive a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_replace(tmp, dst) -> None:
    """fsync the finished file `tmp`, rename it over `dst`, then fsync `dst`'s directory."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, dst)
    fsync_dir(Path(dst).parent)


def atomic_write_bytes(path, data: bytes) -> None:
    """Write `data` to `path.tmp`, fsync it, and rename it over `path`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with writing(tmp), open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_text(path, text: str, encoding: str = "utf-8") -> None:
    """`atomic_write_bytes` of `text` encoded (no newline translation)."""
    atomic_write_bytes(path, text.encode(encoding))
