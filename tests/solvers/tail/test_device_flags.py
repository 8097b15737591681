"""XLA_FLAGS when the user sets none: cuBLAS gemms only (`--xla_gpu_enable_triton_gemm=false`), set
before JAX's backends start; a user's XLA_FLAGS is kept; once the backends run it is left alone."""
from __future__ import annotations

import os
import subprocess
import sys

from exactedit.solvers.tail.forward.device import DEFAULT_XLA_FLAGS, default_xla_flags

PROBE = ("import os, jax; from exactedit.solvers.tail.forward.device import select; select('cpu'); "
         "print(os.environ.get('XLA_FLAGS', '<unset>'))")


def _run(env_extra: dict) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | env_extra | {"EXACTEDIT_JAX_CACHE": "off"}
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_default_flags_before_the_backends_start_and_the_users_kept():
    assert _run({}) == DEFAULT_XLA_FLAGS
    assert _run({"XLA_FLAGS": "--xla_dump_to=/tmp/x"}) == "--xla_dump_to=/tmp/x"


def test_left_alone_once_the_backends_run():
    import jax

    jax.devices()
    env: dict = {}
    assert default_xla_flags(env) == "" and env == {}
