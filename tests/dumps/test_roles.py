"""infer_roles on hand-written ChatML streams with known answers, and mark_docs."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.dumps import (
    ROLE_ANCHOR, ROLE_CODE, ROLE_NAMES, ROLE_PROMPT, ROLE_REPLY, ROLE_REPLY_END, ROLE_STEP0, ROLE_THINK, ROLE_TOOL,
    DocInfo, DumpFormatError,
)
from exactedit.dumps.roles import infer_roles, mark_docs

SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
WORDS = ["user", "assistant", "system", "\n", "\n\n", "Hi", " there", "``", "`python\n", "x = 1\n", "```", " ok",
         "{\"a\": 1}", "<think>", " inline ``` not a fence", "```\n"]
VOCAB = SPECIALS + WORDS
ID = {text: i for i, text in reversed(list(enumerate(VOCAB)))}  # first id wins: the special one
PLAIN_THINK = len(VOCAB) - 3  # "<think>" spelled as ordinary text (not special)

P, R, S0, END, TH, TO, C = ROLE_PROMPT, ROLE_REPLY, ROLE_STEP0, ROLE_REPLY_END, ROLE_THINK, ROLE_TOOL, ROLE_CODE


def _ids(*texts) -> list[int]:
    return [t if isinstance(t, int) else ID[t] for t in texts]


# (case, token stream, expected role of each row: the bits of the *next* token)
CASES = [
    ("user then reply",
     _ids("<|im_start|>", "user", "\n", "Hi", "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n", "Hi", " there",
          "<|im_end|>", "\n"),
     [P, P, P, P, P, P, P, P, R | S0, R, R | END, P, P]),
    ("think block then visible reply",
     _ids("<|im_start|>", "assistant", "\n", "<think>", "\n", "Hi", "</think>", "\n\n", "Hi", "<|im_end|>"),
     [P, P, R | TH, R | TH, R | TH, R | TH, R, R | S0, R | END, P]),
    ("empty reply: step0 is the turn end",
     _ids("<|im_start|>", "assistant", "\n", "<|im_end|>"),
     [P, P, R | S0 | END, P]),
    ("tool call", _ids("<|im_start|>", "assistant", "\n", "<tool_call>", "{\"a\": 1}", "</tool_call>", "<|im_end|>"),
     [P, P, R | S0 | TO, R | TO, R | TO, R | END, P]),
    ("code fence split across tokens",
     _ids("<|im_start|>", "assistant", "\n", "Hi", "\n", "``", "`python\n", "x = 1\n", "```", "\n", " ok", "<|im_end|>"),
     [P, P, R | S0, R, R, R | C, R | C, R | C, R, R, R | END, P]),
    ("backticks mid-line are not a fence",
     _ids("<|im_start|>", "assistant", "\n", "Hi", " inline ``` not a fence", " ok", "<|im_end|>"),
     [P, P, R | S0, R, R, R | END, P]),
    ("fence in a user prompt, closed by the turn end",
     _ids("<|im_start|>", "user", "\n", "```\n", "x = 1\n", "<|im_end|>", "\n"),
     [P, P, P | C, P | C, P, P, P]),
    ("tag text that is not a special token is text",
     _ids("<|im_start|>", "assistant", "\n", PLAIN_THINK, "Hi", "<|im_end|>"),
     [P, P, R | S0, R, R | END, P]),
    ("plain text outside chat is prompt", _ids("Hi", " there", " ok"), [P, P, P]),
    ("open reply at the end of the stream", _ids("<|im_start|>", "assistant", "\n", "<think>", "Hi"),
     [P, P, R | TH, R | TH, R | TH]),
]


def _names(bits) -> list[str]:
    return ["|".join(n for n, b in ROLE_NAMES.items() if int(v) & b) or "-" for v in bits]


@pytest.mark.parametrize("case, stream, expected", CASES, ids=[c[0] for c in CASES])
def test_roles_of_chat_streams(case, stream, expected):
    roles = infer_roles(np.array(stream, np.int32), VOCAB, range(len(SPECIALS)))
    assert roles.dtype == np.uint8 and roles.shape == (len(stream),)
    assert _names(roles) == _names(expected)


def test_known_next_token_completes_the_last_row():
    stream = _ids("<|im_start|>", "assistant", "\n", "Hi")
    open_end = infer_roles(stream, VOCAB, range(len(SPECIALS)))
    closed = infer_roles(stream, VOCAB, range(len(SPECIALS)), next_token=ID["<|im_end|>"])
    assert int(open_end[-1]) == R and int(closed[-1]) == R | END
    assert np.array_equal(open_end[:-1], closed[:-1])


def test_bad_inputs():
    with pytest.raises(DumpFormatError) as err:
        infer_roles([0, len(VOCAB)], VOCAB, [0])
    assert err.value.field == "tokens"
    with pytest.raises(DumpFormatError) as err:
        infer_roles([0.5], VOCAB, [0])
    assert err.value.field == "tokens"
    with pytest.raises(DumpFormatError) as err:
        infer_roles([0], VOCAB, [len(VOCAB)])
    assert err.value.field == "special tokens"


def test_errors_name_the_input_not_the_function():
    """Issue 26: the errors named `infer_roles`; they name the file / document and the model."""
    with pytest.raises(DumpFormatError) as err:
        infer_roles([0, len(VOCAB)], VOCAB, [0], where="raw/tokens.i32 (document d0)")
    assert err.value.path == "raw/tokens.i32 (document d0)" and "row 1" in str(err.value)
    with pytest.raises(DumpFormatError) as err:
        infer_roles([0], VOCAB, [0], next_token=len(VOCAB), where="d")
    assert (err.value.path, err.value.field) == ("d", "next token")
    with pytest.raises(DumpFormatError) as err:
        infer_roles([0], VOCAB, [len(VOCAB)], table="model.gguf")
    assert err.value.path == "model.gguf" and "infer_roles" not in str(err.value)


def test_mark_docs_sets_anchor_bits_without_touching_input():
    roles = np.array([P, R, R, P, P], np.uint8)
    docs = [DocInfo("chat", 0, 3, "s", "c", ("chat",)), DocInfo("wiki", 3, 2, "w", "-", ("anchor",))]
    marked = mark_docs(roles, docs)
    assert list(marked) == [P, R, R, P | ROLE_ANCHOR, P | ROLE_ANCHOR]
    assert list(roles) == [P, R, R, P, P]
    assert list(mark_docs(roles, docs, {"chat": ROLE_CODE})) == [P | C, R | C, R | C, P, P]
