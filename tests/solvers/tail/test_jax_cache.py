"""JAX's persistent compilation cache (solvers/tail/forward/jax_cache.py): where it goes, on by default,
EXACTEDIT_JAX_CACHE=PATH / off, set up by the device selection, a new process loads what an
earlier one compiled; and the compile counter."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from exactedit.solvers.tail.forward import device as devmod
from exactedit.solvers.tail.forward import jax_cache


@pytest.mark.parametrize("env,want", [
    ({"HOME": "/home/u"}, "/home/u/.cache/exactedit/jax"),
    ({"HOME": "/home/u", "XDG_CACHE_HOME": "/xdg"}, "/xdg/exactedit/jax"),
    ({"HOME": "/home/u", "EXACTEDIT_JAX_CACHE": "/elsewhere/jc"}, "/elsewhere/jc"),
    ({"HOME": "/home/u", "EXACTEDIT_JAX_CACHE": "off"}, None),
    ({"HOME": "/home/u", "EXACTEDIT_JAX_CACHE": "OFF"}, None),
    ({"HOME": "/home/u", "JAX_COMPILATION_CACHE_DIR": "/tmp/jc"}, "/tmp/jc"),
    ({"HOME": "/home/u", "JAX_COMPILATION_CACHE_DIR": "/tmp/jc", "EXACTEDIT_JAX_CACHE": "off"}, None),
])
def test_cache_dir(env, want):
    assert jax_cache.cache_dir(env) == want


@pytest.fixture
def restore_cache():
    was = jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache
    yield
    jax.config.update("jax_enable_compilation_cache", was[1])
    jax.config.update("jax_compilation_cache_dir", was[0])
    from jax.experimental.compilation_cache import compilation_cache as cc
    cc.reset_cache()


def test_device_setup_turns_it_on_and_off(tmp_path, monkeypatch, restore_cache):
    monkeypatch.setenv("EXACTEDIT_JAX_CACHE", str(tmp_path / "jc"))
    dev = devmod.select("cpu")
    state = devmod.describe(dev)["compilation_cache"]
    assert state == {"dir": str(tmp_path / "jc"), "on": True} and (tmp_path / "jc").is_dir()
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1
    x = jnp.arange(7.0)
    jax.jit(lambda a: a * 3.0 + 0.25)(x).block_until_ready()          # a tiny program is cached too
    assert any(p.name.startswith("jit_") for p in (tmp_path / "jc").iterdir())
    monkeypatch.setenv("EXACTEDIT_JAX_CACHE", "off")
    assert devmod.pass_device("cpu") is None
    assert devmod.describe(dev)["compilation_cache"]["on"] is False


def test_unwritable_directory_is_a_clean_error(tmp_path, monkeypatch, restore_cache):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("EXACTEDIT_JAX_CACHE", str(blocker / "jc"))
    with pytest.raises(jax_cache.JaxCacheError, match="EXACTEDIT_JAX_CACHE"):
        devmod.select("cpu")


def test_a_new_process_loads_the_compiled_programs(tmp_path):
    """Run the same bucketed mix in two processes: the second compiles nothing fresh."""
    script = textwrap.dedent("""
        import json, numpy as np
        from exactedit.solvers.tail.forward import device as devmod, head_fast
        from exactedit.solvers.tail.forward.head_ref import Hc4Head
        from exactedit.solvers.tail.forward.jax_cache import CompileCounter
        devmod.select("cpu")
        rng = np.random.default_rng(0)
        head = Hc4Head(np.ones((4, 32), np.float32), rng.standard_normal((4, 128)).astype(np.float32),
                       rng.standard_normal((128, 4)).astype(np.float32), 1e-6)
        with CompileCounter() as c:
            head_fast.hc4_mix(rng.standard_normal((50, 4, 32)).astype(np.float32), head)
        print(json.dumps(c.to_dict()))
    """)
    env = dict(os.environ, EXACTEDIT_JAX_CACHE=str(tmp_path / "jc"))
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)]
    import json
    first, second = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert first["fresh_compiles"] >= 1 and first["cache_hits"] == 0
    assert second["compiles"] == first["compiles"] and second["fresh_compiles"] == 0


def test_counter_counts_and_stops_listening():
    f = jax.jit(lambda a: jnp.sin(a) * 2.0)
    with jax_cache.CompileCounter() as c:
        f(np.zeros(13, np.float32))
        f(np.ones(13, np.float32))
    assert c.compiles == 1 and c.traces >= 1
    c.mark("all")
    f(np.zeros(14, np.float32))
    assert c.compiles == 1 and c.to_dict()["by_phase"]["all"]["compiles"] == 1


def test_the_cli_option_sets_the_cache_before_any_command(monkeypatch, tmp_path):
    """`exactedit --jax-cache off|DIR CMD` is EXACTEDIT_JAX_CACHE for that command."""
    import os

    from click.testing import CliRunner

    from exactedit.cli import main

    monkeypatch.setenv("EXACTEDIT_JAX_CACHE", "")     # restored at teardown, whatever the CLI writes
    r = CliRunner().invoke(main, ["--jax-cache", "off", "inspect", "--help"])
    assert r.exit_code == 0 and os.environ["EXACTEDIT_JAX_CACHE"] == "off"
    from exactedit.solvers.tail.forward.jax_cache import cache_dir

    assert cache_dir() is None
    CliRunner().invoke(main, ["--jax-cache", str(tmp_path / "c"), "inspect", "--help"])
    assert cache_dir() == str(tmp_path / "c")
