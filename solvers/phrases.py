"""One phrase matcher for the whole toolkit: banned phrases as text -> positions in token streams.

`solve wfld`'s mining (solvers/l47/mining.py), `exactedit mine` and the phrase rates of free
generation (evals/rates/phrase_rates.py) all count a phrase with this module, so the three can never
disagree about what an occurrence is.

A phrase occurs where its text (as written, or with a capital first letter when `capitalized`)
starts at a word boundary: the character before it is no letter, digit or underscore (a space,
a newline, punctuation, a quote, a bracket). In token space that gives two shapes:
- merged: the boundary character sits inside the phrase's first token (" end", "(you", "\\nHere");
- bare: the phrase's first token starts the phrase exactly, right after a token that ends in a
  boundary character ("\\n" "Here" "'s" ...); that context token then joins the matched tuple.
A special token is no text, so a phrase never matches right after one, nor across one. The last
token of a match must lie inside the phrase (" use" in "you can use", not " user").

A *context* (an FTPO position) is a row t whose tokens end with a matched tuple's prefix and whose
next token is the tuple's final token (the rejected one); where two tuples match, the longest wins.
A phrase's *prefix* is its text without its last word ("you can" for "you can use"); a prefix
position is a row whose tokens end with the prefix (same boundary rules), and it *continues* when
the text after it starts with the last word as a whole word. `text_occurrences` counts the phrase
in decoded text with the same boundary rule, so a report can say how many occurrences the text
had and how many of them were found prefix-exact in token space.

`tokenizations` lists every segmentation of a text (a reference for small vocabularies);
`PhraseMatcher` walks back from each row instead (the number of segmentations grows exponentially
with a phrase's length in a large vocabulary).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from exactedit.errors import FieldError
from exactedit.files import decode_utf8, read_regular


class PhraseError(FieldError):
    """A phrases file or a phrase cannot be used (names the file or phrase, the field and why)."""


MAX_PHRASE_BYTES = 256
DISCOVERED_KINDS = ("style", "mixed", "topic")   # discover's phrase kinds (evals/discover/kinds.py)
MAX_PHRASES_FILE = 64 << 20   # a phrases file (text or discover's JSON) is read whole
TOKEN_CONTROL = 3   # llama.cpp's token type of control tokens (chat scaffolding): no text
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")   # C0, DEL, C1 controls; surrogates
# invisible format characters: zero-width space and word joiners, bidirectional marks, embeddings,
# overrides and isolates, a byte-order mark (ZWJ / ZWNJ, which scripts spell words with, are kept)
_INVISIBLE = re.compile("[\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def load_phrases(path, top: int | None = None, kind: str = "style") -> tuple[str, ...]:
    """Banned phrases from a text file (one per line; blank lines and lines starting with '#'
    skipped), or from `exactedit discover`'s JSON (a file whose text starts with '{'): its first
    `top` usable entries of `kind` (`discovered_phrases`). A regular file of at most MAX_PHRASES_FILE
    bytes, UTF-8 (a FIFO or a device is refused, not waited on)."""
    path = Path(path)
    data = read_regular(path, MAX_PHRASES_FILE, PhraseError, "phrases")
    text = decode_utf8(data, path, PhraseError, "phrases")
    if text.lstrip().startswith("{"):
        return discovered_phrases(text, path, top, kind)
    phrases = parse_phrases(text.splitlines(), path)
    return phrases[:top] if top else phrases


def phrase_problem(phrase: str) -> str | None:
    """Why `phrase` (whitespace already collapsed) cannot be banned, or None: longer than
    MAX_PHRASE_BYTES, or holding a control character (NUL, ESC, DEL: no text a model writes, and
    what a terminal or a C reader of the rules would act on), a lone surrogate (JSON's "\\ud800":
    no UTF-8 encodes it) or an invisible format character (a zero-width space, a bidirectional
    override, a byte-order mark: the phrase would not say what it shows)."""
    bad = _UNPRINTABLE.search(phrase)
    if bad is not None:
        what = "a lone surrogate" if "\ud800" <= bad.group() <= "\udfff" else "a control character"
        return f"phrase {ascii(phrase)[:80]} holds {what} ({ascii(bad.group())} at character {bad.start()})"
    bad = _INVISIBLE.search(phrase)
    if bad is not None:     # it compiled into a rule matching no text the phrase shows (a BOM in "you can\ufeff use")
        return (f"phrase {ascii(phrase)[:80]} holds an invisible format character ({ascii(bad.group())} at character "
                f"{bad.start()}): it hides what the phrase says, and no reply writes it there")
    if len(phrase.encode("utf-8")) > MAX_PHRASE_BYTES:
        return f"phrase longer than {MAX_PHRASE_BYTES} bytes"
    return None


def ban_text(phrase: str) -> str | None:
    """A discovered phrase as a ban: its words without trailing punctuation ("Here's an example:"
    -> "Here's an example"); None when fewer than two words remain (a ban needs a prefix)."""
    words = phrase.split()
    while words and not any(is_word_char(c) for c in words[-1]):
        words.pop()
    if words:
        words[-1] = words[-1].rstrip("".join(c for c in words[-1] if not is_word_char(c) and c not in "'’"))
    return " ".join(words) if len(words) >= 2 and words[-1] else None


def kinds_of(kind: str) -> frozenset[str] | None:
    """The entry kinds `kind` takes ("style", "mixed", "topic", a comma list of them, or "any":
    None, every entry); a ValueError names the choices."""
    wanted = frozenset(k.strip() for k in str(kind).split(",") if k.strip())
    if wanted == {"any"}:
        return None
    if not wanted or not wanted <= set(DISCOVERED_KINDS):
        raise ValueError(f"kind: expected one of {', '.join(DISCOVERED_KINDS)} (or several, comma-separated) or "
                         f"any, got {kind!r}")
    return wanted


def discovered_phrases(text: str, where, top: int | None = None, kind: str = "style") -> tuple[str, ...]:
    """The ban list of discover's JSON ({"phrases": [{"phrase", "ban_phrase"?, "kind"?, ...}, ...]},
    in its order): the entries of `kind` (`kinds_of`: "style" by default, so the prompts' subject
    is never banned unasked; an entry without a kind, from an older discover, always counts), each at
    its measured ban point (`ban_phrase`, written by `discover --model`), else its text without
    trailing punctuation; one-word entries skipped (a ban needs a prefix); duplicates kept once; the
    first `top` of them."""
    import json

    try:
        wanted = kinds_of(kind)
    except ValueError as exc:
        raise PhraseError(where, "kind", str(exc)) from None

    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise PhraseError(where, "json", f"not valid JSON ({exc})") from None
    except RecursionError:
        raise PhraseError(where, "json", "not valid JSON (nested too deeply)") from None
    entries = doc.get("phrases") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise PhraseError(where, "phrases", "expected discover's JSON: an object with a list 'phrases'")
    out: dict[str, None] = {}          # insertion-ordered: duplicates found in O(1), the order kept
    for k, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("phrase"), str):
            raise PhraseError(where, f"phrases[{k}].phrase", "expected an object with a string 'phrase'")
        ban = e.get("ban_phrase")
        entry_kind = e.get("kind")
        if entry_kind is not None and not isinstance(entry_kind, str):
            raise PhraseError(where, f"phrases[{k}].kind", "expected a string")
        if wanted is not None and entry_kind is not None and entry_kind not in wanted:
            continue
        if ban is not None and not isinstance(ban, str):
            raise PhraseError(where, f"phrases[{k}].ban_phrase", "expected a string")
        phrase = ban_text(" ".join((ban or e["phrase"]).split()))
        if phrase is None or phrase in out:
            continue
        problem = phrase_problem(phrase)
        if problem is not None:
            raise PhraseError(where, f"phrases[{k}].{'ban_phrase' if ban else 'phrase'}", problem)
        out[phrase] = None
        if top and len(out) >= top:
            break
    if not out:
        of = "" if wanted is None else f" of kind {kind}"
        raise PhraseError(where, "phrases", f"no usable phrase{of} (entries of two or more words)"
                          + ("" if wanted is None else "; --kind any takes every kind"))
    return tuple(out)


def parse_phrases(lines: Sequence[str], where="phrases") -> tuple[str, ...]:
    """One phrase per line (whitespace collapsed; blank lines and '#' lines skipped): a phrase
    listed twice, too long or holding a control character is refused naming its line. Linear in
    the lines (a dict finds the duplicates)."""
    out: dict[str, int] = {}           # phrase -> its line, in order
    for no, line in enumerate(lines, 1):
        phrase = " ".join(line.split())
        if not phrase or phrase.startswith("#"):
            continue
        problem = phrase_problem(phrase)
        if problem is not None:
            raise PhraseError(where, f"line {no}", problem)
        if phrase in out:
            raise PhraseError(where, f"line {no}", f"phrase {phrase!r} is listed twice (first on line {out[phrase]})")
        out[phrase] = no
    if not out:
        raise PhraseError(where, "phrases", "no phrases (expected one banned phrase per line)")
    return tuple(out)


def phrase_forms(phrase: str, capitalized: bool) -> tuple[str, ...]:
    """The phrase as written, and with its first letter capitalized when asked (if different)."""
    forms = [phrase]
    cap = phrase[:1].upper() + phrase[1:]
    if capitalized and cap != phrase:
        forms.append(cap)
    return tuple(forms)


def split_last_word(phrase: str) -> tuple[str, str] | None:
    """("you can", " use") for "you can use"; None for a one-word phrase (it has no prefix)."""
    head, sep, last = phrase.rpartition(" ")
    return (head, sep + last) if sep and head and last else None


def is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def ends_at_boundary(b: bytes) -> bool:
    """True when text ending in bytes `b` ends in a boundary character (not a letter, digit or
    underscore; an incomplete UTF-8 sequence is not a boundary)."""
    if not b:
        return False
    ch = b[-4:].decode("utf-8", errors="replace")[-1:]
    return ch != "\ufffd" and not is_word_char(ch)


def starts_word(b: bytes, word: bytes) -> bool:
    """`b` starts with `word`, followed by a boundary character or nothing."""
    if not b.startswith(word):
        return False
    rest = b[len(word):len(word) + 4].decode("utf-8", errors="ignore")
    return not rest or not is_word_char(rest[0])


def text_occurrences(text: str, phrases: Sequence[str], capitalized: bool = True) -> list[int]:
    """Per phrase, how often it occurs in `text` as whole words (same forms and boundary rule)."""
    out = []
    for p in phrases:
        alts = "|".join(re.escape(f) for f in phrase_forms(p, capitalized))
        out.append(len(re.findall(rf"(?<!\w)(?:{alts})(?!\w)", text)))
    return out


class TokenBytes:
    """Token id -> the bytes it stands for, control tokens -> b"" (they never match text); and,
    built on first use, the inverse index bytes -> ids over the whole table. `table` is a
    solvers.tail.TokenTable (or anything with `types`, `token_bytes(i)` and `len`)."""

    def __init__(self, table):
        self.table = table
        self._types = getattr(table, "types", None)
        self._bytes: dict[int, bytes] = {}
        self._index: dict[bytes, tuple[int, ...]] | None = None
        self.max_len = 0

    def __call__(self, i: int) -> bytes:
        b = self._bytes.get(i)
        if b is None:
            control = self._types is not None and self._types[i] == TOKEN_CONTROL
            b = b"" if control else self.table.token_bytes(i)
            self._bytes[i] = b
        return b

    def text(self, ids) -> bytes:
        """The bytes of a token stream, a control token read as b"\\x00" (a boundary, no word)."""
        return b"".join(self(int(i)) or b"\x00" for i in ids)

    def index(self) -> dict[bytes, tuple[int, ...]]:
        if self._index is None:
            found: dict[bytes, list[int]] = {}
            every = getattr(self.table, "byte_strings", None)       # a TokenTable keeps them for every reader
            if every is None:
                every = [self.table.token_bytes(i) for i in range(len(self.table))]
            types = self._types
            for i, b in enumerate(every):
                if b and (types is None or types[i] != TOKEN_CONTROL):
                    found.setdefault(b, []).append(i)
            self._index = {b: tuple(ids) for b, ids in found.items()}
            self.max_len = max((len(b) for b in self._index), default=0)
        return self._index


def tokenizations(text: bytes, tb: TokenBytes, limit: int = 100_000) -> tuple[tuple[int, ...], ...]:
    """Every segmentation of `text` into tokens of the table (reference; raises past `limit`)."""
    index = tb.index()
    n = len(text)
    tails: list[list[tuple[int, ...]]] = [[] for _ in range(n + 1)]
    tails[n] = [()]
    for i in range(n - 1, -1, -1):
        for j in range(i + 1, min(n, i + tb.max_len) + 1):
            for tok in index.get(text[i:j], ()):
                tails[i].extend((tok,) + rest for rest in tails[j])
        if len(tails[i]) > limit:
            raise PhraseError("tokenizations", repr(text), f"more than {limit} segmentations")
    return tuple(sorted(tails[0]))


def canonical(text: bytes, tb: TokenBytes) -> tuple[int, ...] | None:
    """The segmentation with the fewest tokens (ties: the longest first token), or None."""
    index = tb.index()
    n = len(text)
    best: list[tuple[int, ...] | None] = [None] * (n + 1)
    best[n] = ()
    for i in range(n - 1, -1, -1):
        for j in range(min(n, i + tb.max_len), i, -1):
            ids = index.get(text[i:j])
            if ids and best[j] is not None and (best[i] is None or 1 + len(best[j]) < len(best[i])):
                best[i] = (ids[0],) + best[j]
    return best[0]


@dataclass(frozen=True)
class Span:
    """Rows [first_row, stop) of one token stream to match in (a document, a reply)."""

    first_row: int
    stop: int


@dataclass(frozen=True)
class Form:
    """One text a phrase is matched as (the phrase as written or capitalized), and its prefix."""

    phrase: int
    text: bytes
    prefix: bytes | None      # without the last word (None: a one-word phrase)
    word: bytes | None        # the last word with its leading space


def forms(phrases: Sequence[str], capitalized: bool) -> tuple[Form, ...]:
    out = []
    for pi, phrase in enumerate(phrases):
        for f in phrase_forms(phrase, capitalized):
            split = split_last_word(f)
            out.append(Form(pi, f.encode("utf-8"), None if split is None else split[0].encode("utf-8"),
                            None if split is None else split[1].encode("utf-8")))
    return tuple(out)


class PhraseMatcher:
    """Finds contexts (FTPO positions) and prefix positions by walking back from a row."""

    def __init__(self, phrases: Sequence[str], tb: TokenBytes, capitalized: bool = True):
        self.phrases, self.tb = tuple(phrases), tb
        self.forms = forms(phrases, capitalized)
        self._finals = {f.text[-1:] for f in self.forms}

    def match_row(self, tokens, t: int, next_tok: int, start: int) -> tuple[int, tuple[int, ...]] | None:
        """(phrase, tuple) of the longest tuple matching at row t (document rows from `start`)."""
        if next_tok < 0:
            return None
        yb = self.tb(int(next_tok))
        if not yb:
            return None
        best = None
        for f in self.forms:
            if len(f.text) <= len(yb) or not f.text.endswith(yb):
                continue
            seq = self.walk(tokens, t, start, f.text[:-len(yb)])
            if seq is not None and (best is None or len(seq) + 1 > len(best[1])):
                best = (f.phrase, tuple(seq) + (int(next_tok),))
        return best

    def walk(self, tokens, t: int, start: int, rem: bytes) -> list[int] | None:
        """The tokens (in order) that spell `rem` ending at row t and starting at a word boundary,
        the context token included for a bare start; None when they do not."""
        seq: list[int] = []
        i = t
        while rem:
            if i < start:
                return None
            tok = int(tokens[i])
            b = self.tb(tok)
            if not b:
                return None
            if rem.endswith(b):
                rem = rem[:-len(b)]
            elif b.endswith(rem):                       # merged: the phrase starts inside this token
                seq.append(tok)
                return seq[::-1] if ends_at_boundary(b[:-len(rem)]) else None
            else:
                return None
            seq.append(tok)
            i -= 1
        if i < start or not ends_at_boundary(self.tb(int(tokens[i]))):
            return None
        seq.append(int(tokens[i]))                      # bare: the context token joins the tuple
        return seq[::-1]

    def find(self, tokens, next_, docs) -> list[tuple[int, int, tuple[int, ...]]]:
        """[(row, phrase, tuple)] over `docs` (objects with first_row and stop)."""
        tokens, next_ = np.asarray(tokens), np.asarray(next_)
        out = []
        for d in docs:
            for t in range(d.first_row, d.stop):
                y = int(next_[t])
                if y < 0 or self.tb(y)[-1:] not in self._finals:
                    continue
                hit = self.match_row(tokens, t, y, d.first_row)
                if hit is not None:
                    out.append((t, hit[0], hit[1]))
        return out

    def prefix_at(self, tokens, t: int, start: int) -> tuple[int, ...]:
        """The phrases whose prefix ("you can" of "you can use") ends at row t."""
        found = []
        for f in self.forms:
            if f.prefix is not None and f.phrase not in found and self.walk(tokens, t, start, f.prefix) is not None:
                found.append(f.phrase)
        return tuple(found)

    def continues(self, following: bytes, phrase: int) -> bool:
        """Whether text `following` a prefix of `phrase` starts with its last word, as a word."""
        return any(f.phrase == phrase and f.word is not None and starts_word(following, f.word)
                   for f in self.forms)
