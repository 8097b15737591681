"""File hashing and crash-safe writes, shared by every package that records or replaces a file.

    file_sha256(path, progress=None) -> hex str      streamed; progress(bytes done, bytes total)
    fsync_dir(directory)                              makes a rename inside `directory` durable
    fsync_replace(tmp, dst)                           fsync tmp, os.replace(tmp, dst), fsync dst's directory
    atomic_write_bytes(path, data) / atomic_write_text(path, text)
                                                      write `path.tmp`, fsync, rename over `path`

    writing(path)                                     context: an OSError without a file name (a full
                                                      disk on write or fsync) gets `path` attached
    tmp_path(path) -> Path                            the temporary sibling `path.tmp`
    claim_tmp(path)                                   context: `path.tmp` held (flock) for this run; a
                                                      stale one of a killed run is reused, one a live
                                                      run holds is refused (OutputBusyError); removed
                                                      when the block raises
    preallocate(fd, size)                             reserve a file's blocks (ENOSPC now, not SIGBUS
                                                      later through a memory map)
    refuse_clobber(outputs, inputs, ...)              an output that is, holds or lies inside an input
                                                      is refused (ClobberError), whatever --overwrite says
    refuse_special(path, field)                       an output that is a FIFO, a device or a socket is
                                                      refused (ClobberError): a rename would replace it

Untrusted inputs (a user's texts, prompts, phrase lists, transcripts; MAX_TEXT_BYTES: a plain text's cap):
    open_regular(path, limit, error, field)           context: a binary file of a regular file of at most
                                                      `limit` bytes (None: any), opened without blocking (a FIFO,
                                                      device, socket or directory, a symlink loop, an
                                                      unreadable or oversized file: `error(path, field,
                                                      why)`, a FieldError class)
    read_regular(path, limit, error, field) -> bytes  the same, read whole (still at most `limit`)
    check_regular(path, limit, error, field) -> int   the same checks by stat (for a path read later), its size
    decode_utf8(data, path, error, field) -> str      UTF-8 (a leading BOM dropped), else `error` naming the byte
    read_utf8(path, limit, error, field) -> str       what open(path, encoding="utf-8").read() gives (BOM kept,
                                                      newlines as text mode reads them), read by `read_regular`
    text_newlines(text) -> str                        "\\r\\n" and "\\r" as "\\n" (text-mode open()'s newlines)
    lone_surrogate(text) -> int | None                where a lone surrogate (valid JSON "\\ud800", not
                                                      encodable) sits in `text`, if anywhere

Errors are the plain OSErrors of the underlying calls (the CLI reports them as `PATH: reason`);
callers wrap them where they know the field. `ClobberError` and `OutputBusyError` are FieldErrors.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Callable, Iterator, Mapping

from exactedit.errors import FieldError

CHUNK = 1 << 24


class ClobberError(FieldError):
    """An output path that is one of the run's inputs (same path, a symlink or a hard link to it),
    lies inside an input directory (a dump, a bundle), is a directory holding an input, or is a
    special file (a FIFO, a device, a socket)."""


class OutputBusyError(FieldError):
    """The temporary file of an output is held by another run writing the same output."""


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


def refuse_special(path, field: str = "output", *, follow: bool = False) -> None:
    """Refuse (ClobberError) an output `path` that is a FIFO, a device or a socket (with `follow`, a
    symlink to one too): a writer renames its file over the path, and that replaces the special
    file itself (`discover --out /dev/full`, run as root, left /dev/full a JSON file)."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError:                     # missing (the usual output), or a loop: the writer's to report
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "a special file")
        raise ClobberError(path, field, f"is {kind}: refusing to write over it; give another path")


def fsync_replace(tmp, dst) -> None:
    """fsync the finished file `tmp`, rename it over `dst` (never over a special file:
    `refuse_special`), then fsync `dst`'s directory."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    refuse_special(dst)
    os.replace(tmp, dst)
    fsync_dir(Path(dst).parent)


def atomic_write_bytes(path, data: bytes) -> None:
    """Write `data` to `path.tmp` (claimed: `claim_tmp`), fsync it, and rename it over `path` (never
    over a special file: `refuse_special`)."""
    path = Path(path)
    refuse_special(path)
    with claim_tmp(path) as tmp:
        with writing(tmp), open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_text(path, text: str, encoding: str = "utf-8") -> None:
    """`atomic_write_bytes` of `text` encoded (no newline translation)."""
    atomic_write_bytes(path, text.encode(encoding))


def png_bytes(fig, dpi: int = 110) -> bytes:
    """A matplotlib figure laid out and rendered as PNG bytes; the figure is closed."""
    import io

    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def write_png(fig, path, dpi: int = 110) -> Path:
    """`png_bytes(fig)` written to `path` atomically (*.tmp, fsync, rename)."""
    atomic_write_bytes(path, png_bytes(fig, dpi))
    return Path(path)


def tmp_path(path) -> Path:
    """The temporary sibling a writer fills before renaming it over `path`: `path.tmp`."""
    path = Path(path)
    return path.with_name(path.name + ".tmp")


def _lock(fd: int) -> bool:
    """An exclusive, non-blocking flock on `fd`; False when another process holds one."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _hold(path: Path, busy: str) -> int:
    """An fd of `path` (created if need be) under an exclusive flock: refused (OutputBusyError,
    `busy`) while another live run holds it; opened again when its holder removed or renamed the
    file between our open and our lock."""
    while True:
        with writing(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _lock(fd):
            os.close(fd)
            raise OutputBusyError(path, "output", busy)
        if _same_inode(path, fd):
            return fd
        os.close(fd)


@contextlib.contextmanager
def claim_tmp(path) -> Iterator[Path]:
    """Hold `path.tmp` for this run: it is created (or, left by a killed run, truncated: it is ours by
    name) and flocked until the block ends; the writer fills it by name and renames it over `path`.
    Another live run writing the same output holds the lock: refused (OutputBusyError) rather than
    writing into its file. When the block raises, the temporary file is removed."""
    tmp = tmp_path(path)
    fd = _hold(tmp, f"{tmp} is being written by another run of the same output; wait for it, or choose "
                    "another output path")
    try:
        os.ftruncate(fd, 0)
        yield tmp
    except BaseException:
        if _same_inode(tmp, fd):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def output_lock(path) -> Iterator[None]:
    """Hold `path.lock` (flocked) while an output directory is written through a temporary name: a
    second live run writing the same output is refused (OutputBusyError) instead of removing the
    first one's temporary directory; a lock file left by a killed run holds no lock and is reused.
    The lock file is removed when the block ends."""
    lock = Path(str(path) + ".lock")
    fd = _hold(lock, f"{path} is being written by another run ({lock} is held); wait for it, or choose "
                     "another output path")
    try:
        yield
    finally:
        if _same_inode(lock, fd):
            os.unlink(lock)
        os.close(fd)


def _same_inode(path: Path, fd: int) -> bool:
    """`path` still names the file open as `fd`."""
    own = os.fstat(fd)
    return _identity(path) == (own.st_dev, own.st_ino)


def preallocate(fd: int, size: int) -> None:
    """Reserve the first `size` bytes of the open file `fd` on disk, so that a full disk is an
    OSError (ENOSPC) here rather than a SIGBUS when a memory map of the file is written. Where the
    file system cannot fallocate, every block is rewritten with its own bytes instead (the same
    reservation, slower)."""
    if size <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    for at in range(0, size, CHUNK):
        n = min(CHUNK, size - at)
        data = os.pread(fd, n, at)
        os.pwrite(fd, data + bytes(n - len(data)), at)


def _roles(paths, default: str) -> list[tuple[str, Path]]:
    """(role, path) pairs from a mapping role -> path(s), a path, or an iterable of paths; None skipped."""
    if paths is None:
        return []
    if isinstance(paths, (str, os.PathLike)):
        return [(default, Path(paths))]
    if isinstance(paths, Mapping):
        return [pair for role, p in paths.items() for pair in _roles(p, role)]
    return [pair for p in paths for pair in _roles(p, default)]


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _resolve(p: Path) -> Path:
    """`p` with its symlinks resolved; a symlink loop (Python 3.11's resolve raises RuntimeError:
    `apply --out LOOP` was a traceback) resolves no further than its absolute path."""
    try:
        return p.resolve()
    except (RuntimeError, OSError):
        return p.absolute()


def _same(a: Path, b: Path) -> bool:
    """Same file: equal after resolving symlinks, or the same inode (a hard link, a bind mount)."""
    if _resolve(a) == _resolve(b):
        return True
    ia = _identity(a)
    return ia is not None and ia == _identity(b)


def _within(inner: Path, outer: Path) -> bool:
    """`inner` is `outer` or lies somewhere below it (symlinks resolved, inodes compared)."""
    inner, outer = _resolve(inner), _resolve(outer)
    if inner == outer or outer in inner.parents:
        return True
    target = _identity(outer)
    return target is not None and any(_identity(p) == target for p in (inner, *inner.parents))


def refuse_clobber(outputs, inputs, *, holds_inputs: bool = False) -> None:
    """Refuse a run whose output would destroy an input, whatever its overwrite flag says (it replaces
    a previous output, never an input). `outputs` and `inputs`: a path, paths, or a mapping from a
    role (the flag, e.g. "--out") to path(s); None entries are skipped. An output is refused when it
    is an input (the same path, a symlink or a hard link to it), lies inside an input directory (a
    dump, a bundle), has an input as its temporary file `OUT.tmp`, equals another output, or (unless
    `holds_inputs`: a directory reports are written into, never replaced whole) is a directory
    holding an input; and one that is a FIFO, a device or a socket (`refuse_special`). Raises
    ClobberError naming both paths."""
    outs, ins = _roles(outputs, "output"), _roles(inputs, "input")
    for k, (role, out) in enumerate(outs):
        refuse_special(out, role, follow=True)
        for role_in, inp in ins:
            if _same(out, inp):
                raise ClobberError(out, role, f"is the {role_in} input {inp}; refusing to overwrite an input")
            if _same(tmp_path(out), inp):
                raise ClobberError(out, role, f"its temporary file {tmp_path(out)} is the {role_in} input {inp}; "
                                               "refusing to overwrite an input")
            if inp.is_dir() and _within(out, inp):
                raise ClobberError(out, role, f"lies inside the {role_in} input directory {inp}; refusing "
                                               "to write into an input")
            if not holds_inputs and out.is_dir() and _within(inp, out):
                raise ClobberError(out, role, f"holds the {role_in} input {inp}; refusing to replace a "
                                               "directory an input lies in")
        for role2, other in outs[k + 1:]:
            if _same(out, other):
                raise ClobberError(out, role, f"is also the {role2} output {other}; refusing to write "
                                               "both to one path")


# ---- untrusted inputs ---------------------------------------------------------------------------

MAX_TEXT_BYTES = 16_000_000     # a user's plain text file (--texts), read whole and tokenized
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
_SURROGATE = re.compile("[\ud800-\udfff]")


def _regular(path, st: os.stat_result, limit: int | None, error: type[FieldError], field: str) -> int:
    """st's size, after refusing (`error`) anything but a regular file of at most `limit` bytes."""
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "a special file")
        raise error(path, field, f"not a regular file ({kind}); give a plain file")
    if limit is not None and st.st_size > limit:
        raise error(path, field, f"{st.st_size} bytes, over the limit of {limit}")
    return st.st_size


def _cannot(path, exc: OSError, error: type[FieldError], field: str) -> FieldError:
    return error(path, field, f"cannot read ({exc.strerror or exc})")


def check_regular(path, limit: int | None = None, error: type[FieldError] = FieldError, field: str = "file") -> int:
    """The size of the regular file `path` (symlinks followed): a FIFO, device, socket or directory,
    a symlink loop, a missing file or one over `limit` bytes raise `error(path, field, why)`. For a
    path that is read later (hashed, tokenized): the reader still opens it with `open_regular`."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise _cannot(path, exc, error, field) from None
    return _regular(path, st, limit, error, field)


@contextlib.contextmanager
def open_regular(path, limit: int | None, error: type[FieldError] = FieldError, field: str = "file") -> Iterator:
    """A binary file object of the regular file `path`, of at most `limit` bytes when opened (None:
    any size, for a reader that reads only so much itself). It is
    opened non-blocking, so a FIFO is refused at once rather than waited on; a FIFO, device, socket
    or directory, a symlink loop, an unreadable file or one over `limit` bytes raise
    `error(path, field, why)` before a byte is read. A reader reading in pieces stops at `limit`
    itself (the file may grow while it is read)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _cannot(path, exc, error, field) from None
    try:
        _regular(path, os.fstat(fd), limit, error, field)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    with open(fd, "rb") as fh:
        yield fh


def read_regular(path, limit: int, error: type[FieldError] = FieldError, field: str = "file") -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them (see `open_regular`)."""
    with open_regular(path, limit, error, field) as fh:
        try:
            want = os.fstat(fh.fileno()).st_size + 1        # not limit + 1: read() allocates what it is asked
            data = fh.read(want)
            if len(data) == want:                           # it grew since: read on, to one past the limit
                data += fh.read(limit + 1 - want)
        except OSError as exc:
            raise error(path, field, f"cannot read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise error(path, field, f"more than {limit} bytes (it grew while read)")
    return data


def decode_utf8(data: bytes, path, error: type[FieldError] = FieldError, field: str = "text", *,
                bom: bool = False) -> str:
    """`data` as UTF-8 text (a leading byte-order mark is no text; with `bom`, it is kept as U+FEFF,
    as a tool reading the bytes sees it); else `error` naming the byte."""
    try:
        return data.decode("utf-8" if bom else "utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(path, field, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def text_newlines(text: str) -> str:
    """The newlines text-mode open() reads: "\\r\\n" and a lone "\\r" become "\\n"."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_utf8(path, limit: int, error: type[FieldError] = FieldError, field: str = "text") -> str:
    """What `open(path, encoding="utf-8").read()` gives (a byte-order mark kept, `text_newlines`), read
    bounded: a regular file of at most `limit` bytes (`read_regular`: a FIFO or device refused, not
    waited on), UTF-8 (`decode_utf8`); else `error(path, field, why)`."""
    return text_newlines(decode_utf8(read_regular(path, limit, error, field), path, error, field, bom=True))


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in `text` (JSON's "\\ud800" parses to one; no UTF-8
    encodes it, so every writer of the text would fail on it), or None."""
    if text.isascii():
        return None
    m = _SURROGATE.search(text)
    return None if m is None else m.start()
