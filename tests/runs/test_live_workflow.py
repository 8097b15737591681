"""The real-model workflow on Qwen, kept small (about 160 generated and 120 prompt tokens in all):
`engine dump` labels documents from the CLI (tags, source, character, roles from the model's own
chat template, stable names), `mine` finds every text occurrence of a phrase prefix-exact in
real replies with the shared matcher, counts cut replies, and its phrase rates are the same for
the same seed."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.dumps import ROLE_ANCHOR, ROLE_PROMPT, ROLE_REPLY, ROLE_REPLY_END, ROLE_STEP0, read_dump
from tests import oracles

pytestmark = pytest.mark.live

CONV = [{"role": "user", "content": "Name a river."}, {"role": "assistant", "content": "The Nile."}]
PROMPT = "How do I reverse a list in Python? Answer in one sentence."
PHRASES = "you can use\na list\nthe list\n"   # no phrase inside another: the longest match wins a row


@pytest.fixture(scope="module")
def qwen():
    return oracles.live_model("qwen")


def _run(args):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_engine_dump_labels_from_the_cli(tmp_path, qwen):
    chat = tmp_path / "c.jsonl"
    chat.write_text(json.dumps(CONV) + "\n")
    out = _run(["engine", "dump", "--model", "qwen", "--chat", str(chat), "--tag", "anchor", "--source", "s1",
                "--character", "c1", "--out", str(tmp_path / "d"), "--json"])
    d = read_dump(out["dump"])
    (doc,) = d.docs
    assert (doc.source, doc.character, doc.tags) == ("s1", "c1", ("chat", "anchor"))
    roles = np.asarray(d.roles)
    assert np.all(roles & ROLE_ANCHOR)
    assert np.count_nonzero(roles & ROLE_STEP0) == 1 and np.count_nonzero(roles & ROLE_REPLY_END) == 1
    end = int(np.flatnonzero(roles & ROLE_REPLY_END)[0])
    assert d.field("next")[end] == 151645                                       # <|im_end|> closes the reply
    assert np.all(roles[:int(np.flatnonzero(roles & ROLE_STEP0)[0])] & ROLE_PROMPT)  # system + user turns
    again = _run(["engine", "dump", "--model", "qwen", "--chat", str(chat), "--out", str(tmp_path / "d2"), "--json"])
    assert again["docs"][0]["name"] == doc.name and doc.name.startswith("chat-")  # stable across runs
    text = tmp_path / "t.txt"
    text.write_text("Rivers run to the sea.")
    plain = _run(["engine", "dump", "--model", "qwen", "--text", str(text), "--out", str(tmp_path / "d3"), "--json"])
    p = read_dump(plain["dump"])
    assert p.docs[0].tags == ("plain",) and np.all(np.asarray(p.roles) == ROLE_PROMPT)
    assert p.docs[0].name != doc.name and p.docs[0].source == "t.txt"


@pytest.fixture(scope="module")
def mined(tmp_path_factory, qwen):
    tmp = tmp_path_factory.mktemp("mine")
    (tmp / "p.txt").write_text(PROMPT + "\n")
    (tmp / "s.txt").write_text(PHRASES)
    args = ["mine", "--model", "qwen", "--prompts", str(tmp / "p.txt"), "--phrases", str(tmp / "s.txt"),
            "--max-new", "40", "--samples", "2", "--seed", "7", "--n-boot", "50", "--json"]
    first = _run(args + ["--out", str(tmp / "d"), "--tag", "train", "--png", str(tmp / "rates.png")])
    return first, args, tmp


def test_mine_matches_every_occurrence_of_real_replies(mined):
    out, _, tmp = mined
    rates = {p["phrase"]: p for p in out["phrase_rates"]}
    assert sum(p["base"]["occurrences"] for p in rates.values()) > 0, out["replies"]
    for p in rates.values():  # the shared matcher finds each whole-word occurrence prefix-exact in token space
        assert p["base"]["contexts"] == p["base"]["occurrences"], (p, out["replies"])
    d = read_dump(out["dump"])
    toks, nxt = np.asarray(d.field("tokens")), np.asarray(d.field("next"))
    for c in out["contexts"]:
        assert nxt[c["row"]] == c["rejected"] == toks[c["row"] + 1]
    assert {doc.name for doc in d.docs} <= {r["name"] for r in out["replies"]}
    assert all(set(doc.tags) == {"chat", "slop", "train"} and doc.source == "mine" for doc in d.docs)
    assert len({doc.character for doc in d.docs}) == 1                         # one prompt: one group
    assert (tmp / "rates.png").read_bytes()[:4] == b"\x89PNG"


def test_mine_counts_cut_replies_and_gives_them_no_turn_end(mined):
    out, _, _ = mined
    cut = [r for r in out["replies"] if r["stop"] == "max_new"]
    assert out["truncated"]["base"] == len(cut)
    assert all(r["tokens"] == 40 for r in cut) and all(r["tokens"] <= 40 for r in out["replies"])
    d = read_dump(out["dump"])
    roles = np.asarray(d.roles)
    for doc in d.docs:
        r = next(x for x in out["replies"] if x["name"] == doc.name)
        ends = np.count_nonzero(roles[doc.first_row:doc.stop] & ROLE_REPLY_END)
        assert ends == (1 if r["stop"] == "turn_end" else 0)
        assert roles[doc.stop - 2] & ROLE_REPLY


def test_phrase_rates_from_a_fixed_seed(mined):
    out, args, _ = mined
    again = _run(args)
    assert [r["text"] for r in again["replies"]] == [r["text"] for r in out["replies"]]
    assert again["phrase_rates"] == out["phrase_rates"]
    for p in out["phrase_rates"]:
        b = p["base"]
        assert b["share"] == pytest.approx(b["replies_with"] / b["replies"])
        assert b["per_1k_tokens"] == pytest.approx(1000 * b["occurrences"] / b["tokens"])
        assert b["tokens"] == sum(r["tokens"] for r in out["replies"]) and b["replies"] == 2


def test_dataset_build_labels_and_splits_by_prompt(tmp_path, qwen):
    prompts = ["Name a river.", "Name a lake.", "Name a sea.", "Name a mountain."]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n")
    (tmp_path / "s.txt").write_text("you can use\n")
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("You can use a map. The use of maps is old. A map has many uses.")
    out = _run(["dataset", "build", "--model", "qwen", "--prompts", str(tmp_path / "p.txt"), "--phrases",
                str(tmp_path / "s.txt"), "--texts", str(tmp_path / "texts"), "--out", str(tmp_path / "data"),
                "--samples", "1", "--max-new", "24", "--json"])
    groups = out["prompts"]
    assert sorted(len(v) for v in groups.values()) == [1, 1, 1, 1]     # one prompt per set, none in two
    sets = {s["name"]: s for s in out["sets"]}
    assert set(sets) == {"train", "heldout", "collateral", "anchors"}
    seen = {}
    for name, s in sets.items():
        d = read_dump(s["dump"])
        for doc in d.docs:
            want = {"train": set(), "heldout": set(), "collateral": {"collateral"}, "anchors": {"anchor"}}[name]
            assert want <= set(doc.tags) and ({"chat"} <= set(doc.tags)) != ({"plain"} <= set(doc.tags))
            if "chat" in doc.tags:
                assert seen.setdefault(doc.character, name) == name                # a prompt's replies stay together
                assert doc.name.startswith("chat-") and doc.name.endswith("-s0")
        assert d.roles is not None and (name != "anchors" or np.all(np.asarray(d.roles) & ROLE_ANCHOR))
    assert sets["anchors"]["tags"].get("plain", 0) + sets["collateral"]["tags"].get("plain", 0) == 1
    assert json.loads((tmp_path / "data" / "dataset.json").read_text())["prompts"] == groups
