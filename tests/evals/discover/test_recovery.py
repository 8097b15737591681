"""Planted-phrase recovery with the defaults and little text of the user's (issue 40): 21,000 words of
model replies over eight subjects with "delve into" 40 times, "it's important to note that" 30 times
and "I hope this helps" 26 times, against 1,500 words of the user's prose holding phrases of their
own. In each transcript shape the sources read (OpenAI messages, ShareGPT, Claude Code, replies
JSON), `exactedit discover` with no settings lists every planted phrase in its top 12, as style, on
the language's evidence, and none of the user's phrases; the ban list read back takes them."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.solvers.phrases import load_phrases
from tests.evals.discover.synth import chats, prose

PLANTED = {"delve into": 40, "it's important to note that": 30, "I hope this helps": 26}
USERS = {"as a matter of fact": 6, "by and large": 5, "all things considered": 4}


def _openai(path, pairs):
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p},
                                                     {"role": "assistant", "content": r}]}) + "\n"
                            for p, r in pairs))


def _sharegpt(path, pairs):
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": r}]}
                                for p, r in pairs]))


def _claude_code(path, pairs):
    lines = [{"type": "summary", "summary": "a session"}]
    for p, r in pairs:
        lines += [{"type": "user", "message": {"role": "user", "content": p}},
                  {"type": "assistant", "message": {"model": "claude-x", "role": "assistant",
                                                    "content": [{"type": "text", "text": r}]}}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _replies(path, pairs):
    path.write_text(json.dumps([{"side": "base", "prompt": p, "text": r} for p, r in pairs]))


SHAPES = {"openai.jsonl": _openai, "sharegpt.json": _sharegpt, "session.jsonl": _claude_code,
          "replies.json": _replies}


@pytest.fixture(scope="module", params=[11, 12])
def world(request, tmp_path_factory):
    seed = request.param
    root = tmp_path_factory.mktemp(f"recovery{seed}")
    pairs, planted = chats(seed, 48, 3, 21_000, PLANTED)
    assert planted == PLANTED
    (root / "mine").mkdir()
    for i, t in enumerate(prose(seed + 50, 1_500, USERS)):
        (root / "mine" / f"{i:02d}.md").write_text(t)
    for name, write in SHAPES.items():
        write(root / name, pairs)
    return root


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_planted_phrase_in_the_top_12_and_none_of_the_users(world, shape, tmp_path):
    out = tmp_path / "found.json"
    res = CliRunner().invoke(main, ["discover", "--model-text", str(world / shape), "--human", str(world / "mine"),
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert 19_000 < data["model"]["words"] < 23_000 and 1_300 < data["human"]["words"] < 1_800
    assert data["prompts"] == 48                                  # the replies grouped by the prompt they answer
    top = {p["phrase"].lower(): p for p in data["phrases"][:12]}
    for phrase in PLANTED:
        p = top.get(phrase.lower())
        assert p is not None, (phrase, list(top))
        assert p["kind"] == "style" and p["evidence"] in ("language", "both") and p["lang_ratio_low"] >= 5
        assert p["model_count"] == PLANTED[phrase] and p["human_count"] == 0
        assert p["z"] < 3                                         # the user's text alone would not list it
    user_words = {w for phrase in USERS for w in phrase.split()}
    for p in data["phrases"]:
        words = set(p["phrase"].lower().split())
        assert not (p["n"] > 1 and words <= user_words), p["phrase"]    # nothing only the user wrote
    assert not [p for p in data["phrases"] if any(u in p["phrase"].lower() for u in USERS)]
    bans = load_phrases(out, 12)
    assert {"delve into", "it's important to note that", "I hope this helps"} <= set(bans)
    rows = [line for line in res.output.splitlines() if "'delve into'" in line or "TOPIC" in line]
    assert any("style" in r and "language" in r for r in rows) and any("TOPIC" in r for r in rows)
