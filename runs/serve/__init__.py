"""`exactedit serve`: an OpenAI-compatible HTTP server (FastAPI on uvicorn) whose every reply is
sampled by the project's one generation loop with the compiled shaping rules live (docs/serve.md):
its settings and bounds (`config`), the API's requests, errors and responses (`protocol`), the
text a stream may send (`stream`), the engine side (`backend`), the app (`app`) and the server
(`server`).

The names below are imported on first use (their modules pull in FastAPI and the engine).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "ApiError": "protocol",
    "Backend": "backend",
    "ServeConfig": "config",
    "ServeError": "config",
    "TextStream": "stream",
    "build_app": "app",
    "running": "server",
    "serve": "server",
})
