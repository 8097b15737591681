"""A dump's data identity: every field file re-hashed against the manifest, streaming.

The manifest lists each field file's sha256 and `Dump.sha256()` hashes the canonical manifest. A
manifest alone says nothing about the bytes beside it (scale `R.npy` by 3 and its hash is unchanged),
so `read_dump` re-hashes every field file by default (`verify_fields`): once each one matches, the
manifest's hash covers every byte of the dump (a hash of the field hashes), and that is the
identity the ledger records. A mismatch is a `DumpFormatError` naming the dump and the field.

Hashing reads every byte once (about 1 GB/s per core, see `exactedit bench dump-verify`). A process
that opens the same dump several times passes a `VerifyCache` it owns: a dump verified once is not
re-hashed while its manifest and its field files' size, mtime, ctime and inode stay the same.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from exactedit.dumps.errors import DumpFormatError

Progress = Callable[[int, int], None]
CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class VerifyKey:
    """What a verification depends on: the dump directory, its manifest's hash, and each field
    file's (name, size, mtime_ns, ctime_ns, inode)."""

    path: str
    manifest_sha256: str
    files: tuple[tuple[str, int, int, int, int], ...]


class VerifyCache:
    """Dumps whose field hashes matched, owned by the caller (one per command). A key differs as
    soon as a field file is rewritten, replaced or resized, or the manifest changes."""

    def __init__(self) -> None:
        self._ok: set[VerifyKey] = set()
        self.hits = 0
        self.hashed_bytes = 0

    def __contains__(self, key: VerifyKey) -> bool:
        return key in self._ok

    def add(self, key: VerifyKey) -> None:
        self._ok.add(key)


def verify_key(path, manifest_sha256: str, files: Mapping[str, str]) -> VerifyKey:
    """The cache key of a dump: `files` maps field name -> file name inside `path`."""
    path = Path(path)
    stats = []
    for name, file in sorted(files.items()):
        try:
            st = os.stat(path / file)
        except OSError as exc:
            raise DumpFormatError(path, name, f"{file}: cannot be read ({exc.strerror})") from None
        stats.append((file, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return VerifyKey(str(path.resolve()), manifest_sha256, tuple(stats))


def hash_file(file: Path, buf: bytearray, progress: Callable[[int], None] | None = None) -> str:
    """sha256 of `file`, read into the reused buffer `buf`; progress(bytes) after each chunk."""
    h, view = hashlib.sha256(), memoryview(buf)
    with open(file, "rb", buffering=0) as fh:
        while n := fh.readinto(view):
            h.update(view[:n])
            if progress is not None:
                progress(n)
    return h.hexdigest()


def verify_fields(path, files: Mapping[str, str], hashes: Mapping[str, str], manifest_sha256: str, *,
                  cache: VerifyCache | None = None, progress: Progress | None = None) -> int:
    """Re-hash every field file of the dump at `path` against the manifest's `hashes`; raise
    DumpFormatError naming the first field that differs. Returns the bytes hashed (0 on a cache hit)."""
    path = Path(path)
    key = verify_key(path, manifest_sha256, files) if cache is not None else None
    if cache is not None and key in cache:
        cache.hits += 1
        return 0
    total = sum(os.path.getsize(path / f) for f in files.values())
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        progress(done, total)

    buf = bytearray(CHUNK_BYTES)
    for name, file in files.items():
        try:
            got = hash_file(path / file, buf, tick if progress is not None else None)
        except OSError as exc:
            raise DumpFormatError(path, name, f"{file}: cannot be read ({exc.strerror})") from None
        if got != hashes[name]:
            raise DumpFormatError(path, name, f"{file}: sha256 {got} differs from the manifest's {hashes[name]}: "
                                  "the field's data changed after the dump was written")
    if cache is not None:
        if verify_key(path, manifest_sha256, files) != key:
            raise DumpFormatError(path, "fields", "a field file changed while it was being verified")
        cache.add(key)
        cache.hashed_bytes += total
    return total
