"""Protocol files: parsing, validation errors that name the field, token resolution, stopping rule."""
from __future__ import annotations

import hashlib

import pytest

from exactedit.evals.protocol.protocol import ProtocolError, StoppingRule, load_protocol, resolve_tokens
from tests.evals.conftest import PROTOCOL


def test_load_reads_every_section(protocol_file):
    p = load_protocol(protocol_file)
    assert p.name == "unit"
    assert p.sha256 == hashlib.sha256(protocol_file.read_bytes()).hexdigest()
    assert [t.role for t in p.traces] == ["pool", "anchors", "blind"]
    assert p.trace("chat").path == protocol_file.parent / "dumps/chat"
    assert p.split.seed == 7 and p.split.by == ("source", "character")
    assert p.bars.bootstrap == 50 and p.bars.chat_max_kld == 0.005  # default kept
    assert p.tokens.phrases == ((" end", " to", " end"), (" rather", " than"))
    assert p.word_list() == (" end", " than")  # defaults to each phrase's final token


@pytest.mark.parametrize("edit, field", [
    (("name = \"unit\"", "name = 3"), "name"),
    (("role = \"pool\"", "role = \"holdout\""), "traces[0].role"),
    (("seed = 7", "seed = \"7\""), "split.seed"),
    (("train = 0.5", "train = 0.9"), "split"),
    (("every = 5", "every = 0"), "stopping"),
    (("bootstrap = 50", "bootstrap = 50\nbogus = 1"), "bars"),
    (("phrases = [[", "phrases = [[\" end\"], ["), "tokens"),
    (("[split]", "[splitt]"), "file"),
    (("style = [\" owo\"]", "style = [true]"), "tokens.style[0]"),
])
def test_bad_fields_are_named(tmp_path, edit, field):
    path = tmp_path / "p.toml"
    path.write_text(PROTOCOL.replace(*edit), encoding="utf-8")
    with pytest.raises(ProtocolError) as err:
        load_protocol(path)
    assert err.value.field == field and str(path) in str(err.value)


def test_not_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"name = [\n")
    with pytest.raises(ProtocolError, match="toml"):
        load_protocol(bad)
    with pytest.raises(ProtocolError, match="cannot read"):
        load_protocol(tmp_path / "absent.toml")


def test_resolve_tokens(protocol_file):
    p = load_protocol(protocol_file)
    vocab = ["a", " end", " to", " rather", " than", " owo", "<|im_end|>", "<think>"]
    r = resolve_tokens(p, vocab)
    assert r.phrases == ((1, 2, 1), (3, 4)) and r.style == (5,)
    assert r.specials == (6, 7) and r.turn_end == 6 and r.collateral_words == (1, 4)
    with pytest.raises(ProtocolError, match="' owo' is not in"):
        resolve_tokens(p, [t for t in vocab if t != " owo"])
    with pytest.raises(ProtocolError, match="ambiguous"):
        resolve_tokens(p, vocab + [" owo"])


def test_stopping_rule_keeps_last_qualifying_step():
    rule = StoppingRule(every=5, max_steps=30, min_ratio=0.75, min_dev_gain=0.0)
    steps = [5, 10, 15, 20, 25, 30, 35]
    train = [0.10, 0.20, 0.30, 0.40, 0.50, 0.60, 0.70]
    dev = [0.09, 0.16, 0.24, 0.25, 0.20, 0.10, 0.60]  # ratios .9 .8 .8 .625 .4 .17; 35 is past max
    assert rule.choose(steps, train, dev) == 15
    assert rule.choose(steps, train, [-x for x in dev]) is None  # no dev gain: ship no edit
