"""Protocol files: parsing, validation errors that name the field, token resolution, stopping rule."""
from __future__ import annotations

import hashlib

import pytest

from exactedit.evals.protocol.protocol import ProtocolError, StoppingRule, load_protocol, resolve_tokens
from tests.evals.conftest import PROTOCOL
from tests.special_files import WHY, special


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
    (("bootstrap = 50", "bootstrap = 50\npersona_decision = \"start\""), "bars"),
    (("every = 5", "every = 5\nmax_dev_kl_off = 0.0"), "stopping"),
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


def test_stopping_rule_watching_the_dev_kl_off_the_decision_stops_at_the_first_step_above_it():
    rule = StoppingRule(every=5, max_steps=30, min_ratio=0.75, max_dev_kl_off=0.005)
    steps, train, dev = [5, 10, 15, 20, 25], [0.1, 0.2, 0.3, 0.4, 0.5], [0.1, 0.2, 0.3, 0.4, 0.5]
    assert rule.choose(steps, train, dev, dev_kl_off=[0.001, 0.004, 0.005, 0.006, 0.001]) == 15
    assert rule.choose(steps, train, dev, dev_kl_off=[0.001, float("nan"), 0.0, 0.0, 0.0]) == 5   # nothing seen: stop
    assert rule.choose(steps, train, dev, dev_kl_off=[0.01] * 5) is None
    with pytest.raises(ValueError, match="needs the dev KL"):
        rule.choose(steps, train, dev)
    unwatched = StoppingRule(every=5, max_steps=30, min_ratio=0.75)
    assert not unwatched.watches_kl and unwatched.choose(steps, train, dev, dev_kl_off=[1.0] * 5) == 25


def test_persona_decision_rows_and_the_kl_watch_round_trip(tmp_path):
    from exactedit.evals.protocol.protocol import Bars, Trace, write_protocol

    out = write_protocol(tmp_path / "p.toml", "persona", [Trace("train", tmp_path, "train")],
                         stopping=StoppingRule(max_dev_kl_off=0.005), bars=Bars(persona_decision="step0"))
    back = load_protocol(tmp_path / "p.toml")
    assert back == out and back.bars.persona_decision == "step0" and back.bars.persona_max_kl_off == 0.005
    assert back.stopping.max_dev_kl_off == 0.005 and back.stopping.watches_kl
    default = write_protocol(tmp_path / "d.toml", "plain", [Trace("train", tmp_path, "train")], stopping=StoppingRule())
    assert not load_protocol(default.path).stopping.watches_kl      # inf, written and read as TOML's inf


def test_write_protocol_round_trips_every_section(protocol_file, tmp_path):
    """A protocol written by `write_protocol` reads back as the Protocol it was written from
    (every section written whole), and its sha256 is of the bytes on disk."""
    from dataclasses import replace

    from exactedit.evals.protocol.protocol import write_protocol

    p = load_protocol(protocol_file)
    out = write_protocol(tmp_path / "w.toml", p.name, p.traces, description=p.description, split=p.split,
                         stopping=p.stopping, bars=p.bars, edit_set=p.edit_set, tokens=p.tokens)
    back = load_protocol(tmp_path / "w.toml")
    assert out == back and out.sha256 == hashlib.sha256((tmp_path / "w.toml").read_bytes()).hexdigest()
    assert replace(back, path=p.path, sha256=p.sha256) == p
    assert not list(tmp_path.glob("*.tmp"))


def test_write_protocol_escapes_what_it_writes(tmp_path):
    """Quotes, backslashes, newlines and non-ASCII in names, paths and tokens survive the round
    trip (string concatenation would have written broken TOML or another protocol)."""
    from exactedit.evals.protocol.protocol import TokenSets, Trace, write_protocol

    odd = 'a "quoted" \\ back\\slash\nnew line, tab\t, é ✨'
    traces = (Trace(odd, tmp_path / 'dir "x"\\y' / "train", "train"),
              Trace("anchors", tmp_path / "anchors", "anchors", domain=odd))
    tokens = TokenSets(specials=("<|im_end|>", 7), turn_end="<|im_end|>", style=(odd, ' "'),
                       phrases=((" \"end", "\\to", 5), (1, 2)))
    p = write_protocol(tmp_path / "p.toml", odd, traces, description=odd, tokens=tokens)
    back = load_protocol(tmp_path / "p.toml")
    assert back == p and back.name == odd and back.description == odd
    assert back.traces == traces and back.tokens == tokens


def test_write_protocol_validates_before_writing(tmp_path):
    from exactedit.evals.protocol.protocol import Trace, write_protocol

    t = Trace("x", tmp_path / "x", "train")
    with pytest.raises(ProtocolError, match="unique"):
        write_protocol(tmp_path / "p.toml", "dup", (t, t))
    with pytest.raises(ProtocolError, match="name"):
        write_protocol(tmp_path / "p.toml", " ", (t,))
    assert not list(tmp_path.iterdir())                     # nothing written, not even a *.tmp


# ---- the file is untrusted input (issue 38): read bounded, special files refused by name ---------

@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_load_refuses_special_files_by_name(tmp_path, kind):
    """--protocol: a FIFO was waited on for ever (here the watchdog's empty write end gave "name:
    missing"), /dev/zero read until memory ran out; now refused before a byte is read."""
    bad = special(tmp_path / "p.toml", kind)
    with pytest.raises(ProtocolError) as err:
        load_protocol(bad)
    assert err.value.field == "file" and str(err.value).startswith(f"{bad}: file: {WHY[kind]}")


def test_load_is_capped_before_reading(tmp_path):
    from exactedit.evals.protocol.protocol import MAX_PROTOCOL_BYTES

    big = tmp_path / "big.toml"
    with open(big, "wb") as fh:
        fh.truncate(MAX_PROTOCOL_BYTES + 1)                    # sparse
    with pytest.raises(ProtocolError, match=rf"big\.toml: file: {MAX_PROTOCOL_BYTES + 1} bytes, over the limit"):
        load_protocol(big)


@pytest.mark.parametrize("nest", ["[" * 100_000 + "]" * 100_000, "{a = " * 100_000 + "}" * 100_000])
def test_deeply_nested_toml_is_a_protocol_error(tmp_path, nest):
    """tomllib recursed into a RecursionError (a traceback, not the file's name)."""
    deep = tmp_path / "deep.toml"
    deep.write_text(PROTOCOL + "\n[edit_set]\ntokens = " + nest + "\n", encoding="utf-8")
    with pytest.raises(ProtocolError, match=r"deep\.toml: toml: not valid TOML \(nested too deeply\)"):
        load_protocol(deep)


def test_write_protocol_refuses_what_no_reader_would_take(tmp_path, monkeypatch):
    from exactedit.evals.protocol import protocol as module
    from exactedit.evals.protocol.protocol import Trace, write_protocol

    monkeypatch.setattr(module, "MAX_PROTOCOL_BYTES", 64)
    with pytest.raises(ProtocolError, match="over the limit of 64"):
        write_protocol(tmp_path / "p.toml", "a name", (Trace("x", tmp_path / "x", "train"),))
    assert not list(tmp_path.iterdir())
