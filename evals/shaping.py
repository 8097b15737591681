"""Zero-parameter sampler rules (SPEC.md section 6) as edits the bars score exactly.

A rule changes a few logits at rows where its trigger fires, so the edited distribution at each
row is known exactly: shaped logits -> RowScores, as for any edit. Triggers are causal: row t
(which reads tokens[t] and predicts the next token) looks only at tokens[first_row .. t] of its
document, as a sampler would. `TriggerState` holds the per-row conditions, from the token texts:

- `generating`: the row predicts text the model writes: inside an assistant turn's body (after
  `<|im_start|>assistant` and its newline, until `<|im_end|>`), or anywhere in a document that has
  shown no `<|im_start|>` yet (plain generation);
- `in_think`, `in_tool`, `in_code`: inside `<think>..</think>`, `<tool_call>..</tool_call>`, or an
  open ``` fence of the current reply;
- `structured`: the reply's first visible token starts with `{`, `[` or a backtick, or is
  `<tool_call>` (known only once that token has been read);
- `step0`: the row reads the newline right after `</think>` in an assistant turn;
- `reply_start`: step0, or the row that ends the assistant header;
- `sentence_start`: the row's token text ends in `.`, `!`, `?` or a newline.

Every rule is quiet where `generating` is false or inside think / tool call / code fence / a
structured reply; the step-0 guard fires only at step0 rows, which lie outside all of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

CASE_DROP = 8.0


@dataclass(frozen=True)
class ShapeVocab:
    """Token texts (id -> decoded text) and the ids of the markup tokens the triggers read."""

    texts: tuple[str, ...]
    im_start: int
    im_end: int
    think_open: int
    think_close: int
    tool_open: int | None = None
    tool_close: int | None = None

    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> "ShapeVocab":
        index = {t: i for i, t in enumerate(texts)}
        need = {"im_start": "<|im_start|>", "im_end": "<|im_end|>", "think_open": "<think>",
                "think_close": "</think>"}
        missing = [v for v in need.values() if v not in index]
        if missing:
            raise ValueError(f"the token table lacks {missing}; the shaping triggers need them")
        return cls(tuple(texts), **{k: index[v] for k, v in need.items()},
                   tool_open=index.get("<tool_call>"), tool_close=index.get("</tool_call>"))


@dataclass(frozen=True)
class TriggerState:
    generating: np.ndarray
    in_think: np.ndarray
    in_tool: np.ndarray
    in_code: np.ndarray
    structured: np.ndarray
    step0: np.ndarray
    reply_start: np.ndarray
    sentence_start: np.ndarray

    @property
    def open_text(self) -> np.ndarray:
        """Rows where text rules may fire: generating, and not in think / tool / code / structured."""
        return self.generating & ~self.in_think & ~self.in_tool & ~self.in_code & ~self.structured


def trigger_state(tokens: np.ndarray, doc_starts: Sequence[int], vocab: ShapeVocab) -> TriggerState:
    """Per-row trigger conditions, computed causally within each document (a new document resets
    the state). `doc_starts` are the first rows of the documents, in order, the first one 0."""
    tokens = np.asarray(tokens)
    t_rows = len(tokens)
    out = {k: np.zeros(t_rows, dtype=bool) for k in TriggerState.__dataclass_fields__}
    starts = set(int(s) for s in doc_starts)
    v = vocab
    for t in range(t_rows):
        if t in starts:
            chat, in_header, header, body, think, tool, fences = False, False, "", False, False, False, 0
            role, first_seen, structured, prev = "", False, False, -1
        tok = int(tokens[t])
        text = v.texts[tok]
        step0 = False
        header_done = False
        if tok == v.im_start:
            chat, in_header, header, body = True, True, "", False
            think = tool = False
            fences, first_seen, structured = 0, False, False
        elif in_header:
            header += text
            if "\n" in header:
                role, in_header = header.split("\n", 1)[0].strip(), False
                body = True
                header_done = role == "assistant"
        elif tok == v.im_end:
            body = False
        elif body or not chat:
            if tok == v.think_open:
                think = True
            elif tok == v.think_close:
                think, first_seen = False, False
            elif v.tool_open is not None and tok == v.tool_open:
                tool = True
                if not first_seen and not think:
                    first_seen, structured = True, True
            elif v.tool_close is not None and tok == v.tool_close:
                tool = False
            elif not think:
                if prev == v.think_close and text and not text.strip("\n"):
                    step0 = role == "assistant" or not chat
                elif not first_seen and text.strip():
                    first_seen = True
                    structured = text.lstrip()[:1] in ("{", "[", "`")
                if not tool:
                    fences += text.count("```")
        generating = (body and role == "assistant") or not chat
        out["generating"][t] = generating
        out["in_think"][t] = think
        out["in_tool"][t] = tool
        out["in_code"][t] = fences % 2 == 1
        out["structured"][t] = structured
        out["step0"][t] = step0 and generating
        out["reply_start"][t] = (step0 or header_done) and generating
        out["sentence_start"][t] = generating and bool(text) and text[-1] in ".!?\n"
        prev = tok
    return TriggerState(**out)


@dataclass(frozen=True)
class PrefixPenalty:
    """When the row's last tokens are a banned phrase's prefix, subtract `bias` from its final token."""

    bias: float
    phrases: tuple[tuple[int, ...], ...]

    name = "prefix-penalty"

    def __post_init__(self):
        if self.bias < 0 or any(len(p) < 2 for p in self.phrases):
            raise ValueError("prefix-penalty needs bias >= 0 and phrases of >= 2 tokens")

    def triggers(self, tokens: np.ndarray, doc_id: np.ndarray, state: TriggerState) -> list[tuple[np.ndarray, int]]:
        """(row mask, token to penalize) per phrase."""
        out = []
        for phrase in self.phrases:
            hit = state.open_text.copy()
            for j, tok in enumerate(reversed(phrase[:-1])):
                if j:
                    shifted = np.zeros_like(hit)
                    shifted[j:] = (tokens[:-j] == tok) & (doc_id[:-j] == doc_id[j:])
                else:
                    shifted = tokens == tok
                hit &= shifted
            out.append((hit, int(phrase[-1])))
        return out

    def apply(self, logits: np.ndarray, rows: np.ndarray, tokens, doc_id, state) -> None:
        for mask, final in self.triggers(tokens, doc_id, state):
            logits[mask[rows], final] -= self.bias


@dataclass(frozen=True)
class Step0Guard:
    """At step0 (first assistant token after `</think>` + newline), subtract `bias` from the targets
    (`<think>` and `<|im_end|>`)."""

    bias: float
    targets: tuple[int, ...]

    name = "step0-guard"

    def __post_init__(self):
        if self.bias < 0 or not self.targets:
            raise ValueError("step0-guard needs bias >= 0 and at least one target token")

    def mask(self, state: TriggerState) -> np.ndarray:
        return state.step0

    def apply(self, logits: np.ndarray, rows: np.ndarray, tokens, doc_id, state) -> None:
        m = self.mask(state)[rows]
        for tok in self.targets:
            logits[m, tok] -= self.bias


@dataclass(frozen=True)
class PersonaCase:
    """At reply starts and sentence starts of open text in persona documents, move each capitalized
    starter's mass to its lowercase twin: l_low' = logaddexp(l_low, l_up), l_up' = l_up - drop."""

    pairs: tuple[tuple[int, int], ...]
    persona_docs: tuple[bool, ...]
    drop: float = CASE_DROP

    name = "persona-case"

    def __post_init__(self):
        if not self.pairs:
            raise ValueError("persona-case needs at least one (capitalized, lowercase) pair")
        ups, lows = {u for u, _ in self.pairs}, {lo for _, lo in self.pairs}
        if ups & lows or len(ups) != len(self.pairs):
            raise ValueError("persona-case pairs must map distinct capitalized tokens to lowercase ones")

    def mask(self, doc_id: np.ndarray, state: TriggerState) -> np.ndarray:
        active = np.asarray(self.persona_docs, dtype=bool)[doc_id]
        return active & state.open_text & (state.reply_start | state.sentence_start)

    def apply(self, logits: np.ndarray, rows: np.ndarray, tokens, doc_id, state) -> None:
        m = self.mask(doc_id, state)[rows]
        up = np.array([u for u, _ in self.pairs])
        low = np.array([lo for _, lo in self.pairs])
        sub = logits[m]
        sub[:, low] = np.logaddexp(sub[:, low], sub[:, up])
        sub[:, up] -= self.drop
        logits[m] = sub


Rule = PrefixPenalty | Step0Guard | PersonaCase


def case_pairs(texts: Sequence[str], words: Sequence[str] | None = None) -> tuple[tuple[int, int], ...]:
    """(capitalized id, lowercase id) for every alphabetic token spelled Capitalized (optionally a
    leading space) whose lowercase twin is in the table; `words` restricts to those words."""
    index = {t: i for i, t in enumerate(texts)}
    keep = None if words is None else {w.lower() for w in words}
    out = []
    for i, t in enumerate(texts):
        word = t[1:] if t.startswith(" ") else t
        if not word.isalpha() or not word[0].isupper() or (len(word) > 1 and not word[1:].islower()):
            continue
        twin = t[: len(t) - len(word)] + word.lower()
        if twin in index and (keep is None or word.lower() in keep):
            out.append((i, index[twin]))
    return tuple(out)


def shape_logits(rules: Sequence[Rule], logits: np.ndarray, rows: np.ndarray, tokens: np.ndarray,
                 doc_id: np.ndarray, state: TriggerState) -> np.ndarray:
    """The shaped logits (float64 copy) of a chunk: `logits[i]` belongs to row `rows[i]`; tokens,
    doc_id and state cover the whole trace. Rules apply in order."""
    out = np.array(logits, dtype=np.float64, copy=True)
    for rule in rules:
        rule.apply(out, np.asarray(rows), tokens, doc_id, state)
    return out


def trigger_mask(rule: Rule, tokens: np.ndarray, doc_id: np.ndarray, state: TriggerState) -> np.ndarray:
    """bool [T]: the rows where `rule` changes any logit."""
    if isinstance(rule, PrefixPenalty):
        masks = [m for m, _ in rule.triggers(tokens, doc_id, state)]
        return np.logical_or.reduce(masks) if masks else np.zeros(len(tokens), dtype=bool)
    if isinstance(rule, PersonaCase):
        return rule.mask(doc_id, state)
    return rule.mask(state)


def parse_shape(spec: str) -> tuple[str, float | None]:
    """`prefix-penalty=6` -> ("prefix-penalty", 6.0); `persona-case` -> ("persona-case", None)."""
    name, _, value = spec.partition("=")
    if name not in ("prefix-penalty", "step0-guard", "persona-case"):
        raise ValueError(f"unknown shaping rule {name!r}; expected prefix-penalty=B, step0-guard=B or persona-case")
    if name == "persona-case":
        if value:
            raise ValueError("persona-case takes no value (its drop is fixed at 8 nats by SPEC.md section 6)")
        return name, None
    try:
        bias = float(value)
    except ValueError:
        raise ValueError(f"{name} needs a bias, e.g. {name}=6; got {spec!r}") from None
    if not np.isfinite(bias) or bias < 0:
        raise ValueError(f"{name} needs a finite bias >= 0, got {value!r}")
    return name, bias
