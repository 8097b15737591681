"""`exactedit serve`'s HTTP side: a FastAPI app speaking the OpenAI API over a `Backend`
(runs/serve/backend.py), every request bounded before it reaches the engine.

Routes: GET /v1/models, POST /v1/chat/completions, POST /v1/completions (both streamed as
server-sent events with `"stream": true`, ended by `data: [DONE]`), GET /health. Bounds: the body
is read up to `max_body_bytes` (past it, 413); a request is validated whole (runs/serve/protocol.py)
and its prompt rendered and tokenized before it queues; one reply generates at a time on one
worker thread (the engine is one), `max_waiting` more may wait, and past that a request is
answered 503 at once. Every error is OpenAI's JSON error object; an error inside a stream, once its
headers are sent, is one `data: {"error": ...}` event. Nothing in a request names a file: the
model, the rules and the template are the server's, fixed at startup.

A streamed reply sends only text that can no longer change (runs/serve/stream.py), so with the
rules' prefix penalty a banned phrase, which the rules keep from completing, is never sent; with
`--rules-mode rewind` the loop hands over only tokens it can no longer roll back, so neither a
phrase nor a variant of it that the rewind takes back is ever sent. A
client that goes away stops its reply at the next token."""
from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from exactedit.runs.serve.config import ServeConfig
from exactedit.runs.serve.protocol import (ApiError, ChatRequest, CompletionRequest, chat_chunk, chat_response,
    completion_chunk, completion_response, new_id, parse, sampling_of)

__all__ = ["Gate", "build_app"]

log = logging.getLogger("exactedit.serve")
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Gate:
    """One reply at a time on one worker thread, at most `waiting` more queued behind it; a
    request past that is refused (ApiError 503) without queueing."""

    def __init__(self, waiting: int):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="exactedit-serve")
        self._lock = threading.Lock()
        self.limit, self.admitted = waiting + 1, 0

    def _busy(self) -> ApiError:
        return ApiError(503, f"the server is busy: one reply is generating and {self.limit - 1} are waiting "
                        "(exactedit serve --max-waiting); retry later", type="server_error", code="server_busy")

    def check(self) -> None:
        """Refuse early (before a prompt is tokenized) when the queue is already full."""
        if self.admitted >= self.limit:
            raise self._busy()

    def submit(self, fn, *args) -> Future:
        with self._lock:
            if self.admitted >= self.limit:
                raise self._busy()
            self.admitted += 1
        fut = self._pool.submit(fn, *args)
        fut.add_done_callback(self._release)      # run, failed or cancelled before it ran: released once
        return fut

    def _release(self, _fut) -> None:
        with self._lock:
            self.admitted -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


async def _body(request: Request, cap: int) -> bytes:
    """The request body, at most `cap` bytes (a declared length over it is refused unread)."""
    too_big = ApiError(413, f"the request body is over this server's cap of {cap} bytes (exactedit serve "
                       "--max-body)", code="request_too_large")
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > cap):
        raise too_big if length.isdigit() else ApiError(400, "Content-Length: not a number")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > cap:
            raise too_big
    return bytes(data)


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def build_app(backend, cfg: ServeConfig) -> FastAPI:
    """The app over `backend` (a Backend, or anything with its `model_id`, `fingerprint`, `n_ctx`,
    `n_vocab`, `prompt_of_chat`, `prompt_of_text` and `run`); its Gate is `app.state.gate`."""
    app = FastAPI(title="exactedit serve", docs_url=None, redoc_url=None, openapi_url=None)
    gate = app.state.gate = Gate(cfg.max_waiting)

    @app.exception_handler(ApiError)
    async def _api_error(_request, exc: ApiError):
        headers = {"Retry-After": "1"} if exc.status == 503 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(HTTPException)
    async def _http_error(_request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(ApiError(exc.status_code, str(exc.detail), code=code).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(_request, exc: Exception):
        log.error("internal error", exc_info=exc)
        return JSONResponse(ApiError(500, f"internal error ({type(exc).__name__}); see the server's log",
                                     type="server_error").body(), status_code=500)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": backend.model_id, "object": "model", "created": 0,
                                            "owned_by": "exactedit"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = parse(await _body(request, cfg.max_body_bytes), ChatRequest)
        gate.check()
        prompt = await run_in_threadpool(backend.prompt_of_chat, [m.as_turn() for m in req.messages])
        return await _answer(req, prompt, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = parse(await _body(request, cfg.max_body_bytes), CompletionRequest)
        gate.check()
        prompt = await run_in_threadpool(backend.prompt_of_text, req.text)
        return await _answer(req, prompt, chat=False)

    async def _answer(req, prompt, *, chat: bool):
        sampling = sampling_of(req, cap=cfg.max_tokens, prompt_tokens=int(prompt.size), n_ctx=backend.n_ctx,
                               n_vocab=backend.n_vocab)
        rid, created = new_id("chatcmpl" if chat else "cmpl")
        head = (rid, created, backend.model_id, backend.fingerprint)
        cancel = threading.Event()
        if not req.stream:
            fut = gate.submit(backend.run, prompt, sampling, req.stops, None, cancel.is_set)
            try:
                reply = await asyncio.wrap_future(fut)
            except asyncio.CancelledError:          # the client went away: stop its reply
                cancel.set()
                raise
            return (chat_response if chat else completion_response)(*head, reply)
        return StreamingResponse(_stream(req, prompt, sampling, head, cancel, chat=chat),
                                 media_type="text/event-stream", headers=_SSE_HEADERS)

    def _stream(req, prompt, sampling, head, cancel: threading.Event, *, chat: bool):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def put(item) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:                    # the loop is gone (shutdown): nobody to tell
                pass

        def job() -> None:
            try:
                put(("done", backend.run(prompt, sampling, req.stops, lambda t: put(("text", t)), cancel.is_set)))
            except Exception as exc:                # noqa: BLE001 - reported to the client, and logged
                log.error("generation failed", exc_info=exc)
                put(("error", exc))

        fut = gate.submit(job)                      # 503 here, before any header is sent
        usage = req.stream_options is not None and req.stream_options.include_usage

        def piece(text: str) -> dict:
            return chat_chunk(*head, {"content": text}) if chat else completion_chunk(*head, text)

        async def events():
            try:
                if chat:
                    yield _sse(chat_chunk(*head, {"role": "assistant", "content": ""}))
                while True:
                    kind, value = await queue.get()
                    if kind == "text":
                        yield _sse(piece(value))
                        continue
                    if kind == "error":
                        yield _sse(ApiError(500, f"generation failed ({type(value).__name__}); see the server's log",
                                            type="server_error").body())
                        return
                    last = (chat_chunk(*head, {}, value.finish_reason) if chat
                            else completion_chunk(*head, "", value.finish_reason))
                    yield _sse({**last, "exactedit": value.extra()})
                    if usage:
                        yield _sse({**last, "choices": [], "usage": value.usage()})
                    break
                yield "data: [DONE]\n\n"
            finally:                                # done, or the client went away: stop the reply
                cancel.set()
                fut.cancel()

        return events()

    return app
