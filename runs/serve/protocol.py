"""The OpenAI API's shapes as `exactedit serve` speaks them: the requests it accepts (validated
whole before anything runs), its errors (`{"error": {"message", "type", "param", "code"}}`), and
the responses and stream chunks it sends.

A request's fields past the ones below are ignored, as OpenAI-compatible servers do; the fields
OpenAI defines that this server cannot honour (top_p, n, penalties, logit_bias, logprobs, tools,
response formats, ...) are refused unless they hold their neutral value (`NEUTRAL`), never
silently dropped. temperature 0 is greedy decoding: llama.cpp's chain with top-k 1 (the project's
`Sampling` takes temperature > 0; with one candidate left the temperature changes nothing).
top_k 0 means no top-k cut (the whole vocabulary), as in llama.cpp (which also cuts a top_k past
the vocabulary to it). A request without a seed gets a fresh one, reported back in the response's
`exactedit.seed`."""
from __future__ import annotations

import json
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from exactedit.files import lone_surrogate
from exactedit.native.llamacpp import SEED_LIMIT, Sampling

__all__ = ["ApiError", "ChatRequest", "CompletionRequest", "Reply", "chat_chunk", "chat_response", "completion_chunk",
           "completion_response", "parse", "sampling_of"]

MAX_STOPS, MAX_STOP_CHARS = 4, 256        # OpenAI's 4 stop strings; each bounded
_DEFAULT = Sampling()                     # temperature and top_k of a request that gives none
# OpenAI fields this server cannot honour: accepted only at these values (or null)
NEUTRAL = {"n": (1,), "top_p": (1,), "presence_penalty": (0,), "frequency_penalty": (0,), "logit_bias": ({},),
           "logprobs": (False, 0), "top_logprobs": (0,), "tools": ([],), "tool_choice": ("none",), "functions": ([],),
           "function_call": ("none",), "response_format": ({"type": "text"},), "best_of": (1,), "echo": (False,),
           "suffix": ("",)}


class ApiError(Exception):
    """A request answered with an error: HTTP `status` and OpenAI's error object."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def as_turn(self) -> dict:
        """{"role", "content"} as the chat template takes it (OpenAI's "developer" is a system turn)."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or ())
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(_Strict):
    include_usage: bool = False


class _Request(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def max_new(self) -> int | None:
        return self.max_tokens


class ChatRequest(_Request):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @property
    def max_new(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Request):
    prompt: str | list[str]

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _param(loc) -> str:
    """A pydantic error location as a parameter path: ('messages', 0, 'content', 'str') -> messages[0].content."""
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and p.isidentifier() and p not in _TYPE_TAGS:
            out += f".{p}" if out else p
        else:
            break
    return out


def _same(v, neutral) -> bool:
    """`v` is the neutral value: of its type (1.0 for 1 too, never true for 1) and equal."""
    return (type(v) is type(neutral) or type(neutral) is int and type(v) is float) and v == neutral


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse(body: bytes, model: type[_Request]) -> _Request:
    """A request body (at most the server's cap, read by the caller) as `model`, or ApiError 400."""
    try:
        obj = json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        raise ApiError(400, "the body is not JSON: nested too deeply") from None
    except ValueError as exc:               # JSONDecodeError, UnicodeDecodeError, NaN / Infinity
        raise ApiError(400, f"the body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ApiError(400, "the body must be a JSON object")
    todo = [("", obj)]
    while todo:                             # every string, keys too: no lone surrogate reaches the tokenizer
        where, v = todo.pop()
        if isinstance(v, str) and lone_surrogate(v) is not None:
            raise ApiError(400, f"{where or 'body'}: a lone surrogate, not valid Unicode text", param=where or None)
        if isinstance(v, dict):
            todo += [(f"{where}.{k}" if where else str(k), x) for k, x in v.items()] + [(where, k) for k in v]
        elif isinstance(v, list):
            todo += [(f"{where}[{i}]", x) for i, x in enumerate(v)]
    for key, ok in NEUTRAL.items():
        v = obj.get(key)
        if v is not None and not any(_same(v, o) for o in ok):
            raise ApiError(400, f"{key}={json.dumps(v)[:80]} is not supported by exactedit serve (accepted: "
                           f"{' or '.join(json.dumps(o) for o in ok)} or null)", param=key,
                           code="unsupported_parameter")
    try:
        req = model.model_validate(obj)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        param = _param(errors[0]["loc"])
        msgs = list(dict.fromkeys(e["msg"] for e in errors if _param(e["loc"]) == param))
        raise ApiError(400, f"{param or 'body'}: {'; or '.join(msgs[:3])}", param=param or None) from None
    stops = req.stops
    if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise ApiError(400, f"stop: at most {MAX_STOPS} strings of 1 to {MAX_STOP_CHARS} characters", param="stop")
    if isinstance(req, CompletionRequest) and isinstance(req.prompt, list) and len(req.prompt) != 1:
        raise ApiError(400, "prompt: one prompt per request (a string, or a list of one string)", param="prompt")
    return req


def sampling_of(req: _Request, *, cap: int, prompt_tokens: int, n_ctx: int, n_vocab: int) -> Sampling:
    """The request's Sampling: max_tokens within the server's `cap` and the context left after the
    prompt (its default: as much of both as there is), temperature 0 as greedy (module doc)."""
    room = n_ctx - prompt_tokens
    if room < 1:
        raise ApiError(400, f"the prompt is {prompt_tokens} tokens: no room left in the context of {n_ctx}",
                       param="messages" if isinstance(req, ChatRequest) else "prompt", code="context_length_exceeded")
    given = req.max_new
    if given is not None and given > cap:
        raise ApiError(400, f"max_tokens: {given} is over this server's cap of {cap} (exactedit serve --max-tokens)",
                       param="max_tokens", code="max_tokens_exceeded")
    if given is not None and given > room:
        raise ApiError(400, f"max_tokens: {given} and the prompt's {prompt_tokens} tokens do not fit in the context "
                       f"of {n_ctx}", param="max_tokens", code="context_length_exceeded")
    max_new = given if given is not None else min(cap, room)
    seed = req.seed if req.seed is not None else secrets.randbelow(SEED_LIMIT)
    top_k = _DEFAULT.top_k if req.top_k is None else min(req.top_k or n_vocab, n_vocab)   # llama.cpp's own clamp
    temperature = _DEFAULT.temperature if req.temperature is None else req.temperature
    if temperature == 0:
        return Sampling(max_new=max_new, temperature=1.0, top_k=1, seed=seed)
    return Sampling(max_new=max_new, temperature=temperature, top_k=top_k, seed=seed)


@dataclass(frozen=True)
class Reply:
    """One reply as the server reports it: its text (cut before a stop string; the stop token's
    text left out), the prompt's and the reply's token counts (the stop token counted), why it
    ended (OpenAI's "stop" or "length"), its seed, how many steps each rule fired at, and in rewind
    mode the phrase of each rollback, in order."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    seed: int
    fired: dict
    rewinds: tuple | None = None

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def extra(self) -> dict:
        out = {"seed": self.seed, "rules_fired": dict(self.fired)}
        if self.rewinds is not None:
            out["rewinds"] = list(self.rewinds)
        return out


def new_id(prefix: str) -> tuple[str, int]:
    """(a response id, its creation time in Unix seconds)."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time())


def chat_response(rid: str, created: int, model: str, fingerprint: str, r: Reply) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": fingerprint,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": r.text}, "logprobs": None,
                         "finish_reason": r.finish_reason}],
            "usage": r.usage(), "exactedit": r.extra()}


def chat_chunk(rid: str, created: int, model: str, fingerprint: str, delta: dict, finish: str | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": fingerprint,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def completion_response(rid: str, created: int, model: str, fingerprint: str, r: Reply) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": fingerprint,
            "choices": [{"index": 0, "text": r.text, "logprobs": None, "finish_reason": r.finish_reason}],
            "usage": r.usage(), "exactedit": r.extra()}


def completion_chunk(rid: str, created: int, model: str, fingerprint: str, text: str,
                     finish: str | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": fingerprint,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
