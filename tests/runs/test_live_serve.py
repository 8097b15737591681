"""`exactedit serve` live on SmolLM2-135M-Instruct (issue 39, item 1), through the official `openai`
client against the server on a thread of this process: a greedy reply with the rules is token
for token `exactedit generate --rules`'s (the same library call the command makes), streamed or
not; the banned phrase the base model writes for a prompt is never streamed with the rules;
/v1/completions with a stop string, streamed or not; a malformed and an oversized request are
answered with OpenAI's error object and the server keeps serving. About 200 generated tokens."""
from __future__ import annotations

import json

import pytest

from tests import oracles

pytestmark = pytest.mark.live

PROMPT = "How do I read a CSV file in Python?"
BANNED = ["Here's a simple example", "you can use"]     # both in SmolLM2's greedy reply to PROMPT
MAX = 24


@pytest.fixture(scope="module")
def smollm():
    return oracles.live_model("smollm")


@pytest.fixture(scope="module")
def rules(smollm, tmp_path_factory):
    from exactedit.native.shaping import compile_file

    out = tmp_path_factory.mktemp("serve") / "rules.json"
    compile_file(None, smollm, out, phrases=BANNED, bias=50.0)
    return out


@pytest.fixture(scope="module")
def server(smollm, rules):
    pytest.importorskip("fastapi")
    from exactedit.runs.serve import Backend, ServeConfig, build_app, running

    cfg = ServeConfig(model=str(smollm), rules=str(rules), max_tokens=64, max_body_bytes=64 << 10)
    with Backend(cfg) as backend:
        app = build_app(backend, cfg)
        with running(app, cfg) as url:
            yield url


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


def _generate(smollm, rules=None):
    """What `exactedit generate --top-k 1 --max-new MAX [--rules R]` computes."""
    from exactedit.native.llamacpp import Sampling
    from exactedit.native.shaping import generate_text

    return generate_text(smollm, PROMPT, Sampling(max_new=MAX, temperature=1.0, top_k=1), rules)


@pytest.fixture(scope="module")
def generated(smollm, rules):
    return _generate(smollm), _generate(smollm, rules)


def _chat(client, **kw):
    return client.chat.completions.create(model="smollm", messages=[{"role": "user", "content": PROMPT}],
                                          max_tokens=MAX, temperature=0, **kw)


def test_models_lists_the_gguf(client):
    assert [m.id for m in client.models.list()] == ["smollm2-135m-instruct-q4_1"]


def test_greedy_chat_with_rules_is_generates_reply_token_for_token(client, generated):
    base, shaped = generated
    assert any(n in base.text for n in BANNED) and shaped.fired["prefix-penalty"]   # the rules change this reply
    r = _chat(client, seed=11)
    assert r.choices[0].message.content == shaped.text
    assert r.usage.completion_tokens == shaped.tokens and r.usage.prompt_tokens > 0
    assert r.choices[0].finish_reason == ("length" if shaped.truncated else "stop")
    assert r.exactedit["rules_fired"]["prefix-penalty"] == len(shaped.fired["prefix-penalty"])


def test_streamed_chat_is_the_same_reply_and_never_sends_a_banned_phrase(client, generated):
    _, shaped = generated
    chunks = list(_chat(client, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == shaped.text and chunks[-1].usage.completion_tokens == shaped.tokens
    assert not any(n.lower() in text.lower() for n in BANNED)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 5    # streamed, not one piece


def test_sampled_streams_never_send_a_banned_phrase(client):
    for seed in range(3):
        stream = client.chat.completions.create(model="smollm", messages=[{"role": "user", "content": PROMPT}],
                                                max_tokens=MAX, temperature=0.8, seed=seed, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text and not any(n.lower() in text.lower() for n in BANNED), text


def test_completion_stops_at_the_stop_string_streamed_or_not(client):
    r = client.completions.create(model="smollm", prompt="The capital of France is", max_tokens=12, temperature=0,
                                  stop=["."])
    assert (r.choices[0].text, r.choices[0].finish_reason) == (" Paris", "stop")
    stream = client.completions.create(model="smollm", prompt="The capital of France is", max_tokens=12,
                                       temperature=0, stop=["."], stream=True)
    assert "".join(c.choices[0].text for c in stream) == " Paris"


def test_malformed_and_oversized_requests_get_errors_and_the_server_keeps_serving(client, server):
    import openai
    import httpx2 as httpx

    res = httpx.post(f"{server}/v1/chat/completions", content=b'{"messages": [', timeout=30,
                     headers={"content-type": "application/json"})
    assert res.status_code == 400 and res.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(model="smollm", messages=[{"role": "user", "content": "x" * (65 << 10)}])
    assert exc.value.status_code == 413 and exc.value.body["code"] == "request_too_large"
    with pytest.raises(openai.BadRequestError) as exc:
        _chat(client, top_p=0.5)
    assert exc.value.body["param"] == "top_p"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="smollm", messages=[{"role": "user", "content": "hi"}], max_tokens=65)
    assert exc.value.body["code"] == "max_tokens_exceeded"
    r = _chat(client)
    assert r.choices[0].message.content and json.loads(r.model_dump_json())["usage"]["completion_tokens"] == MAX
