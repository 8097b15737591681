"""tests/oracles.py decides what a missing oracle or live extra means: a skip that says why, or,
under EXACTEDIT_REQUIRE_ORACLES=1 (set by .ci/run), a failure with the same message; package
missing and library missing end the same way. The subprocess runs are the CI claim itself: with
llama_cpp's libraries made unavailable, an oracle test run fails under the variable."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import oracles

ROOT = Path(__file__).resolve().parents[1]
ORACLE_TESTS = ["tests/quant/test_floats.py", "tests/quant/test_q8_k.py"]


def _stub(tmp_path) -> Path:
    """A `llama_cpp` package first on the path, without its libraries (lib/ empty)."""
    pkg = tmp_path / "stub" / "llama_cpp"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""stand-in without libggml-base"""\n')
    return tmp_path / "stub"


def _pytest(tmp_path, require: bool):
    env = {k: v for k, v in os.environ.items() if k != oracles.REQUIRE_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(_stub(tmp_path)), str(ROOT)])
    env["EXACTEDIT_HOME"] = str(tmp_path / "home")
    if require:
        env[oracles.REQUIRE_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ORACLE_TESTS,
                           "-k", "ggml or oracle or fp16 or bf16"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_stub_really_hides_the_library(tmp_path):
    out = subprocess.run([sys.executable, "-c", "import llama_cpp, sys; print(llama_cpp.__file__)"],
                         env={**os.environ, "PYTHONPATH": str(_stub(tmp_path))}, capture_output=True, text=True)
    assert str(tmp_path / "stub") in out.stdout


def test_missing_library_skips_with_the_reason(tmp_path):
    res = _pytest(tmp_path, require=False)
    assert res.returncode == 0, res.stdout + res.stderr
    last = res.stdout.splitlines()[-1]
    assert "skipped" in last and "failed" not in last and "error" not in last
    assert "ggml oracle unavailable" in res.stdout and "libggml-base" in res.stdout


def test_missing_library_fails_under_the_ci_variable(tmp_path):
    res = _pytest(tmp_path, require=True)
    assert res.returncode == 1, res.stdout + res.stderr  # pytest's "tests failed" (errors at setup included)
    assert " skipped" not in res.stdout.splitlines()[-1]
    assert "ggml oracle unavailable" in res.stdout and f"{oracles.REQUIRE_ENV}=1" in res.stdout


@pytest.mark.parametrize("require", [False, True])
def test_package_or_library_missing_end_the_same_way(monkeypatch, tmp_path, require):
    """Both causes raise the same pytest outcome with the same message head, in both modes."""
    monkeypatch.setenv(oracles.REQUIRE_ENV, "1") if require else monkeypatch.delenv(oracles.REQUIRE_ENV, raising=False)
    outcome = pytest.fail.Exception if require else pytest.skip.Exception
    real = importlib.util.find_spec
    seen = []
    for patch in ({"llama_cpp": None}, {"llama_cpp": importlib.util.spec_from_file_location(
            "llama_cpp", _stub(tmp_path) / "llama_cpp" / "__init__.py")}):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, p=patch: p[name] if name in p else real(name, *a))
        for load in (oracles.load, lambda: oracles.ggml_library("ggml-cpu"), oracles.llama_cpp):
            with pytest.raises(outcome) as err:
                load()
            seen.append(str(err.value))
    assert all("unavailable (it ships with the `live` extra" in m for m in seen)
    assert any("not installed" in m for m in seen) and any("not found" in m for m in seen)
    assert all((oracles.REQUIRE_ENV in m) == require for m in seen)


def test_a_missing_model_package_is_a_failure_in_ci(monkeypatch):
    from exactedit.native.llamacpp import models

    monkeypatch.setattr(models, "installed", lambda name: False)
    monkeypatch.delenv(oracles.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="the qwen model unavailable"):
        oracles.live_model("qwen")
    monkeypatch.setenv(oracles.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="the qwen model unavailable.*EXACTEDIT_REQUIRE_ORACLES=1"):
        oracles.live_model("qwen")


def test_ci_sets_the_variable_before_the_readme_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    readme = (ROOT / "README.md").read_text()
    command = next(line for line in ci if line.startswith("pip install"))
    assert command in readme  # the test command line stays README's
    assert ci.index(f"export {oracles.REQUIRE_ENV}=1") < ci.index(command)
