"""The shaping rules' trigger state: one causal state machine over a token history.

`TriggerMachine.push(token)` reads one token and returns the `Row` state of the row that reads it
(the row that predicts the next token). The same machine runs offline over a dump
(`trigger_state`, arrays over all rows) and live in a generation loop (`solvers.shaping.rules.Shaper`),
so the two cannot disagree. It reads token ids and a `ShapeVocab`: per-token flags computed once
from the token texts, and the chat markup ids (from the model's GGUF, see solvers/shaping/rules_file.py).

Per row:
- `generating`: the row predicts text the model writes: an assistant turn's body (after the turn
  start, the assistant role's tokens and the header end, until a turn end), or any row of a
  document that has shown no turn start (plain generation);
- `in_think`, `in_tool`, `in_code`: inside think tags, tool-call tags, or an open code fence:
  the fenced text read so far holds an odd number of fence markers (below);
- `structured`: the reply's first visible token starts with `{`, `[` or a backtick, or is the
  tool-call tag (known once that token has been read);
- `step0`: the row reads the newline right after the think close tag of an assistant turn; a
  model without think tags has no think block, and its step0 is the row that ends the header;
- `reply_start`: step0, or the row that ends the assistant header;
- `sentence_start`: the row's token text ends in `.`, `!`, `?` or a newline;
- `span`: t - first, where `first` is the row that opened the current generating stretch (the
  assistant header's end, or a plain document's first row); every token of a phrase match lies at
  rows >= first (-1 where the row is not generating);
- `boundary`: the row's token ends in a word boundary (its last character is no letter, digit or
  underscore; solvers.phrases.ends_at_boundary, the shared matcher's rule).

Code fences. A fence marker is a maximal run of 3 or more backticks ("```" and "````" are one
marker each; "``" is none): CommonMark's fence is such a run, though CommonMark also wants it at a
line's start and a closing run at least as long as the opening one, which is not checked here.
The fenced text is the concatenation of the texts of the tokens read in a reply body (or a plain
document) outside think and tool-call blocks; a chat tag (turn start or end, think or tool-call
tag) ends a backtick run, as its own characters would. `in_code` is true when the fenced text up to
and including the row's token holds an odd number of markers (`fence_markers` of that text). The
machine carries the length of the text's trailing backtick run across tokens (`fence_step`), so a
marker split over tokens counts once, as in the decoded text: Qwen2.5 writes a closing fence as
"``" + "`\n\n". Per token it reads `text_fence`'s (lead, inner, trail) and the TICKS flag.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

from exactedit.solvers.phrases import ends_at_boundary
NEWLINE = 1          # text contains "\n": ends a header written as text
NL_LEAD = 2          # text starts with "\n": the header's newline is the token's first character
SENTENCE_END = 4     # text ends in . ! ? or a newline
BLANK = 8            # non-empty and only newlines: the newline after the think close tag
VISIBLE = 16         # text.strip() is non-empty
STRUCTURED = 32      # the first visible character is { [ or `
BOUNDARY = 64        # ends in a boundary character (no letter, digit, underscore; complete UTF-8)
TICKS = 128          # no character but backticks (the empty text too): a backtick run carries through it
FLAG_NAMES = {"newline": NEWLINE, "nl_lead": NL_LEAD, "sentence_end": SENTENCE_END, "blank": BLANK,
              "visible": VISIBLE, "structured": STRUCTURED, "boundary": BOUNDARY, "ticks": TICKS}
FENCE_RUN = 3        # backticks in a fence marker, at least; runs are carried capped at this
_MARKER = re.compile("`{%d,}" % FENCE_RUN)


def fence_markers(text: str) -> int:
    """The number of fence markers in a text (maximal runs of 3 or more backticks): the definition
    that `fence_step` over the tokens of a text reproduces."""
    return len(_MARKER.findall(text))


def text_fence(text: str) -> tuple[int, int, int]:
    """(lead, inner, trail) of one token's text: its leading and trailing backtick runs (capped at
    3), and the markers touching neither end (capped at 255, parity kept). A text of backticks only
    (or empty) has lead = trail = its length (capped) and inner 0."""
    n = len(text)
    lead = n - len(text.lstrip("`"))
    if lead == n:
        return min(n, FENCE_RUN), 0, min(n, FENCE_RUN)
    trail = n - len(text.rstrip("`"))
    inner = len(_MARKER.findall(text, lead, n - trail))
    return min(lead, FENCE_RUN), inner if inner < 255 else 254 + inner % 2, min(trail, FENCE_RUN)


def fence_step(fences: int, run: int, ticks: bool, lead: int, inner: int, trail: int) -> tuple[int, int]:
    """(fences, run) after a token: `fences` the markers of the fenced text so far, `run` its
    trailing backtick run (capped at 3); `ticks`, `lead`, `inner`, `trail` the token's (TICKS flag,
    text_fence). A run is counted the moment it reaches 3 backticks, so every prefix of the text
    counts its markers exactly, the trailing run included."""
    if ticks:                                   # the run grows through the token
        grown = min(run + lead, FENCE_RUN)
        return fences + (run < FENCE_RUN <= grown), grown
    return fences + (run < FENCE_RUN <= run + lead) + inner + (trail >= FENCE_RUN), trail


def text_flags(text: str) -> tuple[int, tuple[int, int, int]]:
    """(flags, text_fence) of one token's text."""
    f = 0
    if "\n" in text:
        f |= NEWLINE
    if text.startswith("\n"):
        f |= NL_LEAD
    if text and text[-1] in ".!?\n":
        f |= SENTENCE_END
    if text and not text.strip("\n"):
        f |= BLANK
    if text.strip():
        f |= VISIBLE
        if text.lstrip()[0] in "{[`":
            f |= STRUCTURED
    if ends_at_boundary(text.encode("utf-8")):
        f |= BOUNDARY
    if not text.strip("`"):
        f |= TICKS
    return f, text_fence(text)


@dataclass(frozen=True, eq=False)
class ShapeVocab:
    """What the triggers read about the vocabulary: per-token flags (uint8 [V]) and fence runs
    (uint8 [V, 3]: text_fence's lead, inner, trail), and the chat markup as token ids.
    `header_end` None: the first token containing a newline ends a turn header; `role`: the
    assistant role's tokens between the turn start and the header end.
    Markup that a model lacks is None / empty (no think tags: step0 is the header's end)."""

    flags: np.ndarray
    fences: np.ndarray
    turn_start: tuple[int, ...] = ()
    turn_end: tuple[int, ...] = ()
    role: tuple[int, ...] = ()
    header_end: int | None = None
    think_open: int | None = None
    think_close: int | None = None
    tool_open: int | None = None
    tool_close: int | None = None
    _start: frozenset = field(init=False, repr=False)
    _end: frozenset = field(init=False, repr=False)

    def __post_init__(self):
        flags = np.ascontiguousarray(self.flags, dtype=np.uint8)
        fences = np.ascontiguousarray(self.fences, dtype=np.uint8)
        if flags.ndim != 1 or fences.shape != (flags.size, 3):
            raise ValueError("flags must be uint8 [V] and fences uint8 [V, 3] (lead, inner, trail) for one "
                             "vocabulary")
        if fences.size and int(fences[:, 0::2].max()) > FENCE_RUN:
            raise ValueError(f"a fence's lead or trail run is carried capped at {FENCE_RUN}")
        object.__setattr__(self, "flags", flags)
        object.__setattr__(self, "fences", fences)
        object.__setattr__(self, "turn_start", tuple(int(t) for t in self.turn_start))
        object.__setattr__(self, "turn_end", tuple(int(t) for t in self.turn_end))
        object.__setattr__(self, "role", tuple(int(t) for t in self.role))
        object.__setattr__(self, "_start", frozenset(self.turn_start))
        object.__setattr__(self, "_end", frozenset(self.turn_end))
        if self.turn_start and not self.role:
            raise ValueError("a vocabulary with a turn start needs the assistant role's tokens")
        ids = [t for t in (*self.turn_start, *self.turn_end, *self.role, self.header_end, self.think_open,
                           self.think_close, self.tool_open, self.tool_close) if t is not None]
        if any(not 0 <= t < flags.size for t in ids):
            raise ValueError(f"a markup token id lies outside the vocabulary of {flags.size}")
        if (self.think_open is None) != (self.think_close is None) or (self.tool_open is None) != (self.tool_close is None):
            raise ValueError("think and tool-call tags come in open/close pairs")

    @property
    def size(self) -> int:
        return int(self.flags.size)

    @classmethod
    def from_texts(cls, texts: Sequence[str], *, turn_start: str | None = "<|im_start|>",
                   turn_end: Sequence[str] = ("<|im_end|>",), role: Sequence[str] = ("assistant",),
                   header_end: str | None = None, think: tuple[str, str] | None = ("<think>", "</think>"),
                   tool: tuple[str, str] | None = ("<tool_call>", "</tool_call>")) -> "ShapeVocab":
        """Flags from the token texts; markup by exact token text (a tag the table lacks is dropped,
        except the turn start and end, which must be there when asked for). `role` names the
        assistant role's tokens by text. The defaults are SPEC.md's ChatML names for small test
        vocabularies; a real model's markup comes from its GGUF (solvers.shaping.rules_file)."""
        index: dict[str, int] = {}
        for i, t in enumerate(texts):
            index.setdefault(t, i)
        fl = [text_flags(t) for t in texts]
        flags = np.array([f for f, _ in fl], dtype=np.uint8)
        fences = np.array([c for _, c in fl], dtype=np.uint8).reshape(-1, 3)
        if turn_start is None:
            return cls(flags, fences)
        missing = [t for t in (turn_start, *turn_end, *role) if t not in index]
        if missing:
            raise ValueError(f"the token table lacks {missing}; the shaping triggers need them")

        def pair(p):
            return (index[p[0]], index[p[1]]) if p is not None and p[0] in index and p[1] in index else (None, None)

        th, tl = pair(think), pair(tool)
        return cls(flags, fences, (index[turn_start],), tuple(index[t] for t in turn_end),
                   tuple(index[t] for t in role), index[header_end] if header_end is not None else None,
                   th[0], th[1], tl[0], tl[1])


class Row(NamedTuple):
    generating: bool
    in_think: bool
    in_tool: bool
    in_code: bool
    structured: bool
    step0: bool
    reply_start: bool
    sentence_start: bool
    span: int
    boundary: bool

    @property
    def open_text(self) -> bool:
        """Text rules may fire: generating, and not in think / tool / code / a structured reply."""
        return self.generating and not (self.in_think or self.in_tool or self.in_code or self.structured)


class TriggerMachine:
    """The causal trigger state of one document; `push` each token in order, `reset` between
    documents. Plain Python over ints: the live loop calls it once per generated token."""

    def __init__(self, vocab: ShapeVocab):
        self.vocab = vocab
        self.reset()

    def reset(self) -> None:
        self.chat = self.in_header = self.body = self.assistant = False
        self.think = self.tool = self.first_seen = self.structured = False
        self.header: list[int] = []
        self.fences = self.run = 0     # fence markers of the fenced text, its trailing backtick run
        self.span = self.prev = -1

    def push(self, tok: int) -> Row:
        v, tok = self.vocab, int(tok)
        if not 0 <= tok < v.size:
            raise ValueError(f"token id {tok} outside the vocabulary of {v.size}")
        f = int(v.flags[tok])
        step0 = header_done = False
        if tok in v._start:
            self.chat, self.in_header, self.body, self.assistant = True, True, False, False
            self.header = []
            self.think = self.tool = self.first_seen = self.structured = False
            self.fences = self.run = 0
        elif self.in_header:
            ends = tok == v.header_end if v.header_end is not None else bool(f & NEWLINE)
            if ends:
                self.in_header, self.body = False, True
                self.assistant = tuple(self.header) == v.role and (v.header_end is not None or bool(f & NL_LEAD))
                header_done = self.assistant
                step0 = header_done and v.think_close is None
            else:
                self.header.append(tok)
        elif tok in v._end:
            self.body, self.run = False, 0
        elif self.body or not self.chat:
            if v.think_open is not None and tok == v.think_open:
                self.think, self.run = True, 0
            elif v.think_close is not None and tok == v.think_close:
                self.think, self.first_seen, self.run = False, False, 0
            elif v.tool_open is not None and tok == v.tool_open:
                self.tool, self.run = True, 0
                if not self.first_seen and not self.think:
                    self.first_seen = self.structured = True
            elif v.tool_close is not None and tok == v.tool_close:
                self.tool, self.run = False, 0
            elif not self.think:
                if self.prev == v.think_close and v.think_close is not None and f & BLANK:
                    step0 = self.assistant or not self.chat
                elif not self.first_seen and f & VISIBLE:
                    self.first_seen = True
                    self.structured = bool(f & STRUCTURED)
                if not self.tool:
                    lead, inner, trail = v.fences[tok].tolist()
                    self.fences, self.run = fence_step(self.fences, self.run, bool(f & TICKS), lead, inner, trail)
        generating = (self.body and self.assistant) or not self.chat
        self.span = -1 if not generating else 0 if header_done else self.span + 1
        self.prev = tok
        return Row(generating, self.think, self.tool, self.fences % 2 == 1, self.structured,
                   step0 and generating, (step0 or header_done) and generating,
                   generating and bool(f & SENTENCE_END), self.span, bool(f & BOUNDARY))


@dataclass(frozen=True)
class TriggerState:
    """`Row` fields as arrays over all rows of a trace (bool [T], span int [T])."""

    generating: np.ndarray
    in_think: np.ndarray
    in_tool: np.ndarray
    in_code: np.ndarray
    structured: np.ndarray
    step0: np.ndarray
    reply_start: np.ndarray
    sentence_start: np.ndarray
    span: np.ndarray
    boundary: np.ndarray

    @property
    def open_text(self) -> np.ndarray:
        """Rows where text rules may fire: generating, and not in think / tool / code / structured."""
        return self.generating & ~self.in_think & ~self.in_tool & ~self.in_code & ~self.structured

    def row(self, t: int) -> Row:
        return Row(*(bool(getattr(self, k)[t]) if k != "span" else int(self.span[t]) for k in Row._fields))


def trigger_state(tokens, doc_starts: Sequence[int], vocab: ShapeVocab) -> TriggerState:
    """Per-row trigger state of a trace, the machine reset at each document's first row
    (`doc_starts`, in order, the first one 0)."""
    tokens = np.asarray(tokens)
    starts = set(int(s) for s in doc_starts)
    machine = TriggerMachine(vocab)
    rows = []
    for t in range(len(tokens)):
        if t in starts:
            machine.reset()
        rows.append(machine.push(int(tokens[t])))
    cols = list(zip(*rows)) if rows else [() for _ in Row._fields]
    out = {k: np.array(c, dtype=np.int64 if k == "span" else bool) for k, c in zip(Row._fields, cols)}
    return TriggerState(**out)
