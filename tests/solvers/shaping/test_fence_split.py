"""Code fences split over tokens (issue 39): the trigger state's `in_code` is the parity of the fence
markers (maximal runs of >= 3 backticks) in the decoded fenced text, however the tokenizer cut it.
Qwen2.5 closes a fence as "``" + "`\\n\\n"; counting ``` per token left the fence open and every rule
quiet for the rest of the reply. The per-token machine (Python, and the C reference bit for bit)
against a scan of the concatenated text; a Qwen-like reply with two code blocks; live, Qwen's own
tokenization of such a reply."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from exactedit.solvers.shaping.compiled import CompiledRules, ShapingRulesError
from exactedit.solvers.shaping.rules import PersonaCase, PrefixPenalty, Shaper, ShapeVocab, trigger_state
from exactedit.solvers.shaping.triggers import SENTENCE_END, TriggerMachine, fence_markers, text_fence
from tests import oracles
from tests.shaping_c import CRules, build, compiler

# backtick-heavy pieces: split fences ("``" + "`\n", "\n``" + "`"), longer runs, markers inside a token
PIECES = ["`", "``", "```", "````", "\n``", "`\n", "```python\n", "x", " ", "\n", "", "`\n\n", "x```", "``x``",
          "a```b````c", "```x```"]
MARKUP = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "assistant", "user", "hi"]
WORDS = ["Here", ":\n\n", "python", "print", "(", "1", ")\n", "Then", " =", "2", "Done", ".", " You", " can", " use",
         " it", "You", "you"]
TEXTS = MARKUP + PIECES + [w for w in WORDS if w not in PIECES]
ID = {t: i for i, t in enumerate(TEXTS)}
PLAIN = ShapeVocab.from_texts(TEXTS, turn_start=None)       # a document without chat: every token is fenced text
CHAT = ShapeVocab.from_texts(TEXTS)
HEADER = [ID["<|im_start|>"], ID["assistant"], ID["\n"]]
TAGS = {"<think>": "</think>", "<tool_call>": "</tool_call>"}


def by_text(texts) -> list[bool]:
    """in_code per row from the decoded text: the markers in the text up to and including the row's token."""
    out, text = [], ""
    for s in texts:
        text += s
        out.append(fence_markers(text) % 2 == 1)
    return out


def machine_in_code(vocab, toks) -> list[bool]:
    m = TriggerMachine(vocab)
    return [m.push(t).in_code for t in toks]


@st.composite
def replies(draw, tags=False):
    """Token texts of a reply; with `tags`, whole think and tool-call blocks among the pieces."""
    items = draw(st.lists(st.sampled_from(PIECES) | (st.sampled_from(sorted(TAGS)) if tags else st.nothing()),
                          max_size=30))
    out = []
    for it in items:
        if it in TAGS:
            out += [it, *draw(st.lists(st.sampled_from(PIECES), max_size=4)), TAGS[it]]
        else:
            out.append(it)
    return out


def fenced_text(texts) -> list[str]:
    """What each token adds to the fenced text: nothing inside a think or tool-call block; a tag
    adds its own characters (no backtick: it ends a run)."""
    out, inside = [], None
    for s in texts:
        if inside is not None:
            out.append(s if s == inside else "")
            inside = None if s == inside else inside
        else:
            out.append(s)
            inside = TAGS.get(s)
    return out


@settings(max_examples=400, deadline=None)
@given(replies())
@example(["``", "`\n"]).via("Qwen2.5's closing fence")
@example(["```python\n", "x", "\n``", "`", "x"]).via("the other split")
@example(["``", "", "`", "`"]).via("an empty token carries the run; four backticks are one marker")
@example(["``x``", "`"]).via("a run ending a token joins the next token's lead")
def test_per_token_machine_equals_the_decoded_text(texts):
    assert machine_in_code(PLAIN, [ID[s] for s in texts]) == by_text(texts)


@settings(max_examples=200, deadline=None)
@given(replies(tags=True))
@example(["``", "<think>", "`", "</think>", "`"]).via("a tag ends a run")
def test_in_a_chat_reply_blocks_are_skipped_and_tags_end_runs(texts):
    toks = HEADER + [ID[s] for s in texts]
    assert machine_in_code(CHAT, toks)[len(HEADER):] == by_text(fenced_text(texts))


@pytest.mark.parametrize("text", PIECES + ["`" * 7, "a" + "```b" * 300, "``a```b``", "```\n```"])
def test_text_fence_is_the_decoded_count(text):
    """lead / trail are the end runs capped at 3; inner + the end markers is the text's count (a
    ticks-only text is one run), the inner count capped at 255 with its parity kept."""
    lead, inner, trail = text_fence(text)
    n = len(text)
    assert lead == min(n - len(text.lstrip("`")), 3) and trail == min(n - len(text.rstrip("`")), 3)
    whole = fence_markers(text)
    ends = int(n - len(text.lstrip("`")) >= 3) + int(n - len(text.rstrip("`")) >= 3)
    if text.strip("`"):
        assert inner % 2 == (whole - ends) % 2 and inner == min(whole - ends, 254 + (whole - ends) % 2)
    else:
        assert inner == 0 and whole == int(n >= 3)


# --- a Qwen-like reply with two code blocks (tokens as Qwen2.5's tokenizer cuts them) ---------------
QWEN_REPLY = ["Here", ":\n\n", "```", "python", "\n", "print", "(", "1", ")\n", "``", "`\n\n", "Then", ":\n\n", "```",
              "python", "\n", "x", " =", " ", "2", "\n", "``", "`\n\n", "Done", ".", " You", " can", " use", " it", "."]
PENALTY = PrefixPenalty(6.0, ((ID[" You"], ID[" can"], ID[" use"]),))
CASE = PersonaCase(((ID["You"], ID["you"]),))


def test_rules_are_active_again_after_a_split_closing_fence():
    """Fails on per-token ``` counts: there the first block never closes and nothing fires after it."""
    toks = np.array(HEADER + [ID[s] for s in QWEN_REPLY], np.int32)
    st_ = trigger_state(toks, [0], CHAT)
    reply = st_.in_code[len(HEADER):]
    assert list(reply) == by_text(QWEN_REPLY)
    closes = [len(HEADER) + i for i, s in enumerate(QWEN_REPLY) if s == "`\n\n"]
    assert not st_.in_code[closes].any() and st_.open_text[closes].all()
    can = len(HEADER) + QWEN_REPLY.index(" can")
    for mode_rules in ((PENALTY,), (PENALTY, CASE)):      # the penalty mode's rules; rewind reads open_text
        sh = Shaper(mode_rules, CHAT)
        fired = []
        for tok in toks:
            sh.push(int(tok))
            fired.append(bool(sh.hits()[0]))
            if sh.tokens[-1] == ID["`\n\n"]:
                assert sh.row.open_text, len(sh.tokens) - 1     # what the rewind mode's Rewinder is told
        assert [t for t, f in enumerate(fired) if f] == [can]
    dot = len(HEADER) + len(QWEN_REPLY) - 1
    assert st_.sentence_start[dot] and st_.open_text[dot]      # the case rule's rows are open again too


# --- the C reference, bit for bit -------------------------------------------------------------------
@pytest.fixture(scope="module")
def dll(tmp_path_factory):
    if compiler() is None:
        oracles.unavailable("C compiler", "neither cc nor gcc is on PATH (the C reference is compiled by the tests)")
    return build(tmp_path_factory.mktemp("c"))


def _every_row_rules() -> CompiledRules:
    """The chat vocabulary with every token a sentence end, so the case rule fires at exactly the
    open-text rows: C's fired mask shows its trigger state."""
    v = CHAT
    vocab = ShapeVocab(v.flags | SENTENCE_END, v.fences, v.turn_start, v.turn_end, v.role, v.header_end,
                       v.think_open, v.think_close, v.tool_open, v.tool_close)
    return CompiledRules(vocab, (CASE,), True, "style", {"path": "", "sha256": "0" * 64, "vocab": len(TEXTS)}, {},
                         {}, {})


@pytest.fixture(scope="module")
def every_row(dll):
    rules = _every_row_rules()
    return rules, CRules(dll, CompiledRules.from_dict(rules.to_dict()).to_dict())


def _c_open_text(c, toks) -> list[bool]:
    logits = np.zeros(len(TEXTS), np.float32)
    return [bool(c.shape(np.array(toks[:t + 1], np.int32), logits)[1] & 1) for t in range(len(toks))]


@settings(max_examples=150, deadline=None)
@given(replies(tags=True))
@example(QWEN_REPLY)
@example(["``", "`\n", "x", "\n``", "`", "x"])
def test_c_reference_equals_python_and_the_text(every_row, texts):
    rules, c = every_row
    toks = HEADER + [ID["x"]] + [ID[s] for s in texts]          # "x" first: not a structured reply
    sh = Shaper(rules.rules, rules.vocab)
    py = []
    for tok in toks:
        sh.push(tok)
        py.append(bool(sh.hits()[0]))
    assert _c_open_text(c, toks) == py
    code = by_text(fenced_text(["x", *texts]))
    rows = machine_in_code(rules.vocab, toks)[len(HEADER):]
    assert rows == code
    if not any(s in TAGS for s in texts):                        # no blocks: open text is exactly "not in code"
        assert py[len(HEADER):] == [not c_ for c_ in code]


def test_compiled_fences_round_trip_and_refuse_bad_runs():
    d = _every_row_rules().to_dict()
    assert d["version"] == 2 and [ID["``"], 2, 0, 2] in d["classes"]["fences"] and ID["``"] in d["classes"]["ticks"]
    assert [ID["a```b````c"], 0, 2, 0] in d["classes"]["fences"]
    back = CompiledRules.from_dict(d)
    assert np.array_equal(back.vocab.fences, CHAT.fences)
    assert np.array_equal(back.vocab.flags, CHAT.flags | SENTENCE_END)

    for bad in ([ID["x"], 4, 0, 0], [ID["x"], 0, 0, 0], [ID["``"], 2, 1, 2], [ID["x"], 0, 256, 0], [ID["x"], 1, 0]):
        with pytest.raises(ShapingRulesError) as err:
            CompiledRules.from_dict({**d, "classes": {**d["classes"], "fences": [bad]}})
        assert err.value.field == "classes.fences[0]"


# --- live: Qwen2.5's own tokenization ---------------------------------------------------------------
LIVE_RULES = """
[prefix-penalty]
bias = 6.0
phrases = ["you can use"]

[persona-case]
"""


@pytest.mark.live
def test_live_qwen_rules_fire_after_a_closed_code_block(tmp_path, dll):
    """Qwen2.5's tokenizer cuts both closing fences as "``" + "`\n\n"; after each the reply is open text
    again: the case rule fires on the closing row (it ends a line) and the penalty on " can", in
    Python and in C, bit for bit at every row."""
    from exactedit.native.llamacpp.engine import LlamaEngine
    from exactedit.native.shaping.compile import compile_file
    from exactedit.solvers.shaping.compiled import read_compiled

    path = oracles.live_model("qwen")
    (tmp_path / "rules.toml").write_text(LIVE_RULES)
    compile_file(tmp_path / "rules.toml", path, tmp_path / "rules.json")
    rules = read_compiled(tmp_path / "rules.json")
    reply = "Here:\n\n```python\nprint(1)\n```\n\nThen:\n\n```python\nx = 2\n```\n\nDone. You can use it."
    with LlamaEngine(path) as engine:
        toks = [int(t) for t in engine.tokenize("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" + reply)]
        pieces = [engine.piece(t).decode("utf-8") for t in toks]
    closes = [t + 1 for t, s in enumerate(pieces) if s == "``"]
    assert len(closes) == 2 and all(pieces[t] == "`\n\n" for t in closes), pieces   # both fences split
    can = len(pieces) - 1 - pieces[::-1].index(" can")
    penalty, case = (next(i for i, r in enumerate(rules.rules) if r.name == k)
                     for k in ("prefix-penalty", "persona-case"))
    c = CRules(dll, rules.to_dict())
    logits = np.random.default_rng(0).normal(size=rules.vocab.size).astype(np.float32)
    sh, masks = Shaper(rules.rules, rules.vocab, persona=True), []
    for t, tok in enumerate(toks):
        sh.push(tok)
        want, fired = sh.shape(logits)
        got, mask = c.shape(np.array(toks[:t + 1], np.int32), logits)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (t, pieces[t])
        assert mask == sum(1 << i for i, f in enumerate(fired) if f), (t, pieces[t], mask, fired)
        masks.append(mask)
    state = trigger_state(np.array(toks), [0], rules.vocab)
    assert state.in_code[closes[0] - 3] and not state.in_code[closes].any() and not state.in_code[-1]
    assert all(masks[t] >> case & 1 for t in closes), [(pieces[t], masks[t]) for t in closes]
    assert masks[can] >> penalty & 1 and [t for t, m in enumerate(masks) if m >> penalty & 1] == [can]
