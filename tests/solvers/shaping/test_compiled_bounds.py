"""Compiled rules at scale and exactly as the format says (issue 38, items 9 and 10): 20,000
phrases written and read back in seconds (each phrase's prefixes were gathered by a scan over
every form: O(n^2), 45 s at 2 * 10^4, minutes at 10^5), a key the format does not have refused wherever it sits,
a phrase with a control character refused in a rules file and in a listed penalty."""
from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import time

import pytest

from exactedit.quant import gguf
from exactedit.solvers.shaping import rules as shaping
from exactedit.solvers.shaping.compiled import ShapingRulesError, read_compiled, write_compiled
from exactedit.solvers.shaping.rules_file import listed_penalty, load_rules, phrase_pieces
from tests.shaping_world import ID, RULES, TEXTS, compiled, tokenize, write_model


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cb")
    rules = compiled(root)
    return root, rules, rules.to_dict()


def test_20000_phrases_are_written_and_read_back_in_linear_time(world, tmp_path):
    _, rules, _ = world
    prefixes = ["".join(p) for p in itertools.product("xencuyot", repeat=5)][:20_000]
    phrases = tuple(f"{p} use" for p in prefixes)
    text_bytes = [t.encode() for t in TEXTS]
    t0 = time.perf_counter()
    big = shaping.PhrasePenalty(6.0, tuple(shaping.TextPhrase(p, ID[" use"]) for p in phrases),
                                phrase_pieces(phrases, text_bytes))
    write_compiled(dataclasses.replace(rules, rules=(big,)), tmp_path / "big.json")
    back = read_compiled(tmp_path / "big.json")
    assert [p.text for p in back.rules[0].phrases] == list(phrases)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("where, field", [
    ((), "extra"), (("model",), "model.extra"), (("rules_file",), "rules_file.extra"), (("chat",), "chat.extra"),
    (("markup",), "markup.extra"), (("classes",), "classes.extra"), (("rules", 0), "rules[0].extra"),
    (("rules", 1), "rules[1].extra"), (("rules", 2), "rules[2].extra"),
])
def test_an_unknown_key_is_refused_wherever_it_sits(world, tmp_path, where, field):
    """An unknown key ran live: this reader ignored it while another engine might act on it."""
    d = copy.deepcopy(world[2])
    obj = d
    for k in where:
        obj = obj[k]
    obj["extra"] = 1
    (tmp_path / "x.json").write_text(json.dumps(d))
    with pytest.raises(ShapingRulesError) as err:
        read_compiled(tmp_path / "x.json")
    assert err.value.field == field and "unknown key" in err.value.message


def test_the_format_as_written_has_no_unknown_key(world, tmp_path):
    """Every key `to_dict` writes is one the reader knows (with and without a chat template of its own)."""
    root, rules, d = world
    write_compiled(rules, tmp_path / "r.json")
    assert read_compiled(tmp_path / "r.json").to_dict() == d


@pytest.mark.parametrize("char", ["\x00", "\x1b", "\x7f"])
def test_a_control_character_in_a_rules_file_phrase_is_refused(tmp_path, char):
    f = tmp_path / "r.toml"
    f.write_text(RULES.replace('"end to end"', f'"end to\\u{ord(char):04x} end"'))    # TOML's own escape
    with pytest.raises(ShapingRulesError, match=r"r\.toml: prefix-penalty\.phrases\[1\]: .* holds a control"):
        load_rules(f)


def test_a_control_character_in_a_listed_penalty_is_refused(tmp_path):
    model = write_model(tmp_path / "m.gguf")
    with gguf.open(model) as g:
        with pytest.raises(ShapingRulesError, match=r"--phrases: phrases\[1\]: .* holds a control character"):
            listed_penalty(["you can use", "end\x1b to end"], 6.0, g, tokenize)
        rule, skipped = listed_penalty(["you can use", "you  can use"], 6.0, g, tokenize)
        assert rule.phrases == ("you can use",) and not skipped
