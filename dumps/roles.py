"""Row roles from chat structure: derive the `roles` bitmask of a dump from its chat token stream.

Row t reads token t and predicts token t+1, so row t carries the bits of token t+1 (see the ROLE_*
constants in dumps.format and docs/dump-format.md). A turn is framed as its template frames it
(`quant.model.chat_template.ChatFormat`, read off the model's own template by `probe_format`; ChatML
by default): `turn_start` ROLE `header_end` content `turn_end`. Chat tags (the turn tags, <think>,
</think>, <tool_call>, </tool_call>) count only as the single special tokens the caller names;
the same characters spelled out in ordinary text are text. Code fences are lines that start with
three backticks (after optional spaces), found in the decoded text, so a fence split across tokens
is still seen.
"""
from __future__ import annotations

from typing import Collection, Iterable, Mapping, Sequence

import numpy as np

from exactedit.dumps.errors import DumpFormatError
from exactedit.quant.model.chat_template import CHATML, ChatFormat
from exactedit.dumps.format import (
    ROLE_ANCHOR, ROLE_CODE, ROLE_PROMPT, ROLE_REPLY, ROLE_REPLY_END, ROLE_STEP0, ROLE_THINK, ROLE_TOOL,
    DocInfo, is_int,
)

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK, THINK_END = "<think>", "</think>"
TOOL, TOOL_END = "<tool_call>", "</tool_call>"
FENCE = "```"
# the parser's tag names; the turn tags' texts come from the ChatFormat
START, END, HEADER_END = "start", "end", "header_end"


def infer_roles(tokens, token_strings: Sequence[str], special_ids: Collection[int], *,
                next_token: int | None = None, fmt: ChatFormat = CHATML, where: str = "token stream",
                table: str = "token table") -> np.ndarray:
    """uint8 [T] role bits for a token stream (one document).

    `token_strings[id]` is the text token `id` decodes to; `special_ids` are the ids of control /
    added tokens (the only ones that can be chat tags). `next_token`, when known, is the token after
    the last one; otherwise the last row gets the bits its open context implies (e.g. REPLY inside
    an unfinished reply), never STEP0 or REPLY_END. `fmt` says how a turn is framed (ChatML
    unless given; `quant.model.chat_template.probe_format` reads it off a model's template). Errors name
    `where` (the file or document the tokens came from) and `table` (the model the token table is)."""
    ids = _as_ids(tokens, len(token_strings), where, "tokens")
    tags = _tag_ids(token_strings, special_ids, fmt, table)
    stream = list(ids)
    if next_token is not None and next_token >= 0:
        stream += _as_ids([next_token], len(token_strings), where, "next token").tolist()
    parser = _ChatParser(tags, fmt)
    bits = [parser.feed(int(x), token_strings[int(x)]) for x in stream]
    roles = np.zeros(len(ids), dtype=np.uint8)
    known = bits[1:] if len(stream) > len(ids) else bits[1:] + [parser.open_bits()]
    roles[:] = known[:len(ids)]
    return roles


def mark_docs(roles, docs: Iterable[DocInfo], tag_bits: Mapping[str, int] | None = None) -> np.ndarray:
    """A copy of `roles` with bits OR'ed into the rows of documents carrying a tag; by default
    documents tagged "anchor" get ROLE_ANCHOR."""
    out = np.array(roles, dtype=np.uint8, copy=True)
    for doc in docs:
        for tag, bit in (tag_bits if tag_bits is not None else {"anchor": ROLE_ANCHOR}).items():
            if tag in doc.tags:
                out[doc.first_row:doc.stop] |= np.uint8(bit)
    return out


class _ChatParser:
    """Feeds tokens one at a time; `feed` returns the bits the token carries as a next token."""

    def __init__(self, tags: Mapping[str, frozenset[int]], fmt: ChatFormat):
        self.tags = tags
        self.fmt = fmt
        # a header closed by a special token (Llama 3's <|end_header_id|>), else by its text ("\n")
        self.special_header_end = bool(tags[HEADER_END]) and bool(fmt.header_end.strip())
        self.turn: str | None = None     # role of the open turn once its header line is read
        self.header: str | None = None   # header text while reading "<|im_start|>role\n"
        self.phase = "visible"          # assistant reply: start -> think -> after_think -> visible
        self.think = self.tool = self.code = False
        self.line = ""

    def _is(self, tag: str, x: int) -> bool:
        return x in self.tags[tag]

    def open_bits(self) -> int:
        """The bits of a token that would continue the current context (no STEP0/REPLY_END)."""
        if self.turn != self.fmt.assistant or self.header is not None:
            return ROLE_PROMPT | (ROLE_CODE if self.code else 0)
        return (ROLE_REPLY | (ROLE_THINK if self.think else 0) | (ROLE_TOOL if self.tool else 0)
                | (ROLE_CODE if self.code else 0))

    def feed(self, x: int, text: str) -> int:
        if self._is(START, x):
            self.turn, self.header = None, ""
            self._reset_spans()
            return ROLE_PROMPT
        if self.header is not None:
            if self.special_header_end:
                done = self._is(HEADER_END, x)
                role = self.header if done else None
                self.header += "" if done else text
            else:
                self.header += text
                done = self.fmt.header_end in self.header
                role = self.header.split(self.fmt.header_end, 1)[0] if done else None
            if done:
                self.turn, self.header = role.strip(), None
                self.phase = "start" if self.turn == self.fmt.assistant else "visible"
            return ROLE_PROMPT
        if self.turn != self.fmt.assistant:
            if self._is(END, x):
                self.turn = None
                self._reset_spans()
                return ROLE_PROMPT
            return ROLE_PROMPT | self._fence(text)
        return self._reply_token(x, text)

    def _reply_token(self, x: int, text: str) -> int:
        bits = ROLE_REPLY
        if self._is(END, x):
            bits |= ROLE_REPLY_END | (ROLE_STEP0 if self.phase in ("start", "after_think") else 0)
            self.turn = None
            self._reset_spans()
            return bits
        if self._is(THINK, x) or self._is(THINK_END, x) or self.think:
            bits |= ROLE_THINK
        if self._is(TOOL, x) or self._is(TOOL_END, x) or self.tool:
            bits |= ROLE_TOOL
        if self._is(THINK, x):
            self.think = True
            self.phase = "think" if self.phase == "start" else self.phase
        elif self._is(THINK_END, x):
            self.think = False
            self.phase = "after_think" if self.phase == "think" else self.phase
        elif self._is(TOOL, x):
            self.tool = True
        elif self._is(TOOL_END, x):
            self.tool = False
        if self.phase in ("start", "after_think") and not (bits & ROLE_THINK) and text.strip():
            bits |= ROLE_STEP0
            self.phase = "visible"
        return bits | self._fence(text)

    def _fence(self, text: str) -> int:
        """Track ``` fence lines through `text`; ROLE_CODE if the token is in or on a fence."""
        touched = self.code
        for i, part in enumerate(text.split("\n")):
            if i > 0:
                self.line = ""
            before = self.line.lstrip(" ")
            self.line += part
            if len(before) < len(FENCE) and FENCE.startswith(before) and self.line.lstrip(" ").startswith(FENCE):
                self.code = not self.code
                touched = True
            touched = touched or self.code
        return ROLE_CODE if touched else 0

    def _reset_spans(self) -> None:
        self.think = self.tool = self.code = False
        self.line = ""


def _tag_ids(token_strings: Sequence[str], special_ids: Collection[int], fmt: ChatFormat,
             table: str) -> dict[str, frozenset[int]]:
    texts = {START: fmt.turn_start, END: fmt.turn_end, HEADER_END: fmt.header_end,
             THINK: THINK, THINK_END: THINK_END, TOOL: TOOL, TOOL_END: TOOL_END}
    found: dict[str, set[int]] = {tag: set() for tag in texts}
    for i in special_ids:
        if not is_int(i) or not 0 <= i < len(token_strings):
            raise DumpFormatError(table, "special tokens", f"id {i!r} is outside the token table "
                                  f"[0, {len(token_strings)})")
        for tag, t in texts.items():
            if token_strings[i] == t:
                found[tag].add(int(i))
    return {tag: frozenset(ids) for tag, ids in found.items()}


def _as_ids(tokens, vocab: int, where: str, field: str) -> np.ndarray:
    ids = np.asarray(tokens)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise DumpFormatError(where, field, f"expected a 1-D integer array, got {ids.dtype} {list(ids.shape)}")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        bad = int(np.flatnonzero((ids < 0) | (ids >= vocab))[0])
        raise DumpFormatError(where, field, f"row {bad}: id {int(ids[bad])}; expected [0, {vocab}) (the model's "
                              f"token table)")
    return ids.astype(np.int64)
