"""Shaping rules: causal triggers (never inside <think>, <tool_call>, code fences, JSON replies,
user turns) and the exact logit changes each rule makes."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.solvers.shaping.rules import (
    CASE_DROP, PersonaCase, PrefixPenalty, Shaper, ShapeVocab, Step0Guard, case_pairs, parse_shape,
    shape_logits, trigger_mask, trigger_state,
)

TEXTS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "assistant", "user",
         "\n", "\n\n", " end", " to", "The", "the", " The", " the", ".", "```", "{\"", "hi", " rather", " than",
         "Sure", "sure", "[", "x", "THE", " x", "```python", "!"]
ID = {t: i for i, t in enumerate(TEXTS)}
VOCAB = ShapeVocab.from_texts(TEXTS)
PENALTY = PrefixPenalty(6.0, ((ID[" end"], ID[" to"], ID[" end"]), (ID[" rather"], ID[" than"])))


def ids(*texts):
    return np.array([ID[t] for t in texts], dtype=np.int32)


def chat(*reply, user=("hi",)):
    return ids("<|im_start|>", "user", "\n", *user, "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n", *reply)


def rows_of(tokens, text):
    """Rows reading token `text` (a row reads tokens[t] and predicts tokens[t + 1])."""
    return [t for t, tok in enumerate(tokens) if tok == ID[text]]


def penalty_rows(tokens, doc_starts=(0,)):
    doc = np.zeros(len(tokens), np.int32)
    for i, s in enumerate(doc_starts):
        doc[s:] = i
    st = trigger_state(tokens, doc_starts, VOCAB)
    return list(np.flatnonzero(trigger_mask(PENALTY, tokens, doc, st)))


def test_chat_turn_states():
    toks = chat("<think>", "\n", "x", ".", "</think>", "\n\n", "The", " x", ".", " end", " to", " end", "<|im_end|>")
    st = trigger_state(toks, [0], VOCAB)
    header_nl = 8
    assert not st.generating[:header_nl].any() and st.generating[header_nl]
    assert st.reply_start[header_nl] and not st.step0[header_nl]
    think = rows_of(toks, "<think>")[0]
    close = rows_of(toks, "</think>")[0]
    assert st.in_think[think:close].all() and not st.in_think[close]
    step0 = rows_of(toks, "\n\n")[0]
    assert list(np.flatnonzero(st.step0)) == [step0] and st.reply_start[step0]
    inner_dot, outer_dot = rows_of(toks, ".")
    assert st.sentence_start[inner_dot] and not st.open_text[inner_dot]  # inside <think>
    assert st.sentence_start[outer_dot] and st.open_text[outer_dot]
    assert penalty_rows(toks) == [rows_of(toks, " to")[0]]
    end_row = rows_of(toks, "<|im_end|>")[-1]
    assert not st.generating[end_row]


def test_penalty_never_in_user_turns_think_tool_code_or_json():
    assert penalty_rows(chat("x", user=(" end", " to"))) == []
    assert penalty_rows(chat("<think>", " end", " to", "</think>", "\n\n", "x")) == []
    assert penalty_rows(chat("x", "<tool_call>", " end", " to", "</tool_call>")) == []
    fenced = chat("x", "```python", "\n", " end", " to", "\n", "```", " end", " to")
    assert penalty_rows(fenced) == [len(fenced) - 1]  # only after the fence closes
    assert penalty_rows(chat("{\"", " end", " to")) == []  # JSON reply
    assert penalty_rows(chat("[", " end", " to")) == []
    assert penalty_rows(chat("<tool_call>", "x", "</tool_call>", " end", " to")) == []  # tool-call reply
    after_think = chat("<think>", "x", "</think>", "\n\n", "{\"", " end", " to")
    assert penalty_rows(after_think) == []  # the first visible token after </think> decides


def test_plain_documents_and_document_reset():
    plain = ids("x", " end", " to", " rather", " than")
    assert penalty_rows(plain) == [2, 3]
    # a second document starts inside nothing: the first document's open <think> does not leak
    two = np.concatenate([chat("<think>", "x"), ids(" end", " to")])
    assert penalty_rows(two, doc_starts=(0, len(two) - 2)) == [len(two) - 1]
    # the prefix must lie within one document
    split = ids("x", " end", " to")
    assert penalty_rows(split, doc_starts=(0, 2)) == []


def test_step0_guard_fires_only_after_think_close_newline():
    guard = Step0Guard(6.0, (ID["<think>"], ID["<|im_end|>"]))
    toks = chat("<think>", "x", "</think>", "\n\n", "{\"", "x")
    st = trigger_state(toks, [0], VOCAB)
    doc = np.zeros(len(toks), np.int32)
    assert list(np.flatnonzero(trigger_mask(guard, toks, doc, st))) == rows_of(toks, "\n\n")
    late = chat("x", "</think>", "x")  # </think> not followed by a newline
    assert not trigger_mask(guard, late, np.zeros(len(late), np.int32), trigger_state(late, [0], VOCAB)).any()
    user = ids("<|im_start|>", "user", "\n", "<think>", "</think>", "\n")
    assert not trigger_state(user, [0], VOCAB).step0.any()


def test_persona_case_gate_and_triggers():
    pairs = case_pairs(TEXTS)
    toks = chat("The", " x", ".", " The", "\n", "x", "<think>", ".", "</think>", "\n\n", "Sure", "```", ".", "```")
    doc = np.zeros(len(toks), np.int32)
    st = trigger_state(toks, [0], VOCAB)
    on = trigger_mask(PersonaCase(pairs, (True,)), toks, doc, st)
    dots = rows_of(toks, ".")
    want = [8, dots[0], rows_of(toks, "\n")[-1], rows_of(toks, "\n\n")[0]]  # header end, ".", "\n", step0
    assert list(np.flatnonzero(on)) == sorted(want)  # not the "." in <think>, not the "." in the fence
    assert not trigger_mask(PersonaCase(pairs, (False,)), toks, doc, st).any()  # persona inactive


def test_case_pairs():
    pairs = case_pairs(TEXTS)
    assert set(pairs) == {(ID["The"], ID["the"]), (ID[" The"], ID[" the"]), (ID["Sure"], ID["sure"])}
    assert case_pairs(TEXTS, words=["sure"]) == ((ID["Sure"], ID["sure"]),)


def test_rules_change_exactly_the_logits_they_name():
    rng = np.random.default_rng(0)
    toks = chat("<think>", "x", "</think>", "\n\n", "The", " end", " to", ".")
    doc = np.zeros(len(toks), np.int32)
    st = trigger_state(toks, [0], VOCAB)
    rows = np.arange(len(toks))
    base = rng.normal(size=(len(toks), len(TEXTS)))
    kept = base.copy()
    rules = [PENALTY, Step0Guard(5.0, (ID["<think>"], ID["<|im_end|>"])), PersonaCase(case_pairs(TEXTS), (True,))]
    out = shape_logits(rules, base, rows, toks, doc, st)
    want = base.copy()
    to_row, step0, dot = rows_of(toks, " to")[0], rows_of(toks, "\n\n")[0], rows_of(toks, ".")[0]
    want[to_row, ID[" end"]] -= 6.0
    want[step0, [ID["<think>"], ID["<|im_end|>"]]] -= 5.0
    for r in (8, step0, dot):
        for up, low in case_pairs(TEXTS):
            want[r, low] = np.logaddexp(want[r, low], want[r, up])
            want[r, up] -= CASE_DROP
    assert np.array_equal(out, want)
    assert np.array_equal(base, kept)  # the input is untouched
    half = shape_logits(rules, base[step0:], rows[step0:], toks, doc, st)  # a chunk gives the same rows
    assert np.array_equal(half, want[step0:])


@pytest.mark.parametrize("spec, want", [("prefix-penalty=6", ("prefix-penalty", 6.0)),
                                        ("step0-guard=2.5", ("step0-guard", 2.5)),
                                        ("persona-case", ("persona-case", None))])
def test_parse_shape(spec, want):
    assert parse_shape(spec) == want


@pytest.mark.parametrize("spec", ["prefix-penalty", "prefix-penalty=-1", "step0-guard=x", "persona-case=3",
                                  "lowercase", "prefix-penalty=nan"])
def test_parse_shape_errors(spec):
    with pytest.raises(ValueError):
        parse_shape(spec)


def _random_chat(rng, n):
    """Token ids drawn mostly from markup and short words, so every trigger gets exercised."""
    return rng.integers(0, len(TEXTS), size=n).astype(np.int32)


@pytest.mark.parametrize("seed", range(6))
def test_shaper_step_by_step_equals_the_trace_pass(seed):
    rng = np.random.default_rng(seed)
    toks = np.concatenate([chat("The", " end", " to", "."), _random_chat(rng, 60)])
    doc = np.zeros(len(toks), np.int32)
    rules = [PENALTY, Step0Guard(6.0, (ID["<think>"], ID["<|im_end|>"])), PersonaCase(case_pairs(TEXTS), (True,))]
    logits = rng.normal(size=(len(toks), len(TEXTS))).astype(np.float32)
    st = trigger_state(toks, [0], VOCAB)
    batch = shape_logits(rules, logits, np.arange(len(toks)), toks, doc, st, dtype=None)
    assert batch.dtype == np.float32
    masks = [trigger_mask(r, toks, doc, st) for r in rules]
    live = Shaper(rules, VOCAB, persona=True)
    for t, tok in enumerate(toks):
        live.push(int(tok))
        shaped, fired = live.shape(logits[t])
        assert np.array_equal(shaped.view(np.uint32), batch[t].view(np.uint32)), t
        assert fired == tuple(bool(m[t]) for m in masks), t


def test_no_think_tags_step0_is_the_header_end():
    vocab = ShapeVocab.from_texts(TEXTS, think=None)
    toks = chat("x", "<think>", "</think>", "\n\n", "x")
    st = trigger_state(toks, [0], vocab)
    assert list(np.flatnonzero(st.step0)) == [8]  # the header's newline, not the "\n\n" after </think>


def test_biases_must_be_float32_exact():
    with pytest.raises(ValueError, match="float32"):
        PrefixPenalty(6.1, ((ID[" end"], ID[" to"]),))
    with pytest.raises(ValueError, match="float32"):
        parse_shape("step0-guard=0.1")
