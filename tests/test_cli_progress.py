"""Long work shows progress in a log too: off a terminal, `exactedit`'s progress is a line per
tenth of the work (click's bar draws nothing there)."""
from __future__ import annotations

import contextlib


def test_progress_off_a_terminal_prints_a_line_per_tenth(capsys):
    from exactedit import cli

    with contextlib.ExitStack() as stack:
        tick = cli._progress(stack, "dataset")
        for done in range(0, 41):
            tick(done, 40)
        tick(40, 40)                       # a repeated last call prints nothing more
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "dataset: 0/40" and lines[-1] == "dataset: 40/40"
    assert len(lines) == 11 and len(set(lines)) == 11
