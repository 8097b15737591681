"""The CLI's `--slots` defaults are the batched loop's own (native/llamacpp/batched.py DEFAULT_SLOTS): the
commands and the library decode the same number of replies together unless told otherwise."""
from __future__ import annotations

from exactedit.cli import main
from exactedit.native.llamacpp.batched import DEFAULT_SLOTS


def _default(path, name):
    cmd = main
    for part in path:
        cmd = cmd.commands[part]
    return next(p.default for p in cmd.params if p.name == name)


def test_bench_generate_and_shape_rates_default_to_the_batched_loops_slots():
    assert _default(("bench", "generate"), "slots") == DEFAULT_SLOTS
    assert _default(("shape", "rates"), "slots") == DEFAULT_SLOTS
