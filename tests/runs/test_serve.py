"""`exactedit serve` without an engine (issue 39, item 1): requests validated whole and bounded
before they reach the engine (body size, max_tokens, the context, the queue), OpenAI's error
object for every refusal, the sampling a request maps to (temperature 0 greedy), a stream's SSE
framing, the queue, a client leaving a stream. The app runs over a scripted
backend with the real one's interface (tests/runs/test_live_serve.py runs the real one on
SmolLM2; tests/runs/test_serve_stream.py, the text a stream may send)."""
from __future__ import annotations

import importlib.util
import json
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

from tests import oracles

if importlib.util.find_spec("fastapi") is None:      # the server's FastAPI and uvicorn ship with the live extra
    if oracles.required():
        pytest.fail("FastAPI unavailable: pip install -e '.[live]'", pytrace=False)
    pytest.skip("FastAPI unavailable (it ships with the live extra: pip install -e '.[live]')",
                allow_module_level=True)

from exactedit.native.llamacpp import SEED_LIMIT, Sampling  # noqa: E402
from exactedit.runs.serve import ApiError, ServeConfig, ServeError, TextStream, build_app, running  # noqa: E402
from exactedit.runs.serve.app import Gate  # noqa: E402
from exactedit.runs.serve.protocol import ChatRequest, CompletionRequest, Reply, parse, sampling_of  # noqa: E402

WORDS = ["Hello", ",", " wor", "ld", "!", " Here", "'s", " an", " ex", "ample", "."]


class Scripted:
    """The Backend's interface over a fixed script of token pieces: a prompt is one token per
    character; `run` streams WORDS through the real TextStream and records what it was asked.
    With `hold` set it waits on it before the first piece (the engine busy)."""

    model_id, fingerprint, n_ctx, n_vocab = "scripted", "exactedit-test", 64, 1000

    def __init__(self, hold: threading.Event | None = None, pace: float = 0.0):
        self.hold, self.pace = hold, pace
        self.calls: list[tuple[np.ndarray, Sampling, tuple]] = []
        self.turns: list = []
        self.cancelled_at: int | None = None

    def prompt_of_chat(self, turns):
        self.turns.append(turns)
        return np.zeros(sum(len(t["content"]) for t in turns) + 1, np.int32)

    def prompt_of_text(self, text):
        return np.zeros(len(text), np.int32)

    def run(self, prompt, sampling, stops=(), on_text=None, cancelled=lambda: False):
        self.calls.append((prompt, sampling, tuple(stops)))
        if self.hold is not None:
            self.hold.wait(10)
        stream, n = TextStream(stops), 0
        for n, w in enumerate(WORDS[:sampling.max_new], 1):
            time.sleep(self.pace)
            text = stream.push(w.encode())
            if text and on_text:
                on_text(text)
            if cancelled():
                self.cancelled_at = n
                break
            if stream.stopped:
                break
        tail = stream.finish()
        if tail and on_text:
            on_text(tail)
        finish = "stop" if stream.stopped or n < sampling.max_new else "length"
        return Reply(stream.text, int(prompt.size), n, finish, sampling.seed, {"prefix-penalty": 1})


def _cfg(**kw) -> ServeConfig:
    return ServeConfig(model="scripted.gguf", **{"max_tokens": 8, "max_body_bytes": 4096, **kw})


@pytest.fixture
def client():
    from fastapi.testclient import TestClient

    backend = Scripted()
    app = build_app(backend, _cfg())
    with TestClient(app) as c:
        c.backend = backend
        yield c
    app.state.gate.close()


CHAT = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}


def _error(res, status: int, param=None, code=None) -> dict:
    assert res.status_code == status, res.text
    err = res.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert (err["param"], err["code"]) == (param, code), err
    return err


# ---- routes and answers ---------------------------------------------------------------------------

def test_models_lists_the_served_model(client):
    res = client.get("/v1/models")
    assert res.status_code == 200 and [m["id"] for m in res.json()["data"]] == ["scripted"]


def test_chat_answer_is_openais_shape(client):
    res = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3, "seed": 7})
    body = res.json()
    assert res.status_code == 200 and body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello, wor"}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert body["exactedit"] == {"seed": 7, "rules_fired": {"prefix-penalty": 1}}
    assert client.backend.turns[-1] == [{"role": "user", "content": "hi"}]


def test_chat_content_parts_and_developer_role_reach_the_template(client):
    msgs = [{"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert client.post("/v1/chat/completions", json={**CHAT, "messages": msgs}).status_code == 200
    assert client.backend.turns[-1] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]


def test_completion_stops_before_the_stop_string(client):
    res = client.post("/v1/completions", json={"model": "m", "prompt": "x", "stop": ["'s an"]})
    ch = res.json()["choices"][0]
    assert (ch["text"], ch["finish_reason"]) == ("Hello, world! Here", "stop")
    assert client.backend.calls[-1][2] == ("'s an",)


def test_unknown_route_and_method_are_openai_errors(client):
    _error(client.get("/v1/nothing"), 404, code="not_found")
    _error(client.get("/v1/chat/completions"), 405, code="method_not_allowed")


class Failing(Scripted):
    def run(self, *args, **kw):
        raise RuntimeError("engine on fire at /secret/path")


def test_a_failing_reply_is_a_500_server_error_and_a_stream_error_event_without_details():
    from fastapi.testclient import TestClient

    app = build_app(Failing(), _cfg())
    with TestClient(app, raise_server_exceptions=False) as c:
        err = _error(c.post("/v1/chat/completions", json=CHAT), 500)
        assert err["type"] == "server_error" and "RuntimeError" in err["message"] and "secret" not in err["message"]
        res = c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        frames = [f for f in res.text.split("\n\n") if f]
        last = json.loads(frames[-1][len("data: "):])
        assert last["error"]["type"] == "server_error" and "secret" not in res.text
        assert c.get("/v1/models").status_code == 200                                  # still serving
    app.state.gate.close()


# ---- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, param, code", [
    (b"{not json", None, None),
    (b"[1, 2]", None, None),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', None, None),
    (b"[" * 2000 + b"]" * 2000, None, None),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content", None),
    (b'{"messages": []}', "messages", None),
    (b'{"messages": [{"role": "wizard", "content": "hi"}]}', "messages[0].role", None),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}',
     "messages[0].content", None),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', "temperature", None),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 2.5}', "temperature", None),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2.0}', "max_tokens", None),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "stream", None),
    (b'{"messages": [{"role": "user", "content": "hi"}], "seed": -1}', "seed", None),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}', "stop", None),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stop": ""}', "stop", None),
    (b'{"messages": [{"role": "user", "content": "hi"}], "top_p": 0.9}', "top_p", "unsupported_parameter"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', "n", "unsupported_parameter"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "logprobs": true}', "logprobs", "unsupported_parameter"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}', "tools",
     "unsupported_parameter"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}', "max_tokens", "max_tokens_exceeded"),
    (b'{"messages": [{"role": "user", "content": "' + b"x" * 70 + b'"}]}', "messages", "context_length_exceeded"),
    (b'{"messages": [{"role": "user", "content": "' + b"x" * 60 + b'"}], "max_tokens": 8}', "max_tokens",
     "context_length_exceeded"),
])
def test_bad_chat_requests_are_refused_before_the_engine(client, body, param, code):
    err = _error(client.post("/v1/chat/completions", content=body), 400, param, code)
    assert err["type"] == "invalid_request_error"
    assert client.backend.calls == []


def test_neutral_values_of_unsupported_fields_and_unknown_fields_are_accepted(client):
    res = client.post("/v1/chat/completions", json={**CHAT, "top_p": 1, "n": 1, "presence_penalty": 0.0,
                                                    "logit_bias": {}, "user": "u", "min_p": 0.1})
    assert res.status_code == 200, res.text


def test_bad_completion_prompts_are_refused(client):
    _error(client.post("/v1/completions", json={"prompt": ["a", "b"]}), 400, "prompt")
    _error(client.post("/v1/completions", json={"prompt": [1, 2]}), 400, "prompt")
    _error(client.post("/v1/completions", json={}), 400, "prompt")
    _error(client.post("/v1/completions", json={"prompt": "x", "echo": True}), 400, "echo", "unsupported_parameter")


def test_a_body_over_the_cap_is_refused_declared_or_chunked(client):
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    _error(client.post("/v1/chat/completions", content=big), 413, code="request_too_large")
    chunked = (big[i:i + 1000] for i in range(0, len(big), 1000))       # no Content-Length: counted as read
    _error(client.post("/v1/chat/completions", content=chunked), 413, code="request_too_large")
    assert client.backend.calls == []
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200     # still serving


# ---- sampling ------------------------------------------------------------------------------------

def _sampling(**fields) -> Sampling:
    req = parse(json.dumps({**CHAT, **fields}).encode(), ChatRequest)
    return sampling_of(req, cap=100, prompt_tokens=10, n_ctx=64, n_vocab=1000)


def test_temperature_zero_is_greedy_top_k_one():
    s = _sampling(temperature=0, top_k=50, seed=3)
    assert (s.top_k, s.temperature, s.seed) == (1, 1.0, 3)


def test_sampling_defaults_top_k_zero_and_max_tokens_room():
    s = _sampling(seed=5)
    assert (s.temperature, s.top_k, s.max_new) == (Sampling().temperature, Sampling().top_k, 54)  # the room left
    assert _sampling(top_k=0).top_k == _sampling(top_k=10**30).top_k == 1000
    assert _sampling(temperature=0.5).temperature == 0.5
    assert _sampling(max_completion_tokens=4, max_tokens=9).max_new == 4
    seeds = {_sampling().seed for _ in range(8)}
    assert len(seeds) > 1 and all(0 <= x < SEED_LIMIT for x in seeds)


def test_the_max_tokens_cap_is_the_default_when_the_context_has_room():
    req = parse(json.dumps(CHAT).encode(), ChatRequest)
    assert sampling_of(req, cap=20, prompt_tokens=10, n_ctx=2048, n_vocab=9).max_new == 20


def test_completion_request_parses_a_one_prompt_list():
    assert parse(b'{"prompt": ["one"]}', CompletionRequest).text == "one"


# ---- streaming -----------------------------------------------------------------------------------

def _events(res) -> list:
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in res.text.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames) and frames[-1] == "data: [DONE]"
    return [json.loads(f[len("data: "):]) for f in frames[:-1]]


def test_chat_stream_is_sse_role_first_then_text_then_finish_and_usage(client):
    res = client.post("/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 5, "stop": "!",
                                                    "stream_options": {"include_usage": True}})
    ev = _events(res)
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in ev if e["choices"])
    assert text == "Hello, world"
    assert ev[-2]["choices"][0]["finish_reason"] == "stop" and ev[-2]["exactedit"]["rules_fired"]
    assert ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] == 5
    assert {e["id"] for e in ev} == {ev[0]["id"]} and all(e["object"] == "chat.completion.chunk" for e in ev)


def test_completion_stream_joins_to_the_non_streamed_text(client):
    body = {"prompt": "x", "max_tokens": 8, "stop": ["an", "ld!"]}
    full = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    ev = _events(client.post("/v1/completions", json={**body, "stream": True}))
    assert "".join(e["choices"][0]["text"] for e in ev) == full == "Hello, wor"
    assert ev[-1]["choices"][0]["finish_reason"] == "stop"


# ---- one engine: the queue -------------------------------------------------------------------------

def test_gate_admits_one_running_and_the_waiting_then_refuses():
    gate, go = Gate(waiting=1), threading.Event()
    first, second = gate.submit(go.wait, 5), gate.submit(lambda: "second")
    with pytest.raises(ApiError) as exc:
        gate.submit(lambda: "third")
    assert exc.value.status == 503 and exc.value.code == "server_busy"
    go.set()
    assert first.result(5) and second.result(5) == "second"
    assert gate.submit(lambda: "again").result(5) == "again"          # admitted again once they finished
    gate.close()


def test_a_full_queue_is_answered_503_and_the_server_still_serves():
    import httpx2 as httpx

    hold = threading.Event()
    backend = Scripted(hold=hold)
    cfg = _cfg(max_waiting=0)
    app = build_app(backend, cfg)
    with running(app, cfg) as url:
        results = {}
        t = threading.Thread(target=lambda: results.setdefault("first", httpx.post(
            f"{url}/v1/chat/completions", json=CHAT, timeout=20)))
        t.start()
        deadline = time.monotonic() + 10
        while not backend.calls and time.monotonic() < deadline:    # the first one is in the engine
            time.sleep(0.01)
        busy = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=20)
        err = _error(busy, 503, code="server_busy")
        assert err["type"] == "server_error" and busy.headers["retry-after"] == "1"
        hold.set()
        t.join(20)
        assert results["first"].status_code == 200
        assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=20).status_code == 200


def test_a_stream_whose_client_leaves_stops_its_reply():
    import httpx2 as httpx

    backend = Scripted(pace=0.2)
    cfg = _cfg()
    app = build_app(backend, cfg)
    with running(app, cfg) as url:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=20) as res:
            next(res.iter_lines())                                       # the role chunk: then the client leaves
        deadline = time.monotonic() + 10
        while backend.cancelled_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
    assert backend.cancelled_at is not None and backend.cancelled_at < len(WORDS[:8])


# ---- settings --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, field", [({"max_tokens": 0}, "max_tokens"), ({"max_waiting": -1}, "max_waiting"),
                                       ({"port": 70000}, "port"), ({"max_tokens": 2048}, "max_tokens"),
                                       ({"max_body_bytes": 10}, "max_body_bytes"), ({"model_id": " "}, "model_id")])
def test_serve_config_refuses_settings_out_of_range(kw, field):
    with pytest.raises(ServeError, match=f": {field}: "):
        ServeConfig(model="m.gguf", **kw)


def test_serve_config_names_the_served_model_by_its_file():
    assert ServeConfig(model="/x/smol.gguf").served_id == "smol"
    assert ServeConfig(model="/x/smol.gguf", model_id="mine").served_id == "mine"


def test_serve_command_refuses_rules_with_a_chat_template_before_loading(tmp_path):
    from exactedit.cli import main

    for name in ("m.gguf", "r.json", "t.jinja"):
        (tmp_path / name).write_text("x")
    res = CliRunner().invoke(main, ["serve", "--model", str(tmp_path / "m.gguf"), "--rules", str(tmp_path / "r.json"),
                                    "--chat-template", str(tmp_path / "t.jinja")])
    assert res.exit_code == 1 and "compiled rules render with the template they were compiled with" in res.output
