"""`exactedit verify engine` checks the dump against --model before anything runs: a dump
captured from another model, or with tampered fields, is refused cleanly; a dump of this model
goes through (here with a stand-in engine that answers with the exact offline logits, so the
check under test is the plumbing, not an engine's arithmetic)."""
from __future__ import annotations

import json
import shlex
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit import quant
from exactedit.cli import main
from exactedit.dumps import DocInfo, write_dump
from exactedit.quant.gguf.write import synthetic_model
from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

N, H, V, T = 256, 32, 40, 5

ENGINE = """\
import sys
import numpy as np
from exactedit.solvers.tail.logits import write_logits
args = dict(zip(sys.argv[1:-1:2], sys.argv[2:-1:2]))
r = write_logits(args["--metal-gguf"], sys.argv[-1], args["--logits-out"] + ".npy")
np.load(r.out).astype("<f4").tofile(args["--logits-out"])
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("ve")
    a = synthetic_model(root / "a.gguf", vocab=V, n=N, h=H, layers=1, head_type="Q8_0", seed=1)
    b = synthetic_model(root / "b.gguf", vocab=V, n=N, h=H, layers=1, head_type="Q8_0", seed=2)
    rng = np.random.default_rng(0)
    fields = {"tokens": rng.integers(0, V, T), "next": np.full(T, -1), "R": rng.standard_normal((T, N)),
              "hh": rng.standard_normal((T, H))}
    dump = write_dump(root / "d", arch="rmsnorm", layer=0, docs=[DocInfo("x", 0, T, "s", "c")], fields=fields,
                      model_sha256=a.sha256)
    edit = TensorEdit("output.weight", "rows", "Q8_0", (V, N), quant.quantize(rng.standard_normal((1, N)), "Q8_0"),
                      np.array([3]))
    bundles = {m.path.stem: write_bundle(root / f"bundle-{m.path.stem}", solver="test", config={}, edits=[edit],
                                         inputs=[InputRef("model", str(m.path), m.sha256)]).path for m in (a, b)}
    (root / "engine.py").write_text(ENGINE)
    template = (f"{shlex.quote(sys.executable)} {shlex.quote(str(root / 'engine.py'))} --metal-gguf {{gguf}} "
                f"--tokens-file {{tokens}} --logits-out {{logits}} {shlex.quote(str(dump))}")
    return a, b, dump, bundles, template


def _verify(model, bundle, dump, template):
    return CliRunner().invoke(main, ["verify", "engine", "--command", template, "--model", str(model),
                                     "--bundle", str(bundle), "--dump", str(dump), "--json"])


def test_a_dump_of_this_model_is_verified(world):
    a, _, dump, bundles, template = world
    r = _verify(a.path, bundles["a"], dump, template)
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["passed"] and rep["settings"]["dump_model_sha256"] == a.sha256 == rep["model_sha256"]


def test_a_dump_of_another_model_is_refused(world):
    _, b, dump, bundles, template = world
    r = _verify(b.path, bundles["b"], dump, template)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{dump}: model_sha256: the dump was captured from a model with sha256 {world[0].sha256}" in r.output
    assert b.sha256 in r.output


def test_a_tampered_dump_is_refused(world, tmp_path):
    import shutil

    a, _, dump, bundles, template = world
    d = tmp_path / "d"
    shutil.copytree(dump, d)
    hh = np.load(d / "hh.npy")
    np.save(d / "hh.npy", (hh * 3).astype("<f4"))
    r = _verify(a.path, bundles["a"], d, template.replace(shlex.quote(str(dump)), shlex.quote(str(d))))
    assert r.exit_code == 1 and f"{d}: hh: hh.npy: sha256" in r.output
