"""The distribution installs one top-level package, `exactedit`, and runs from its wheel.

Builds the wheel with pip (build isolation: the pyproject's own build requirements), reads its
top_level.txt and RECORD, installs it with --no-deps into a throwaway venv and runs `exactedit
--version` and `exactedit demo` through that venv's console script (the check asserts that the
package really came from the wheel, not from this checkout).
"""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, text=True)
    (whl,) = out.glob("exactedit-*.whl")
    return whl


def test_wheel_has_one_top_level_package(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert z.read(info).decode().split() == ["exactedit"]
        record = z.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
    tops = {line.split("/", 1)[0] for line in record.splitlines() if line}
    assert tops == {"exactedit", info.split("/", 1)[0]}, tops
    for must in ("exactedit/__init__.py", "exactedit/cli.py", "exactedit/errors.py", "exactedit/files.py",
                 "exactedit/quant/kquants/q6_k.py", "exactedit/solvers/tail/passes/kl_pass.py",
                 "exactedit/fixtures/default/model.gguf", "exactedit/fixtures/default/protocol.toml",
                 "exactedit/runs/demo.py", "exactedit/runs/bundled/gemma/chat_template.jinja",
                 "exactedit/runs/bundled/gemma/antislop/defaults.toml", "exactedit/runs/bundled/qwen/texts/garden.txt",
                 "exactedit/runs/bundled/qwen/antislop/phrases.txt",
                 "exactedit/runs/bundled/qwen/persona/persona.toml"):
        assert must in names, must
    assert not [n for n in names if n.startswith("exactedit/tests/") or "/fixturegen/" in n]


def test_wheel_installs_into_a_fresh_venv_and_runs_the_demo(wheel, tmp_path):
    """A throwaway venv gets the wheel (--no-deps); its dependencies come from this environment's
    site-packages through a plain path entry, which does not run that directory's .pth files, so the
    editable install of this checkout is not seen. The console script runs --version and the demo."""
    import site
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    deps = [p for p in site.getsitepackages() + [sysconfig.get_paths()["purelib"]] if Path(p).is_dir()]
    (purelib / "deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, text=True)
    where = subprocess.run([str(py), "-c", "import exactedit; print(exactedit.__file__)"], check=True,
                           capture_output=True, text=True, cwd=tmp_path).stdout.strip()
    assert Path(where).is_relative_to(purelib), where          # from the wheel, not this checkout
    env = {"EXACTEDIT_HOME": str(tmp_path / "home"), "PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    run = lambda *args: subprocess.run([str(venv / "bin" / "exactedit"), *args], capture_output=True,  # noqa: E731
                                       text=True, cwd=tmp_path, env=env)
    v = run("--version")
    assert v.returncode == 0 and "0.1.0" in v.stdout, v.stderr
    d = run("demo", "--out", str(tmp_path / "demo"))
    assert d.returncode == 0, d.stderr[-2000:]
    assert (tmp_path / "demo" / "wfld" / "report.json").is_file()
    assert (tmp_path / "demo" / "blind.cmd").is_file()
