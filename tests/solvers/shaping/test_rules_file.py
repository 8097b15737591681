"""Rules files compiled for a model: text -> token ids from the GGUF (specials, chat framing, case
pairs) and the model's tokenizer; the JSON round trip; the compiled prefix trigger is the shared
phrase matcher's; clean errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from exactedit.solvers.shaping.rules import PhrasePenalty, Shaper, Step0Guard
from exactedit.solvers.shaping.compiled import CompiledRules, ShapingRulesError, read_compiled, write_compiled
from exactedit.solvers.shaping.rules_file import compile_rules, load_rules
from exactedit.solvers.shaping.triggers import trigger_state
from exactedit.quant import gguf
from tests.shaping_world import ID, RULES, TEXTS, WORDS, chat, compiled, tokenize, write_model


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return compiled(tmp_path_factory.mktemp("world"))


def test_compile_resolves_markup_specials_and_phrases(world):
    v = world.vocab
    assert (v.turn_start, v.turn_end, v.role, v.header_end) == ((ID["<|im_start|>"],), (ID["<|im_end|>"],),
                                                                (ID["assistant"],), None)
    assert (v.think_open, v.think_close, v.tool_open, v.tool_close) == tuple(
        ID[t] for t in ("<think>", "</think>", "<tool_call>", "</tool_call>"))
    pen, guard, case = world.rules
    assert [(p.text, p.final) for p in pen.phrases] == [("you can use", ID[" use"]), ("end to end", ID[" end"]),
                                                        ("rather than", ID[" than"])]
    assert {ID[t] for t in ("(you", " you", "you", "\"You", " ca", "n")} <= set(pen.pieces)
    assert ID["_you"] not in pen.pieces and ID["9you"] not in pen.pieces  # no word boundary before "you"
    assert guard.targets == (ID["<think>"], ID["<|im_end|>"]) and guard.bias == 4.5
    assert (ID["The"], ID["the"]) in case.pairs and (ID["Élan"], ID["élan"]) in case.pairs
    assert world.model["sha256"] == gguf.file_sha256(world.model["path"])


def test_json_round_trip(world, tmp_path):
    write_compiled(world, tmp_path / "r.json")
    back = read_compiled(tmp_path / "r.json")
    assert back.to_dict() == world.to_dict()
    assert np.array_equal(back.vocab.flags, world.vocab.flags) and np.array_equal(back.vocab.fences, world.vocab.fences)


def test_tampered_json_is_refused(world, tmp_path):
    d = world.to_dict()
    d["rules"][0]["merge_ok"] = d["rules"][0]["merge_ok"][1:]
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ShapingRulesError, match="merge_ok: does not match"):
        read_compiled(tmp_path / "bad.json")
    d = world.to_dict()
    d["rules"][1]["targets"] = [999]
    with pytest.raises(ShapingRulesError, match=r"rules\[1\].targets"):
        CompiledRules.from_dict(d)
    with pytest.raises(ShapingRulesError, match="version"):
        CompiledRules.from_dict({**world.to_dict(), "version": 3})
    with pytest.raises(ShapingRulesError, match="split over tokens.*recompile"):   # per-token ``` counts
        CompiledRules.from_dict({**world.to_dict(), "version": 1})


def _fires(rule, vocab, toks):
    sh = Shaper([rule], vocab)
    out = []
    for t in toks:
        sh.push(t)
        out.append(bool(sh.hits()[0]))
    return out


@pytest.mark.parametrize("reply, fires", [
    (("you", " can"), True),              # bare after the header's newline
    ((" x", " you", " can"), True),       # merged with its space
    ((" x", "(you", " can"), True),       # merged with a bracket
    (("\"You", " ca", "n"), True),        # capitalized, merged with a quote, split
    (("y", "o", "u", " ", "c", "an"), True),
    ((" x", "_you", " can"), False),      # "_you": no word boundary
    (("ab", "you", " can"), False),       # "abyou can": not at a word start
    ((" you", " can", " use"), False),    # the row reading " use" is past the prefix
])
def test_prefix_forms(world, reply, fires):
    assert _fires(world.rules[0], world.vocab, chat(*reply))[-1] is fires


def test_prefix_never_spans_the_header_or_user_turn(world):
    assert not any(_fires(world.rules[0], world.vocab, chat("x", user=("you", " can"))))


TOKS = st.lists(st.sampled_from([ID[t] for t in WORDS] + [ID["<think>"], ID["</think>"], ID["<|im_end|>"]]),
                min_size=1, max_size=14)


@settings(max_examples=300, deadline=None)
@given(TOKS)
def test_compiled_trigger_is_the_shared_matcher(world, reply):
    """The compiled rule (pieces only) fires where the shared matcher, reading the whole token
    table, finds a phrase prefix ending at the row."""
    from exactedit.solvers.phrases import PhraseMatcher, TokenBytes
    from exactedit.solvers.tail.model import load_tokens

    with gguf.open(world.model["path"]) as g:
        matcher = PhraseMatcher([p.text for p in world.rules[0].phrases], TokenBytes(load_tokens(g)))
    toks = np.array(chat(*[TEXTS[t] for t in reply]))
    st_ = trigger_state(toks, [0], world.vocab)
    sh = Shaper([world.rules[0]], world.vocab)
    for t, tok in enumerate(toks):
        sh.push(int(tok))
        row = st_.row(t)
        want = ()
        if row.open_text:
            want = tuple(world.rules[0].phrases[i].final for i in sorted(matcher.prefix_at(toks, t, t - row.span)))
        assert sh.hits()[0] == want, (t, [TEXTS[x] for x in toks])


def test_guard_targets_and_extra_names(tmp_path):
    c = compiled(tmp_path, RULES.replace("bias = 4.5", "bias = 4.5\ntargets = [\"<|endoftext|>\"]"))
    assert c.rule("step0-guard").targets == (ID["<think>"], ID["<|im_end|>"], ID["<|endoftext|>"])


@pytest.mark.parametrize("text, match", [
    ("[prefix-penalty]\nbias = 6.1\nphrases = ['you can use']\n", "float32 holds exactly"),
    ("[prefix-penalty]\nphrases = []\n", "at least one phrase"),
    ("[prefix-penalty]\nphrases = ['you can use']\ncolour = 1\n", "unknown key"),
    ("[sampler]\nx = 1\n", "unknown table"),
    ("[chat]\nthink = ['<think>']\n[step0-guard]\n", r"\[open, close\]"),
    ("[persona-case]\nactive = 'yes'\n", "expected bool"),
    ("", "no rule tables"),
    ("[step0-guard\n", "not valid TOML"),
])
def test_rules_file_errors(tmp_path, text, match):
    (tmp_path / "r.toml").write_text(text)
    with pytest.raises(ShapingRulesError, match=match) as e:
        load_rules(tmp_path / "r.toml")
    assert str(e.value).startswith(str(tmp_path / "r.toml"))


@pytest.mark.parametrize("phrase, match", [("use", "one word"), ("to theab", "not one token")])
def test_phrase_errors(tmp_path, phrase, match):
    with pytest.raises(ShapingRulesError, match=match):
        compiled(tmp_path, f"[prefix-penalty]\nphrases = ['{phrase}']\n")


def test_a_model_without_a_chat_template_needs_one_in_the_rules(tmp_path):
    model = write_model(tmp_path / "bare.gguf", template=None)
    (tmp_path / "r.toml").write_text(RULES)
    with gguf.open(model) as g, pytest.raises(ShapingRulesError, match="carries no chat template"):
        compile_rules(load_rules(tmp_path / "r.toml"), g, tokenize)
    from tests.shaping_world import CHATML_TPL

    (tmp_path / "r2.toml").write_text(RULES + f"\n[chat]\ntemplate = '''{CHATML_TPL}'''\nthink = []\n")
    with gguf.open(model) as g:
        c = compile_rules(load_rules(tmp_path / "r2.toml"), g, tokenize)
    assert c.chat["template_from"] == "rules" and c.vocab.think_open is None
    assert c.rule("step0-guard").targets == (ID["<|im_end|>"],)


def test_a_template_reaching_outside_the_sandbox_is_refused_at_compile(tmp_path):
    from exactedit.quant.model.chat_template import ChatTemplateError

    model = write_model(tmp_path / "bare.gguf", template=None)
    (tmp_path / "r.toml").write_text(RULES + "\n[chat]\ntemplate = \"{{ ''.__class__.__mro__ }}\"\n")
    with gguf.open(model) as g, pytest.raises(ChatTemplateError, match="refused by the sandbox"):
        compile_rules(load_rules(tmp_path / "r.toml"), g, tokenize)


def test_rule_kinds_in_file_order(tmp_path):
    c = compiled(tmp_path, "[step0-guard]\nbias = 2\n[prefix-penalty]\nphrases = ['end to end']\n")
    assert [type(r) for r in c.rules] == [Step0Guard, PhrasePenalty]


def test_offline_step0_and_case_rows(world):
    toks = np.array(chat("<think>", "x", "</think>", "\n\n", "The", " x", ".", " The"))
    st_ = trigger_state(toks, [0], world.vocab)
    step0 = list(toks).index(ID["\n\n"])
    assert list(np.flatnonzero(st_.step0)) == [step0]
    sh = Shaper(world.rules, world.vocab)
    fired = []
    for t in toks:
        sh.push(int(t))
        fired.append(sh.shape(np.zeros(len(TEXTS), np.float32))[1])
    assert [i for i, f in enumerate(fired) if f[2]] == [8, step0, list(toks).index(ID["."])]  # header end too
    assert [i for i, f in enumerate(fired) if f[1]] == [step0]


def test_compile_errors_name_the_rules_file_and_field(tmp_path):
    """Issue 26: a tokenizer that gives the assistant role no tokens raised the vocabulary's bare
    ValueError; it names the rules file and the field."""
    model = write_model(tmp_path / "m.gguf")
    (tmp_path / "r.toml").write_text(RULES)

    def no_role(text, special):
        return [] if text == "assistant" else tokenize(text, special)

    with gguf.open(model) as g, pytest.raises(ShapingRulesError) as err:
        compile_rules(load_rules(tmp_path / "r.toml"), g, no_role, model_path=str(model))
    assert err.value.path == str(tmp_path / "r.toml") and err.value.field == "chat"
