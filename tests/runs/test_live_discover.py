"""`exactedit discover --model`, live on Qwen2.5-Coder-1.5B: a discovered phrase in the model's own
tokenizer, and its ban point measured by the model. "Here's an example" is the measured case the
rule comes from: after "Here's an" the model gives " example" with p near 1, so the ban moves one
word earlier ("Here's an": " an" after "Here's"), while "you can use" keeps its own last word."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests import oracles

pytestmark = pytest.mark.live

PROMPT = "How do I read a CSV file in Python?"
REPLY = ("To read a CSV file in Python, you can use the built-in `csv` module. Here's an example of how to "
         "read a file line by line. You can use pandas too if you need more. Here's an example with pandas.")


@pytest.fixture(scope="module")
def qwen():
    return oracles.live_model("qwen")   # missing extra: a skip, or a failure in CI (tests/oracles.py)


def test_annotate_measures_the_ban_point(qwen):
    from exactedit.runs.data.discover import Source, annotate

    got = annotate(qwen, [{"phrase": "Here's an example:"}, {"phrase": "you can use"}, {"phrase": "delve"},
                          {"phrase": "a file unfindablewordxyz"}], [Source(REPLY, PROMPT), Source(REPLY)])
    ex, use, one, odd = got
    assert ex["tokens"] == [" Here", "'s", " an", " example", ":"] and ex["final_one_token"]
    assert ex["contexts"] == 4 and ex["final_p"] >= 0.9          # 2 occurrences x 2 sources
    assert ex["ban_phrase"] == "Here's an" and "one word earlier" in ex["ban_note"]
    assert use["tokens"] == [" you", " can", " use"] and use["final_one_token"]
    assert use["contexts"] == 4 and use["final_p"] < 0.9 and use["ban_phrase"] == "you can use"
    you = annotate(qwen, [{"phrase": "you can"}], [Source(REPLY, PROMPT)])[0]   # "you can", "You can", "if you need"
    assert you["contexts"] == 3 and you["ban_phrase"] == "you can"
    assert one["ban_phrase"] is None and "needs a prefix" in one["ban_note"]
    # p(last word | prefix) is measured where the prefix was written ("a file" in both sources),
    # whatever followed: the word never did, and is several tokens
    assert odd["contexts"] == 2 and odd["final_p"] < 1e-3 and not odd["final_one_token"]
    assert "tokens: no one-token ban" in odd["ban_note"] and odd["ban_phrase"] == "a file unfindablewordxyz"


def test_discover_cli_with_model_writes_ban_points_the_phrase_lists_take(qwen, tmp_path):
    from exactedit import cli
    from exactedit.runs.loop.inputs import BUNDLED
    from exactedit.solvers import load_phrases

    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps([{"side": "base", "prompt": PROMPT, "text": REPLY.replace("pandas", f"tool {k}")}
                                   for k in range(6)]))
    human = BUNDLED / "qwen" / "texts"           # the bundled plain texts, about 2,200 words
    out = tmp_path / "found.json"
    r = CliRunner().invoke(cli.main, ["discover", "--model-text", str(replies), "--human", str(human), "--out",
                                      str(out), "--model", str(qwen), "--top", "30", "--contexts", "2"])
    assert r.exit_code == 0, r.output
    found = json.loads(out.read_text())
    by = {p["phrase"].lower(): p for p in found["phrases"]}
    assert "here's an example" in by, sorted(by)
    assert by["here's an example"]["ban_phrase"] == "Here's an"
    assert all("tokens" in p and "final_one_token" in p for p in found["phrases"])
    assert "Here's an" in load_phrases(out)
