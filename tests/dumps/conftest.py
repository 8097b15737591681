"""Small valid dumps for the dump-format tests (tiny shapes: these tests run in seconds).

Everything is a fixture (no `import conftest`), so the tests work under any pytest import mode.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exactedit.dumps import DocInfo, write_dump

DIMS = {"T": 12, "n": 8, "h": 6, "S": 4, "vocab": 50}


def _fields(arch: str, seed: int = 0, with_roles: bool = True, **changes) -> dict[str, np.ndarray]:
    """Float64 / int64 arrays as a user would hand them to the writer (it coerces); a change of
    None drops that field."""
    T, n, h, S, vocab = (DIMS[k] for k in ("T", "n", "h", "S", "vocab"))
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, T)
    fields = {"tokens": tokens, "next": np.r_[tokens[1:], -1]}
    if arch == "hc4":
        fields.update(R=rng.normal(size=(T, S, n)), inj=rng.normal(size=(T, S)), hh=rng.normal(size=(T, h)),
                      sgv=rng.normal(size=T), yr=rng.normal(size=(T, n)))
    else:
        fields.update(R=rng.normal(size=(T, n)), hh=rng.normal(size=(T, h)))
    if with_roles:
        fields["roles"] = rng.integers(0, 256, T).astype(np.uint8)
    for name, value in changes.items():
        if value is None:
            fields.pop(name)
        else:
            fields[name] = value
    return fields


def _docs() -> list[DocInfo]:
    T = DIMS["T"]
    return [DocInfo("train-a", 0, T // 3, "chat-a", "alice", ("chat", "style")),
            DocInfo("anchor-plain", T // 3, T - T // 3, "wiki", "none", ("anchor", "plain"))]


@pytest.fixture(scope="session")
def dims() -> dict[str, int]:
    return dict(DIMS)


@pytest.fixture(scope="session")
def make_fields():
    """make_fields(arch, seed=0, with_roles=True, **changes) -> dict of arrays for write_dump."""
    return _fields


@pytest.fixture(scope="session")
def make_docs():
    """make_docs() -> two DocInfo covering all DIMS["T"] rows."""
    return _docs


@pytest.fixture(scope="session")
def make_dump():
    """make_dump(path, arch="hc4", seed=0, **write_dump kwargs) -> Path of a valid dump."""

    def make(path, arch: str = "hc4", seed: int = 0, **kw) -> Path:
        return write_dump(Path(path), arch=arch, layer=47 if arch == "hc4" else 23, fields=_fields(arch, seed),
                          docs=_docs(), meta={"n_batch": 512, "n_ctx": 4096}, **kw)

    return make
