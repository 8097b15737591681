"""A GBNF grammar that excludes phrases from any text: a DFA over characters, rendered as GBNF.

Mainline llama.cpp has no phrase ban, but its grammar sampler refuses every token that would take
the text out of a grammar's language. `exclusion(patterns)` builds the deterministic automaton of
the texts in which no pattern occurs (Aho-Corasick by subset construction over the patterns' trie,
then Moore minimization) and `render_gbnf` writes it as right-linear GBNF rules, one per state:

    root ::= s0
    s0 ::= "" | [^0-9A-Z\x5Fa-z] s0 | [0-9A-XZ\x5Fa-xz] s1 | [Yy] s2
    ...

Every state accepts (its empty alternative: the reply may end anywhere); a transition left out
is the dead state (the grammar refuses the character that would complete a phrase). llama.cpp
expands a rule reference that ends an alternative without growing its stack, so the chain of
states runs in constant stack depth.

What is excluded: a pattern occurs where its characters match starting at a word boundary (the
text's start, or after a character that is no ASCII letter, digit or underscore), whatever
follows. A pattern is a sequence of character sets: the phrase as written and Capitalized (the
forms the rules match), or with `fold` every letter in either case. The rules penalize a phrase's
final token whatever follows it; a grammar that waited for the character after the phrase (the
matcher's whole-word end) lets the model write the whole phrase and then forces a letter onto it
("you can usecsv", seen on SmolLM2), while refusing the character that completes the phrase makes
the model choose another token there. The phrase matcher's word characters are Unicode's
(`str.isalnum`); here they are ASCII's, so a non-ASCII letter before a phrase counts as a
boundary. Hence the grammar also refuses "éyou can use" and "you can user", which the matcher
(solvers.phrases.text_occurrences) does not count, and refuses every occurrence it counts.

The automaton's alphabet: every character a pattern names, plus two classes for the rest (the
other ASCII word characters, and every other character). `Exclusion.accepts(text)` runs it.
Construction is refused past `max_states` states (MAX_STATES by default), before minimizing.
"""
from __future__ import annotations

import string
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from exactedit.errors import FieldError

WORD = frozenset(string.ascii_letters + string.digits + "_")
MAX_STATES = 60_000       # about 2,000 phrases of 2-4 words: a grammar of ~4 MB
DEAD = -1
Pattern = tuple[frozenset, ...]        # one set of characters per position


class GrammarError(FieldError):
    """The phrases cannot be written as a grammar (too many states, no phrase)."""


def patterns(phrases: Sequence[str], case: str = "rules") -> tuple[Pattern, ...]:
    """The patterns a grammar excludes: with case "rules", each phrase as written and with its first
    letter capitalized (the forms the rules match, solvers.phrases.phrase_forms); with "fold", every
    letter of the phrase in either case (a character whose other case is several characters, as
    "ß" -> "SS", keeps its one case)."""
    from exactedit.solvers.phrases import phrase_forms

    if case not in ("rules", "fold"):
        raise ValueError(f"case must be 'rules' or 'fold', got {case!r}")
    out: dict[Pattern, None] = {}
    for p in phrases:
        if case == "rules":
            for form in phrase_forms(p, True):
                out[tuple(frozenset(c) for c in form)] = None
        else:
            out[tuple(frozenset(x for x in (c, c.lower(), c.upper()) if len(x) == 1) for c in p)] = None
    if not out or any(not pat for pat in out):
        raise ValueError("a grammar needs at least one non-empty phrase")
    return tuple(out)


@dataclass(frozen=True, eq=False)
class Exclusion:
    """A minimized DFA over characters. `chars`: the characters the patterns name (sorted); `table`
    int32 [states, len(chars) + 2]: the next state on each of them, then on any other ASCII word
    character (column `other_word`), then on any other character (column `other`); DEAD: refused.
    State 0 starts; `accepting[s]`: a text may end in state s (every state, for an exclusion)."""

    chars: tuple[str, ...]
    table: np.ndarray
    accepting: np.ndarray

    @property
    def states(self) -> int:
        return int(self.table.shape[0])

    @property
    def other_word(self) -> int:
        return len(self.chars)

    @property
    def other(self) -> int:
        return len(self.chars) + 1

    def column(self, ch: str) -> int:
        j = _index(self.chars, ch)
        if j is not None:
            return j
        return self.other_word if ch in WORD else self.other

    def accepts(self, text: str) -> bool:
        """Whether no pattern occurs in `text` (the grammar's language)."""
        s = 0
        for ch in text:
            s = int(self.table[s, self.column(ch)])
            if s == DEAD:
                return False
        return bool(self.accepting[s])


def _index(chars: tuple[str, ...], ch: str) -> int | None:
    import bisect

    j = bisect.bisect_left(chars, ch)
    return j if j < len(chars) and chars[j] == ch else None


def _trie(pats: Sequence[Pattern]):
    """The patterns' trie: per node, char -> the child nodes a character leads to (several where
    two patterns' sets at that position overlap), whether a pattern ends there, whether it has
    children. Node 0 is the root."""
    kids: list[dict] = [{}]
    for p in pats:
        node = 0
        for s in p:
            nxt = kids[node].get(s)
            if nxt is None:
                nxt = kids[node][s] = len(kids)
                kids.append({})
            node = nxt
        kids[node][None] = True          # a pattern ends here
    by_char: list[dict[str, tuple[int, ...]]] = []
    for k in kids:
        m: dict[str, list[int]] = {}
        for s, child in k.items():
            if s is not None:
                for c in s:
                    m.setdefault(c, []).append(child)
        by_char.append({c: tuple(v) for c, v in m.items()})
    ends = [None in k for k in kids]
    inner = [len(k) - (None in k) > 0 for k in kids]
    return by_char, ends, inner


def exclusion(pats: Sequence[Pattern], max_states: int = MAX_STATES, where: str = "phrases") -> Exclusion:
    """The minimized automaton of the texts in which no pattern occurs starting at a word boundary.

    A state is (the trie nodes of the matches in progress, whether the last character was a word
    character); a match starts at the root after a character that is no word character (or at the
    text's start), and the character that completes one leads to the dead state. Every live state
    accepts (the language is closed under prefixes: a reply may stop anywhere)."""
    pats = [tuple(p) for p in pats]
    chars = tuple(sorted({c for p in pats for s in p for c in s}))
    col = {c: j for j, c in enumerate(chars)}
    is_word = np.array([c in WORD for c in chars] + [True, False])
    by_char, ends, inner = _trie(pats)

    def step(items, prev_word: bool, ch: str):
        new = {n for node in items for n in by_char[node].get(ch, ())}
        if not prev_word:
            new.update(by_char[0].get(ch, ()))
        if any(ends[n] for n in new):
            return None
        return frozenset(n for n in new if inner[n]), ch in WORD

    start = (frozenset(), False)
    ids = {start: 0}
    order = [start]
    rows: list[np.ndarray] = []
    todo = deque([start])

    def sid(key) -> int:
        if key is None:
            return DEAD
        if key not in ids:
            if len(ids) >= max_states:
                raise GrammarError(where, "gbnf", f"the phrases need more than {max_states} automaton states; "
                                   "give fewer or shorter phrases, or raise --max-states")
            ids[key] = len(order)
            order.append(key)
            todo.append(key)
        return ids[key]

    root_w = sid((frozenset(), True))
    while todo:
        items, prev_word = todo.popleft()
        row = np.where(is_word, root_w, 0).astype(np.int32)     # a character no match continues with
        relevant = {c for node in items for c in by_char[node]} | (set() if prev_word else set(by_char[0]))
        for ch in relevant:
            row[col[ch]] = sid(step(items, prev_word, ch))
        rows.append(row)
    return _minimize(chars, np.vstack(rows), np.ones(len(order), bool))


def _minimize(chars: tuple[str, ...], table: np.ndarray, accepting: np.ndarray) -> Exclusion:
    """Moore's partition refinement (the dead state an explicit sink while refining); a state's
    signature is its class and its successors' classes, told apart by their bytes."""
    n = table.shape[0]
    full = np.vstack([np.where(table == DEAD, n, table), np.full((1, table.shape[1]), n)]).astype(np.int32)
    acc = np.append(accepting, False)
    cls = np.where(np.arange(n + 1) == n, 2, acc.astype(np.int32)).astype(np.int32)
    count = len(set(cls.tolist()))
    while True:
        sig = np.ascontiguousarray(np.column_stack([cls, cls[full]]))
        seen: dict[bytes, int] = {}
        new = np.fromiter((seen.setdefault(r.tobytes(), len(seen)) for r in sig), np.int32, n + 1)
        if len(seen) == count:
            break
        cls, count = new, len(seen)
    # classes numbered by their first state (the start's class first: state 0 is the start); the
    # sink's class is DEAD (every state was reached from the start, so every class is live)
    first = np.unique(cls[:n], return_index=True)[1]          # each live class's first state
    reps = np.sort(first)
    number = np.full(int(cls.max()) + 1, DEAD, np.int64)
    number[cls[reps]] = np.arange(len(reps))
    out = number[cls[full[reps]]].astype(np.int32)
    return Exclusion(chars, out, acc[reps].astype(bool))


# ---- GBNF ----------------------------------------------------------------------------------------

def _escape(cp: int) -> str:
    ch = chr(cp)
    if ch.isascii() and ch.isalnum():
        return ch
    return f"\\x{cp:02X}" if cp < 0x100 else f"\\u{cp:04X}" if cp < 0x10000 else f"\\U{cp:08X}"


def char_class(codepoints, negated: bool) -> str:
    """A GBNF character class of `codepoints` (ranges where consecutive), every character that is
    no ASCII letter or digit written as an escape (\\xHH, \\uHHHH, \\UHHHHHHHH)."""
    cps = sorted(set(codepoints))
    parts, i = [], 0
    while i < len(cps):
        j = i
        while j + 1 < len(cps) and cps[j + 1] == cps[j] + 1:
            j += 1
        parts.append(_escape(cps[i]) if i == j else f"{_escape(cps[i])}-{_escape(cps[j])}")
        i = j + 1
    return "[" + ("^" if negated else "") + "".join(parts) + "]"


_WORD_CPS = frozenset(ord(c) for c in WORD)


def _alternative(dfa: Exclusion, cols: list[int]) -> str | None:
    """The character class of the columns `cols` of one state's row (which lead to one state); None
    where they hold no character (the other-word column when the patterns name every ASCII word
    character)."""
    named = {ord(dfa.chars[j]) for j in cols if j < len(dfa.chars)}
    all_named = {ord(c) for c in dfa.chars}
    word, other = dfa.other_word in cols, dfa.other in cols
    if word and other:
        rest = all_named - named
        return char_class(rest, True) if rest else "."
    if other:
        return char_class(_WORD_CPS | (all_named - named), True)
    if word:
        named |= _WORD_CPS - all_named
    return char_class(named, False) if named else None


def render_gbnf(dfa: Exclusion, header: Sequence[str] = ()) -> str:
    """The automaton as GBNF (llama.cpp's grammar format): `root ::= s0`, then one rule per state,
    an alternative per next state (its characters as one class), "" where the state accepts.
    `header`: comment lines written first."""
    lines = [f"# {' '.join(h.split())}" for h in header] + ["root ::= s0"]      # a comment is one line
    for s in range(dfa.states):
        by_target: dict[int, list[int]] = {}
        for j, t in enumerate(dfa.table[s]):
            if t != DEAD:
                by_target.setdefault(int(t), []).append(j)
        alts = ['""'] if dfa.accepting[s] else []
        for t, cols in sorted(by_target.items()):
            cls = _alternative(dfa, cols)
            if cls is not None:
                alts.append(f"{cls} s{t}")
        lines.append(f"s{s} ::= " + " | ".join(alts))
    return "\n".join(lines) + "\n"
