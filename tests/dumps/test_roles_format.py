"""infer_roles with the turn framing of other templates (Gemma, Llama 3), as probe_format reads it."""
from __future__ import annotations

from exactedit.dumps import ROLE_PROMPT as P, ROLE_REPLY as R, ROLE_REPLY_END as END, ROLE_STEP0 as S0
from exactedit.dumps.roles import infer_roles
from exactedit.quant.model.chat_template import ChatFormat

GEMMA = ChatFormat("<start_of_turn>", "<end_of_turn>", "\n", "model")
LLAMA3 = ChatFormat("<|start_header_id|>", "<|eot_id|>", "<|end_header_id|>", "assistant")
VOCAB = ["<start_of_turn>", "<end_of_turn>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "\n",
         "user", "model", "assistant", "Hi", " there", "\n\n", "<|im_end|>"]
SPECIALS = [0, 1, 2, 3, 4, 5]          # Gemma's "\n" is a user-defined token: still text in a header
ID = {t: i for i, t in enumerate(VOCAB)}


def _ids(*t):
    return [ID[x] for x in t]


def test_gemma_turns():
    toks = _ids("<start_of_turn>", "user", "\n", "Hi", "<end_of_turn>", "\n", "<start_of_turn>", "model", "\n",
                "Hi", " there", "<end_of_turn>", "\n")
    assert infer_roles(toks, VOCAB, SPECIALS, fmt=GEMMA).tolist() == [P, P, P, P, P, P, P, P, R | S0, R, R | END, P, P]


def test_llama3_turns_header_closed_by_a_special():
    toks = _ids("<|start_header_id|>", "user", "<|end_header_id|>", "\n\n", "Hi", "<|eot_id|>",
                "<|start_header_id|>", "assistant", "<|end_header_id|>", "\n\n", "Hi", "<|eot_id|>")
    assert infer_roles(toks, VOCAB, SPECIALS, fmt=LLAMA3).tolist() == [P, P, P, P, P, P, P, P, R, R | S0, R | END, P]


def test_chatml_tags_are_text_for_another_format():
    toks = _ids("<start_of_turn>", "model", "\n", "Hi", "<|im_end|>", " there")
    assert infer_roles(toks, VOCAB, SPECIALS + [12], fmt=GEMMA, next_token=ID["<end_of_turn>"]).tolist() == \
        [P, P, R | S0, R, R, R | END]
