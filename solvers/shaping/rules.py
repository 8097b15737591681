"""Zero-parameter sampler rules (SPEC.md section 6): one implementation, offline and live.

A rule changes a few logits at rows where its trigger fires, so the edited distribution at each
row is known exactly: shaped logits -> RowScores, as for any edit. Triggers are causal: row t
(which reads tokens[t] and predicts the next token) looks only at its document's tokens up to t,
as a sampler does. The trigger state is `solvers.shaping.triggers.TriggerMachine`; on top of it each rule
says, per row, what it hits (`hits`), and changes one row of logits (`apply_row`). Offline,
`shape_logits` / `trigger_mask` step through a trace; live, `Shaper` is pushed one token at a time
and shapes the logits the sampler is about to see. Both call the same `hits` and `apply_row`.

Arithmetic, in the dtype of the logits given (float32 live, as the engine hands them over):
prefix penalty and step-0 guard subtract the bias (a float32-exact number) from the target's
logit; the case rule sets l_low' = logaddexp(l_low, l_up) (computed in float64, as numpy's
`logaddexp` does, then rounded to the logits' dtype) and l_up' = l_up - drop. Rules apply in the
order given; a prefix penalty subtracts once per phrase whose prefix matches. Every rule is quiet
where the model is not writing open text (see solvers.shaping.triggers); the step-0 guard fires only at
step0 rows, which lie outside think, tool calls, code and structured replies.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from exactedit.solvers.shaping.triggers import Row, ShapeVocab, TriggerMachine, TriggerState, trigger_state

CASE_DROP = 8.0

__all__ = [
    "CASE_DROP", "PersonaCase", "PhrasePenalty", "PrefixPenalty", "Row", "Rule", "ShapeVocab", "Shaper", "Step0Guard",
    "TextPhrase", "TriggerMachine", "TriggerState", "case_pairs", "parse_shape", "rule_hits", "shape_logits", "trigger_mask",
    "trigger_state",
]


def _f32_exact(x: float, what: str) -> float:
    x = float(x)
    with np.errstate(over="ignore"):            # past float32's range: inf, refused below (no warning printed)
        f32 = float(np.float32(x))
    if not np.isfinite(x) or x < 0 or f32 != x:
        raise ValueError(f"{what} must be a finite number >= 0 that float32 holds exactly (e.g. 6 or 6.5), got {x!r}")
    return x


def _fits(k: int, span: int) -> bool:
    """k tokens ending at the row lie in the current generating stretch (rows >= t - span)."""
    return 0 < k <= span + 1


@dataclass(frozen=True)
class PrefixPenalty:
    """When the row's last tokens are exactly a banned tuple's prefix (token ids, as the bars'
    prefix-exact positions are defined), subtract `bias` from the tuple's final token."""

    bias: float
    phrases: tuple[tuple[int, ...], ...]

    name = "prefix-penalty"

    def __post_init__(self):
        object.__setattr__(self, "bias", _f32_exact(self.bias, "prefix-penalty bias"))
        phrases = tuple(tuple(int(t) for t in p) for p in self.phrases)
        if any(len(p) < 2 for p in phrases):
            raise ValueError("prefix-penalty phrases need >= 2 tokens (a prefix and a final token)")
        object.__setattr__(self, "phrases", phrases)

    def hits(self, tokens, boundary, start: int, t: int, row: Row, active: bool = True) -> tuple[int, ...]:
        """The final tokens to penalize at row t, one per matching tuple, in order."""
        if not row.open_text:
            return ()
        out = []
        for p in self.phrases:
            k = len(p) - 1
            if _fits(k, row.span) and t - k + 1 >= start and all(int(tokens[t - j]) == p[k - 1 - j] for j in range(k)):
                out.append(p[-1])
        return tuple(out)

    def apply_row(self, logits: np.ndarray, hits) -> None:
        bias = logits.dtype.type(self.bias)
        for tok in hits:
            logits[tok] = logits[tok] - bias


@dataclass(frozen=True)
class TextPhrase:
    """A banned phrase as text and the token its last word is (the one penalized)."""

    text: str
    final: int


class _WindowBytes:
    """The token bytes the shared matcher walks over, from a compiled rule: the bytes of every token
    a match can use (`pieces`); any other token is b"\x00" where it ends in a word boundary, else
    b"\xff" (neither can take part in a match of UTF-8 text; only the boundary test reads them)."""

    def __init__(self, pieces: Mapping[int, bytes]):
        self.pieces = pieces
        self.boundary: dict[int, bool] = {}

    def __call__(self, i: int) -> bytes:
        b = self.pieces.get(i)
        if b is not None:
            return b
        return b"\x00" if self.boundary.get(i, False) else b"\xff"


@dataclass(frozen=True)
class PhrasePenalty:
    """Banned phrases as text (compiled for one model): when the text the model has written in
    the current generating stretch ends with a phrase's prefix ("you can" of "you can use", as
    written or Capitalized, starting at a word boundary: the shared matcher's definition,
    solvers.phrases), subtract `bias` from the phrase's final token. `pieces`: token id ->
    bytes for every token a match can use (tokens spelling part of a prefix, or merging a
    boundary character with its start); a token outside them only ever serves as the boundary."""

    bias: float
    phrases: tuple[TextPhrase, ...]
    pieces: Mapping[int, bytes]
    _matcher: object = field(init=False, repr=False, compare=False)
    _longest: int = field(init=False, repr=False, compare=False)
    _ends: dict = field(init=False, repr=False, compare=False)
    _whole: dict = field(init=False, repr=False, compare=False)

    name = "prefix-penalty"

    def __post_init__(self):
        from exactedit.solvers.phrases import PhraseMatcher, split_last_word

        object.__setattr__(self, "bias", _f32_exact(self.bias, "prefix-penalty bias"))
        phrases = tuple(self.phrases)
        if not phrases or any(split_last_word(p.text) is None for p in phrases):
            raise ValueError("prefix-penalty needs phrases of two or more words")
        object.__setattr__(self, "phrases", phrases)
        object.__setattr__(self, "pieces", {int(k): bytes(v) for k, v in self.pieces.items()})
        matcher = PhraseMatcher([p.text for p in phrases], _WindowBytes(self.pieces))
        object.__setattr__(self, "_matcher", matcher)
        # The forms a walk back from a row can start on (`hits`): by each prefix's suffixes as long
        # as a token's bytes can be (the row's token spells the prefix's end; a token outside the
        # pieces is one byte) and by the whole prefix (the token ends with all of it, merged with
        # the boundary character before it).
        widest = max((len(b) for b in self.pieces.values()), default=1)
        ends: dict[bytes, list[int]] = {}
        whole: dict[bytes, list[int]] = {}
        for k, f in enumerate(matcher.forms):
            if f.prefix:
                whole.setdefault(f.prefix, []).append(k)
                for j in range(1, min(len(f.prefix), widest) + 1):
                    ends.setdefault(f.prefix[-j:], []).append(k)
        object.__setattr__(self, "_ends", {b: tuple(v) for b, v in ends.items()})
        object.__setattr__(self, "_whole", {b: tuple(v) for b, v in whole.items()})
        object.__setattr__(self, "_longest", max(len(f.prefix) for f in matcher.forms if f.prefix) + 1)

    @property
    def longest(self) -> int:
        """Most tokens one match can span (each token spells >= 1 byte), the boundary token included."""
        return self._longest

    def hits(self, tokens, boundary, start: int, t: int, row: Row, active: bool = True) -> tuple[int, ...]:
        """The shared matcher's `prefix_at`, walked only from the forms whose prefix the row's
        token can end (the walk's first step: the prefix ends with the token's bytes, or they end
        with the whole prefix); any other form's walk stops at that step."""
        if not row.open_text:
            return ()
        first = max(start, t - row.span)
        if t < first:
            return ()
        m = self._matcher
        tb = m.tb
        tb.boundary = {int(tokens[i]): bool(boundary[i]) for i in range(max(first, t - self._longest), t + 1)}
        b = tb(int(tokens[t]))
        cand = set(self._ends.get(b, ()))
        for k in range(1, min(len(b), self._longest - 1) + 1):
            cand.update(self._whole.get(b[-k:], ()))
        found: set[int] = set()
        for k in cand:
            f = m.forms[k]
            if f.phrase not in found and m.walk(tokens, t, first, f.prefix) is not None:
                found.add(f.phrase)
        return tuple(self.phrases[i].final for i in sorted(found))

    apply_row = PrefixPenalty.apply_row


@dataclass(frozen=True)
class Step0Guard:
    """At step0 (the first reply token after the think close tag and its newline; without think
    tags, the first reply token), subtract `bias` from the targets (the turn end, `<think>`)."""

    bias: float
    targets: tuple[int, ...]

    name = "step0-guard"

    def __post_init__(self):
        object.__setattr__(self, "bias", _f32_exact(self.bias, "step0-guard bias"))
        object.__setattr__(self, "targets", tuple(dict.fromkeys(int(t) for t in self.targets)))
        if not self.targets:
            raise ValueError("step0-guard needs at least one target token")

    def hits(self, tokens, boundary, start, t, row: Row, active: bool = True) -> tuple[int, ...]:
        return self.targets if row.step0 else ()

    def apply_row(self, logits: np.ndarray, hits) -> None:
        bias = logits.dtype.type(self.bias)
        for tok in hits:
            logits[tok] = logits[tok] - bias


@dataclass(frozen=True)
class PersonaCase:
    """At reply starts and sentence starts of open text, with the persona active, move each
    capitalized starter's mass to its lowercase twin: l_low' = logaddexp(l_low, l_up),
    l_up' = l_up - drop. `persona_docs`: offline, whether each document of a trace is a persona
    document; live, the `Shaper`'s `persona` flag gates it."""

    pairs: tuple[tuple[int, int], ...]
    persona_docs: tuple[bool, ...] = ()
    drop: float = CASE_DROP
    _up: np.ndarray = field(init=False, repr=False, compare=False)
    _low: np.ndarray = field(init=False, repr=False, compare=False)

    name = "persona-case"

    def __post_init__(self):
        object.__setattr__(self, "drop", _f32_exact(self.drop, "persona-case drop"))
        pairs = tuple((int(u), int(lo)) for u, lo in self.pairs)
        if not pairs:
            raise ValueError("persona-case needs at least one (capitalized, lowercase) pair")
        ups, lows = [u for u, _ in pairs], [lo for _, lo in pairs]
        if set(ups) & set(lows) or len(set(ups)) != len(ups) or len(set(lows)) != len(lows):
            raise ValueError("persona-case pairs must map distinct capitalized tokens to distinct lowercase ones")
        object.__setattr__(self, "pairs", pairs)
        object.__setattr__(self, "persona_docs", tuple(bool(p) for p in self.persona_docs))
        object.__setattr__(self, "_up", np.array(ups, dtype=np.int64))
        object.__setattr__(self, "_low", np.array(lows, dtype=np.int64))

    def hits(self, tokens, boundary, start, t, row: Row, active: bool = True) -> tuple[bool, ...]:
        return (True,) if active and row.open_text and (row.reply_start or row.sentence_start) else ()

    def apply_row(self, logits: np.ndarray, hits) -> None:
        if not hits:
            return
        up = logits[self._up].astype(np.float64)
        logits[self._low] = np.logaddexp(logits[self._low].astype(np.float64), up).astype(logits.dtype)
        logits[self._up] = logits[self._up] - logits.dtype.type(self.drop)


Rule = PrefixPenalty | PhrasePenalty | Step0Guard | PersonaCase


def case_pairs(texts: Sequence[str], words: Sequence[str] | None = None,
               skip: Sequence[int] = ()) -> tuple[tuple[int, int], ...]:
    """(capitalized id, lowercase id) for every alphabetic token spelled Capitalized (optionally a
    leading space) whose lowercase twin is in the table; `words` restricts to those words, `skip`
    excludes ids (special tokens). The first id of a duplicated text, and the first capital
    of a lowercase twin, are used."""
    index: dict[str, int] = {}
    for i, t in enumerate(texts):
        index.setdefault(t, i)
    keep = None if words is None else {w.lower() for w in words}
    banned = set(int(s) for s in skip)
    out, taken = [], set()
    for i, t in enumerate(texts):
        word = t[1:] if t.startswith(" ") else t
        if i in banned or index[t] != i or not word.isalpha() or not word[0].isupper() \
                or (len(word) > 1 and not word[1:].islower()):
            continue
        twin = t[: len(t) - len(word)] + word.lower()
        low = index.get(twin) if twin != t and word.lower().islower() else None
        if low is not None and low not in banned and low not in taken and (keep is None or word.lower() in keep):
            out.append((i, low))
            taken.add(low)  # Unicode folds some capitals together (KELVIN SIGN and K): first one wins
    return tuple(out)


class Shaper:
    """The rules live, step by step: `push(token)` for every token of the history (prompt, then
    each sampled token), then `shape(logits)` for the row that read the last one. `reset()` starts
    a new document. `persona` gates the case rule."""

    def __init__(self, rules: Sequence[Rule], vocab: ShapeVocab, *, persona: bool = True):
        self.rules = tuple(rules)
        self.vocab = vocab
        self.persona = bool(persona)
        self.machine = TriggerMachine(vocab)
        self.reset()

    def reset(self) -> None:
        self.machine.reset()
        self.tokens: list[int] = []
        self.boundary: list[bool] = []
        self.row: Row | None = None
        self._hits: tuple | None = None     # (t, persona, hits) of the last `hits()`

    def push(self, tok: int) -> Row:
        self.row = self.machine.push(tok)
        self.tokens.append(int(tok))
        self.boundary.append(self.row.boundary)
        return self.row

    def hits(self) -> tuple[tuple, ...]:
        """What each rule hits at the current row (empty tuple: it does not fire). Kept for the
        row: the live loop asks twice per step (to shape, then to measure each rule alone)."""
        if self.row is None:
            raise ValueError("push at least one token before shaping")
        t = len(self.tokens) - 1
        if self._hits is not None and self._hits[:2] == (t, self.persona):
            return self._hits[2]
        hits = tuple(r.hits(self.tokens, self.boundary, 0, t, self.row, self.persona) for r in self.rules)
        self._hits = (t, self.persona, hits)
        return hits

    def shape(self, logits: np.ndarray) -> tuple[np.ndarray, tuple[bool, ...]]:
        """(shaped copy of the current row's logits, in their dtype; which rules fired)."""
        out = np.array(logits, copy=True)
        hits = self.hits()
        for rule, h in zip(self.rules, hits):
            if h:
                rule.apply_row(out, h)
        return out, tuple(bool(h) for h in hits)


def _starts_of(doc_id: np.ndarray) -> np.ndarray:
    """The first row of each row's document (doc_id is nondecreasing, one run per document)."""
    doc_id = np.asarray(doc_id)
    first = np.flatnonzero(np.r_[True, doc_id[1:] != doc_id[:-1]]) if doc_id.size else np.zeros(0, np.int64)
    run = np.cumsum(np.r_[True, doc_id[1:] != doc_id[:-1]]) - 1 if doc_id.size else first
    return first[run]


def _active(rule: Rule, doc_id: int) -> bool:
    if isinstance(rule, PersonaCase):
        return bool(rule.persona_docs[doc_id]) if doc_id < len(rule.persona_docs) else False
    return True


def rule_hits(rule: Rule, rows: np.ndarray, tokens: np.ndarray, doc_id: np.ndarray,
              state: TriggerState) -> list[tuple]:
    """What `rule` hits at each of `rows` (global row ids) of a trace."""
    tokens, doc_id = np.asarray(tokens), np.asarray(doc_id)
    starts = _starts_of(doc_id)
    return [rule.hits(tokens, state.boundary, int(starts[t]), int(t), state.row(int(t)), _active(rule, int(doc_id[t])))
            for t in np.asarray(rows).reshape(-1)]


def shape_logits(rules: Sequence[Rule], logits: np.ndarray, rows: np.ndarray, tokens: np.ndarray,
                 doc_id: np.ndarray, state: TriggerState, dtype=np.float64) -> np.ndarray:
    """The shaped logits (a copy in `dtype`; None: the input's) of a chunk: `logits[i]` belongs
    to row `rows[i]`; tokens, doc_id and state cover the whole trace. Rules apply in order."""
    out = np.array(logits, dtype=dtype, copy=True)
    rows = np.asarray(rows).reshape(-1)
    for rule in rules:
        for i, h in enumerate(rule_hits(rule, rows, tokens, doc_id, state)):
            if h:
                rule.apply_row(out[i], h)
    return out


def trigger_mask(rule: Rule, tokens: np.ndarray, doc_id: np.ndarray, state: TriggerState) -> np.ndarray:
    """bool [T]: the rows where `rule` changes any logit."""
    hits = rule_hits(rule, np.arange(len(tokens)), tokens, doc_id, state)
    return np.array([bool(h) for h in hits], dtype=bool)


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
    try:
        _f32_exact(bias, name)
    except ValueError:
        raise ValueError(f"{name} needs a finite bias >= 0 that float32 holds exactly (e.g. 6 or 6.5), "
                         f"got {value!r}") from None
    return name, bias
