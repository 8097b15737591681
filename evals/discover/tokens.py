"""Text -> sentences of word and punctuation tokens, the units `discover` counts n-grams over.

    sentences(text) -> list[list[Tok]]      Tok = (surface, start, end, space)

`start`/`end` are character offsets into `text` (curly quotes are normalized character for
character, so offsets stay valid); `space` says whether whitespace separates the token from the one
before it in its sentence (how a phrase is written back: "end—to" or "end — to").

Tokens:
- a word: letters and digits, joined inside by an apostrophe, a hyphen, a dot or an underscore
  ("Here's", "don't", "end-to-end", "3.14", "e.g", "snake_case"); a known abbreviation takes its
  final dot ("e.g.", "Dr.", "etc.") and ends no sentence;
- a symbol: an emoji or a dingbat ("🚀", "✅"), one per character;
- punctuation, kept as tokens: , ; : ( ) — – and runs of - (one to three), . ! ? and their runs
  ("?!"), an ellipsis ("..." or "…", both written "…").
Every other character (quotes, markdown's * _ # ~ and brackets, slashes, ...) is dropped: it is not
a token and separates nothing, so "**Note**", '"Note' and "Note" are the same word.

Sentences (no n-gram crosses a boundary):
- a sentence-final token (. ! ? … or a run of them) ends its sentence unless a letter or digit
  follows it at once ("end. To" is two sentences; the final token is the last of the first);
- a blank line ends a paragraph; a single newline inside a paragraph is a soft wrap and joins;
- a block line is its own sentence run: a list item (- * + • 1. 1) and task boxes), a heading (#),
  a blockquote (>), a table row (|, each cell a boundary) or a line wholly in bold; its markers are
  dropped;
- fenced code blocks (``` or ~~~) are skipped; inline code, URLs and HTML-like tags are boundaries;
  horizontal rules and table separator rows are skipped; a "sentence" of punctuation alone is dropped.
"""
from __future__ import annotations

import re

Tok = tuple[str, int, int, bool]

# curly quotes and apostrophes -> straight ones (one character each: offsets stay valid)
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'",
                         "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"'})

_TOKEN = re.compile(r"""
    (?P<url>(?:https?|ftp)://[^\s<>()\[\]"'`]*[^\s<>()\[\]"'`.,;:!?]|www\.[^\s<>()\[\]"'`]*[^\s<>()\[\]"'`.,;:!?])
  | (?P<code>`[^`\n]+`)
  | (?P<tag></?[A-Za-z][\w:-]*(?:\s[^<>\n]{0,200})?/?>)
  | (?P<word>[^\W_]+(?:['\-._][^\W_]+)*)
  | (?P<sym>[\u2600-\u27bf\U0001f000-\U0001faff])
  | (?P<punct>[.!?…]*[!?][.!?…]*|\.{2,}|…|[.,;:()\u2014\u2013]|-{1,3})
  | (?P<cell>\|)
""", re.VERBOSE)

_FENCE = re.compile(r" {0,3}(?:`{3,}|~{3,})")
_RULE = re.compile(r"\s*(?:(?:[-*_=]\s*){3,}|\|?(?:\s*:?-+:?\s*\|)+\s*:?-*:?\s*\|?)\s*")
_MARKER = re.compile(r"\s*(?:#{1,6}(?=\s)|>|[-*+•](?=\s)|\d{1,3}[.)](?=\s)|\[[ xX]\](?=\s))\s*")
_BOLD_LINE = re.compile(r"\s*(?:\*\*|__)[^\n]+(?:\*\*|__)\s*:?\s*")

#: tokens that may end a sentence; a token made only of these characters is sentence-final
FINAL_CHARS = frozenset(".!?…")
#: punctuation tokens (every token that is neither a word nor a symbol is one of these shapes)
_PUNCT = re.compile(r"[.!?…]+|[,;:()\u2014\u2013]|-{1,3}")
#: lowercase abbreviations that take their final dot and end no sentence
ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "cf", "approx",
                           "fig", "eq", "al", "e.g", "i.e", "resp"})


def normalize(text: str) -> str:
    """Curly quotes and apostrophes made straight (character for character)."""
    return text.translate(_QUOTES)


def is_punct(tok: str) -> bool:
    return _PUNCT.fullmatch(tok) is not None


def is_final(tok: str) -> bool:
    return bool(tok) and all(c in FINAL_CHARS for c in tok)


def _is_abbreviation(word: str) -> bool:
    low = word.lower()
    return low in ABBREVIATIONS or (len(low) > 2 and "." in low and all(len(p) == 1 for p in low.split(".")))


class _Splitter:
    """Collects the sentences of one text: tokens go into the open sentence, boundaries close it. A
    sentence-final token closes its sentence at the next token, unless that is a ")" right after it
    ("(see above.) Then": the parenthesis stays with its sentence)."""

    def __init__(self, text: str):
        self.text = text
        self.out: list[list[Tok]] = []
        self.cur: list[Tok] = []
        self.ending = False

    def close(self) -> None:
        if any(not is_punct(t[0]) for t in self.cur):      # a run of punctuation alone is no sentence
            self.out.append(self.cur)
        self.cur = []
        self.ending = False

    def line(self, lo: int, hi: int) -> None:
        """Tokens of text[lo:hi] appended to the open sentence (closing it where a boundary falls)."""
        text = self.text
        for m in _TOKEN.finditer(text, lo, hi):
            kind = m.lastgroup
            if kind in ("url", "code", "tag", "cell"):
                self.close()
                continue
            s, e = m.span()
            tok = text[s:e]
            prev_end = self.cur[-1][2] if self.cur else None
            if self.ending:
                if tok == ")" and prev_end == s:
                    self.cur.append((tok, s, e, False))
                    self.close()
                    continue
                self.close()
                prev_end = None
            if kind == "punct":
                if tok != "." and set(tok) <= {".", "…"}:
                    tok = "…"
                if tok == "." and prev_end == s and _is_abbreviation(self.cur[-1][0]):
                    w = self.cur[-1]
                    self.cur[-1] = (w[0] + ".", w[1], e, w[3])
                    continue
            self.cur.append((tok, s, e, prev_end is not None and _has_space(text[prev_end:s])))
            if kind == "punct" and is_final(tok) and not (e < len(text) and text[e].isalnum()):
                self.ending = True


def _has_space(gap: str) -> bool:
    """Whether the characters between two tokens hold whitespace (usually just " ")."""
    return gap == " " or (bool(gap) and (gap.isspace() or gap.strip() != gap or any(c.isspace() for c in gap)))


def sentences(text: str) -> list[list[Tok]]:
    """The sentences of `text` (after `normalize`), each a list of (surface, start, end, space)."""
    text = normalize(text)
    sp = _Splitter(text)
    fence = False
    pos = 0
    for raw in text.splitlines(keepends=True):
        lo, pos = pos, pos + len(raw)
        line = raw.rstrip("\r\n")
        hi = lo + len(line)
        if _FENCE.match(line):
            sp.close()
            fence = not fence
            continue
        if fence:
            continue
        if not line.strip() or _RULE.fullmatch(line):
            sp.close()
            continue
        start = lo
        while (m := _MARKER.match(text, start, hi)) is not None and m.end() > start:
            start = m.end()              # "> - [ ] item": every marker dropped
        if start > lo or line.lstrip().startswith("|") or _BOLD_LINE.fullmatch(line):
            sp.close()                   # a block line: its own run of sentences
            sp.line(start, hi)
            sp.close()
        else:
            sp.line(lo, hi)              # a paragraph's line (a single newline is a soft wrap)
    sp.close()
    return sp.out
