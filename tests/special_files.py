"""Special files standing where a reader expects a text: a FIFO, a link to /dev/zero, a symlink loop.

`fifo(path)` makes a FIFO that a watchdog thread keeps releasing for `watch_s`: whenever a reader
has it open, the thread opens the write end and closes it again. A reader under test that opens it
blocking (the defect: it waits forever for a writer) then sees end-of-file, so the test fails on
its assertion instead of hanging the suite; a reader that refuses the FIFO without blocking never
notices the thread.
"""
from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

KINDS = ("fifo", "zero", "loop")
WHY = {"fifo": "not a regular file (a FIFO)", "zero": "not a regular file (a character device)",
       "loop": "Too many levels of symbolic links"}


def fifo(path, watch_s: float = 10.0) -> Path:
    path = Path(path)
    os.mkfifo(path)

    def release():
        end = time.monotonic() + watch_s
        while time.monotonic() < end:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)      # ENXIO while no reader has it open
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    return                                        # removed with its test's directory
            else:
                os.close(fd)
            time.sleep(0.02)

    threading.Thread(target=release, daemon=True).start()
    return path


def special(path, kind: str) -> Path:
    """A special file of `kind` ("fifo", "zero", "loop") at `path`."""
    path = Path(path)
    if kind == "fifo":
        return fifo(path)
    path.symlink_to("/dev/zero" if kind == "zero" else path.name)
    return path
