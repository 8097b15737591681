"""`exactedit serve --rules-mode rewind` live on SmolLM2-135M-Instruct, through the official `openai`
client: the rules of tests/native/shaping/test_live_rewind.py ("you can use" at 1 nat, which the
penalty lets through, and "Here’s a simple example" with a curly apostrophe, whose straight variant
SmolLM2 writes); a greedy stream is token for token `exactedit generate --rules-mode rewind`'s reply,
and neither a stream nor a reply ever holds either phrase or a variant of it. About 110 tokens."""
from __future__ import annotations

import pytest

from tests import oracles

pytestmark = pytest.mark.live

PROMPT = "How do I read a CSV file in Python?"
PHRASES = ["you can use", "Here\u2019s a simple example"]
MAX = 28


@pytest.fixture(scope="module")
def smollm():
    return oracles.live_model("smollm")


@pytest.fixture(scope="module")
def rules(smollm, tmp_path_factory):
    from exactedit.native.shaping import compile_file

    out = tmp_path_factory.mktemp("serve-rewind") / "rules.json"
    compile_file(None, smollm, out, phrases=PHRASES, bias=1.0)
    return out


@pytest.fixture(scope="module")
def client(smollm, rules):
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    from exactedit.runs.serve import Backend, ServeConfig, build_app, running

    cfg = ServeConfig(model=str(smollm), rules=str(rules), rules_mode="rewind", max_tokens=64)
    with Backend(cfg) as backend:
        app = build_app(backend, cfg)
        with running(app, cfg) as url:
            yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _caught(text: str) -> list[str]:
    from exactedit.native.llamacpp.rewind import RewindConfig, scan

    return [text[m.start:m.end] for m in scan(text, RewindConfig(tuple(PHRASES)))]


def test_a_rewind_stream_is_generates_reply_and_never_sends_a_phrase(client, smollm, rules):
    from exactedit.native.llamacpp import Sampling
    from exactedit.native.shaping import generate_text

    want = generate_text(smollm, PROMPT, Sampling(max_new=MAX, temperature=1.0, top_k=1), rules, rules_mode="rewind")
    assert want.rewinds["rewinds"] >= 1
    chunks = list(client.chat.completions.create(model="smollm", messages=[{"role": "user", "content": PROMPT}],
                                                 max_tokens=MAX, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    text = "".join(pieces)
    assert text == want.text and chunks[-1].usage.completion_tokens == want.tokens
    assert _caught(text) == [] and len([p for p in pieces if p]) > 3         # streamed, not one piece
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert final.exactedit["rewinds"] == [e["phrase"] for e in want.rewinds["events"] if not e["kept"]]


def test_sampled_rewind_streams_never_send_a_phrase_or_a_variant(client):
    for seed in (1, 2):
        stream = client.chat.completions.create(model="smollm", messages=[{"role": "user", "content": PROMPT}],
                                                max_tokens=MAX, temperature=0.8, seed=seed, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text and _caught(text) == [], text
