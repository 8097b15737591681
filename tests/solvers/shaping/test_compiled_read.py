"""Compiled rules read back: bounded before anything is allocated (file size, nesting,
vocabulary), and checked against the model's token table (a swapped final id, forged piece
bytes, other markup are refused); mutated files end in our own error."""
from __future__ import annotations

import copy
import json
import os

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from exactedit.quant import gguf
from exactedit.errors import ExacteditError
from exactedit.solvers.shaping import compiled as compiled_mod
from exactedit.solvers.shaping.compiled import ShapingRulesError, read_compiled, write_compiled
from exactedit.solvers.shaping.rules_file import check_compiled
from tests.shaping_world import ID, TEXTS, compiled


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cr")
    rules = compiled(root)
    write_compiled(rules, root / "rules.json")
    return root, rules, rules.to_dict()


def _read(tmp_path, d, name="x.json", vocab=None):
    f = tmp_path / name
    f.write_text(d if isinstance(d, str) else json.dumps(d))
    return read_compiled(f, vocab=vocab)


@pytest.mark.parametrize("vocab", [10 ** 12, 3 * 10 ** 9, 0, -5])
def test_vocab_is_bounded_before_it_allocates(world, tmp_path, vocab):
    _, _, d = world
    d = copy.deepcopy(d)
    d["model"]["vocab"] = vocab
    with pytest.raises(ShapingRulesError) as err:
        _read(tmp_path, d)
    assert err.value.field == "model.vocab"


def test_vocab_against_the_model(world, tmp_path):
    _, _, d = world
    assert _read(tmp_path, d, vocab=len(TEXTS)).vocab.size == len(TEXTS)
    with pytest.raises(ShapingRulesError, match=f"the model has {len(TEXTS) + 1} tokens"):
        _read(tmp_path, d, vocab=len(TEXTS) + 1)


def test_deep_nesting_is_our_error(world, tmp_path):
    for text in ("[" * 100_000 + "]" * 100_000, json.dumps({**world[2], "x": [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]})):
        with pytest.raises(ShapingRulesError) as err:
            _read(tmp_path, text)
        assert err.value.field == "json"


def test_size_cap_and_fifo(world, tmp_path, monkeypatch):
    monkeypatch.setattr(compiled_mod, "MAX_BYTES", 100)
    with pytest.raises(ShapingRulesError, match="at most 100"):
        read_compiled(world[0] / "rules.json")
    monkeypatch.undo()
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(ShapingRulesError, match="not a regular file"):
        read_compiled(fifo)


@pytest.mark.parametrize("edit,field", [
    (lambda d: d["markup"].update(turn_start=[]), "markup.turn_start"),
    (lambda d: d["markup"].update(role=[]), "markup.role"),
    (lambda d: d["markup"].update(names=[1, 2]), "markup.names"),
    (lambda d: d["markup"].update(names={"99999": "x"}), "markup.names"),
    (lambda d: d.update(chat="gguf"), "chat"),
    (lambda d: d["chat"].update(turn_start=5), "chat.turn_start"),
    (lambda d: d.update(rules_file=[1]), "rules_file"),
    (lambda d: d["classes"].update(fences=[[3, True]]), "classes.fences[0]"),
])
def test_malformed_parts_name_the_field(world, tmp_path, edit, field):
    d = copy.deepcopy(world[2])
    edit(d)
    with pytest.raises(ShapingRulesError) as err:
        _read(tmp_path, d)
    assert err.value.field == field


def _forge_piece(d):
    """Other bytes for one piece, merge_ok recomputed as a forger would: consistent in itself."""
    from exactedit.solvers.shaping.rules import PhrasePenalty

    rule = compiled_mod.CompiledRules.from_dict(d).rules[0]
    first = min(rule.pieces)
    d["rules"][0] = compiled_mod._penalty_dict(PhrasePenalty(rule.bias, rule.phrases, {**rule.pieces, first: b" zz"}))


@pytest.mark.parametrize("edit,field", [
    (lambda d: d["rules"][0]["phrases"][0].update(final=ID[" end"]), "rules[0].phrases[0].final"),
    (_forge_piece, "rules[0].pieces"),
    (lambda d: d["markup"].update(turn_start=[ID["<think>"]]), "markup.turn_start"),
    (lambda d: d["markup"].update(turn_end=[ID["</think>"]]), "markup.turn_end"),
    (lambda d: d["markup"].update(role=[ID["user"]]), "markup.role"),
    (lambda d: d["markup"].update(header_end=ID["\n"]), "markup.header_end"),
    (lambda d: d["markup"].update(think=[ID["you"], ID["</think>"]]), "markup.think"),
    (lambda d: d["classes"].update(newline=[]), "classes"),
    (lambda d: d["rules"][1].update(targets=[ID["you"]]), "rules[1].targets"),
    (lambda d: d["rules"][2].update(pairs=[[ID["The"], ID["you"]]]), "rules[2].pairs"),
    (lambda d: d["markup"]["names"].update({str(ID["<|im_start|>"]): "<|im_end|>"}), "markup.names"),
])
def test_forged_ids_are_refused_against_the_model(world, tmp_path, edit, field):
    """Each edit leaves the file consistent in itself (read_compiled accepts it); only the model's
    token table shows it was forged. open_rules, which has the model, refuses it."""
    from exactedit.native.shaping.live import open_rules

    root, rules, d = world
    with gguf.open(rules.model["path"]) as g:
        check_compiled(rules, g, "rules.json")                 # the compiled rules pass
        d = copy.deepcopy(d)
        edit(d)
        bad = _read(tmp_path, d)                               # consistent in itself: read_compiled accepts it
        with pytest.raises(ShapingRulesError) as err:
            check_compiled(bad, g, "rules.json")
        assert err.value.field == field
    with pytest.raises(ShapingRulesError) as err:
        open_rules(rules.model["path"], tmp_path / "x.json")
    assert err.value.field == field and str(tmp_path / "x.json") in str(err.value)


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2, 2 ** 40) | st.floats() | st.text(max_size=5),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                     max_leaves=6)


def _paths(obj, at=()):
    yield at
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from _paths(v, at + (k,))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pick=st.integers(0, 10 ** 6), value=_JSON, pos=st.integers(0, 10 ** 6), byte=st.integers(0, 255),
       how=st.sampled_from(["value", "byte", "drop"]))
@example(pick=0, value=None, pos=0, byte=0, how="value")
def test_mutated_compiled_rules_give_our_error(world, tmp_path, pick, value, pos, byte, how):
    root, rules, d = world
    if how == "byte":
        data = bytearray((root / "rules.json").read_bytes())
        data[pos % len(data)] = byte
        (tmp_path / "m.json").write_bytes(bytes(data))
    else:
        d = copy.deepcopy(d)
        paths = [p for p in _paths(d) if p]
        path = paths[pick % len(paths)]
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        if how == "drop":
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
        (tmp_path / "m.json").write_text(json.dumps(d))
    try:
        back = read_compiled(tmp_path / "m.json", vocab=len(TEXTS))
    except ShapingRulesError:
        return
    with gguf.open(rules.model["path"]) as g:
        try:
            check_compiled(back, g, tmp_path / "m.json")
        except ExacteditError:
            return
