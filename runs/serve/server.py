"""`exactedit serve`: the Backend and its app under uvicorn, until interrupted; and `running`, the
same server on a thread of this process (the live tests and `exactedit bench serve` talk to it
over HTTP like any client)."""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

from exactedit.runs.serve.app import build_app
from exactedit.runs.serve.backend import Backend
from exactedit.runs.serve.config import ServeConfig, ServeError

__all__ = ["running", "serve"]

_EXTRA_CONNECTIONS = 32     # open connections past the queue's, before uvicorn itself answers 503


def _uvicorn_config(app, cfg: ServeConfig, host: str, port: int, log_level: str):
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off",
                          limit_concurrency=cfg.max_waiting + 1 + _EXTRA_CONNECTIONS, timeout_graceful_shutdown=5)


def serve(cfg: ServeConfig) -> None:
    """Load the model and its rules, then serve on cfg.host:cfg.port until interrupted (Ctrl-C)."""
    import uvicorn

    with Backend(cfg) as backend:
        app = build_app(backend, cfg)
        try:
            uvicorn.Server(_uvicorn_config(app, cfg, cfg.host, cfg.port, "info")).run()
        finally:
            app.state.gate.close()


@contextlib.contextmanager
def running(app, cfg: ServeConfig, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> Iterator[str]:
    """`app` served by uvicorn on a thread (port 0: a free one), yielding its base URL
    ("http://HOST:PORT"); stopped, its worker drained, on exit."""
    import uvicorn

    server = uvicorn.Server(_uvicorn_config(app, cfg, host, port, "warning"))
    thread = threading.Thread(target=server.run, name="exactedit-serve-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise ServeError(f"{host}:{port}", "listen", "the server did not start (is the port taken?)")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        app.state.gate.close()
