"""Two corpora (model text, human text) -> one token stream -> n-gram counts of every order at once.

    encode(model_texts, human_texts, progress=None) -> Stream
    count_grams(stream, max_len) -> list[Level]          Level n-1 holds the n-grams
    gram_table(stream, levels, n) -> {key tokens: (model, human)}
    occurrences(stream, level, ids) -> {id: positions}   where the model wrote each gram
    written_form(stream, n, positions) -> str            the most frequent written form
    char_span(stream, text, pos, n) -> (start, end)      an occurrence's characters in its text

The stream holds the model's texts first, then the human ones, each text's sentences (tokens.py)
separated by -1, so no n-gram crosses a sentence or a text. Every token has a surface id (as
written, quotes normalized) and a key id (what is counted). The key folds case at a clause start
only (a sentence's first token, or one right after "(" or ":" as in "Note: Here's"): a Titlecase
token there ("Here's", "However") counts as its lowercase-first form, unless the capitalized form
is more common than the folded one in mid-sentence (a name: "Python"); the pronoun I ("I", "I'm")
never folds. Nothing else changes case, so "Here's an example" opening a sentence and "here's an
example" inside one are one phrase, and "US" is never "us".

Orders are built one on another: the n-gram starting at position i is the pair (its first n-1
tokens' id at order n-1, the key of token i+n-1), and np.unique numbers the pairs. Counts, the
number of texts holding each gram, and its first position (the model's side comes first) are kept
per order; the id arrays stay, so any occurrence's sub-grams are one lookup away.
"""
from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from exactedit.evals.discover.tokens import is_punct, sentences

#: a token right after one of these starts a clause (its case folds as at a sentence start)
CLAUSE_OPENERS = frozenset({"(", ":"})


@dataclass(frozen=True)
class Stream:
    """Model text then human text as one token stream (-1 between sentences)."""

    key: np.ndarray          # int32 [L]: key token id, -1 at a boundary
    surface: np.ndarray      # int32 [L]: surface token id, -1 at a boundary
    space: np.ndarray        # bool [L]: whitespace before the token (inside its sentence)
    doc: np.ndarray          # int32 [L]: index of the text the token is in (-1 at a boundary)
    doc_start: np.ndarray    # int64 [D]: first position of each text
    split: int               # positions below `split` are model text
    model_docs: int          # texts below this index are the model's
    keys: tuple[str, ...]
    surfaces: tuple[str, ...]

    def words(self, model: bool) -> int:
        """Word tokens (not punctuation) on one side: the base of the per-1,000 rates."""
        part = self.key[:self.split] if model else self.key[self.split:]
        part = part[part >= 0]
        punct = np.fromiter((is_punct(k) for k in self.keys), bool, len(self.keys))
        return int(part.size - punct[part].sum())

    def tokens(self, model: bool) -> int:
        part = self.key[:self.split] if model else self.key[self.split:]
        return int((part >= 0).sum())


@dataclass(frozen=True)
class Level:
    """The n-grams of one order n."""

    n: int
    ids: np.ndarray          # int32 [L]: id of the n-gram starting at each position, -1 where none
    prefix: np.ndarray       # int64 [T]: id at order n-1 of the first n-1 tokens (-1 at order 1)
    last: np.ndarray         # int64 [T]: key id of the last token
    first: np.ndarray        # int64 [T]: first position (a model position when the model has it)
    model: np.ndarray        # int64 [T]: occurrences in the model's text
    human: np.ndarray        # int64 [T]: occurrences in the human text
    model_docs: np.ndarray   # int64 [T]: model texts holding it
    human_docs: np.ndarray   # int64 [T]: human texts holding it


def _fold(tok: str) -> str:
    """"Here's" -> "here's"; anything not Titlecase ("IBM", "iPhone", "the", ",") and the pronoun I
    ("I", "I'm", "I've") unchanged."""
    if tok == "I" or tok.startswith("I'"):
        return tok
    if len(tok) > 0 and tok[0].isupper() and tok[1:] == tok[1:].lower():
        return tok[0].lower() + tok[1:]
    return tok


def encode(model_texts: Sequence[str], human_texts: Sequence[str],
           progress: Callable[[int, int], None] | None = None) -> Stream:
    """Tokenize every text (model first), number surfaces, then fold sentence starts into keys."""
    vocab: dict[str, int] = {}
    surf, start, space, doc = array("i"), array("b"), array("b"), array("i")
    doc_start = []
    texts = list(model_texts) + list(human_texts)
    split = 0
    for d, text in enumerate(texts):
        if d == len(model_texts):
            split = len(surf)
        doc_start.append(len(surf))
        for sent in sentences(text):
            for i, (tok, _, _, sp) in enumerate(sent):
                sid = vocab.setdefault(tok, len(vocab))
                surf.append(sid)
                start.append(i == 0 or sent[i - 1][0] in CLAUSE_OPENERS)
                space.append(sp)
                doc.append(d)
            surf.append(-1)
            start.append(0)
            space.append(0)
            doc.append(-1)
        if progress is not None:
            progress(d + 1, len(texts))
    if len(model_texts) == len(texts):
        split = len(surf)
    surface = np.frombuffer(surf, np.int32).copy()
    starts = np.frombuffer(start, np.int8).astype(bool)
    surfaces = tuple(vocab)
    key_mid, key_start, keys = _fold_keys(surface, starts, surfaces, vocab)
    valid = surface >= 0
    key = np.full(surface.shape, -1, np.int32)
    key[valid] = np.where(starts[valid], key_start[surface[valid]], key_mid[surface[valid]])
    return Stream(key, surface, np.frombuffer(space, np.int8).astype(bool), np.frombuffer(doc, np.int32).copy(),
                  np.asarray(doc_start, np.int64), split, len(model_texts), keys, surfaces)


def _fold_keys(surface, starts, surfaces, vocab):
    """Per surface id its key in mid-sentence (itself) and at a sentence start (folded unless the
    capitalized form is at least as common mid-sentence as the folded one)."""
    valid = surface >= 0
    mid = np.bincount(surface[valid & ~starts], minlength=len(surfaces))
    keys: dict[str, int] = {}
    key_mid = np.empty(len(surfaces), np.int32)
    key_start = np.empty(len(surfaces), np.int32)
    for sid, tok in enumerate(surfaces):
        key_mid[sid] = keys.setdefault(tok, len(keys))
        folded = _fold(tok)
        fid = vocab.get(folded)
        fold = folded != tok and (0 if fid is None else mid[fid]) >= mid[sid]
        key_start[sid] = keys.setdefault(folded, len(keys)) if fold else key_mid[sid]
    return key_mid, key_start, tuple(keys)


def count_grams(stream: Stream, max_len: int) -> list[Level]:
    """Counts of the n-grams of orders 1..max_len (fewer when no sentence is that long)."""
    key = stream.key.astype(np.int64)
    n_keys = max(len(stream.keys), 1)
    levels: list[Level] = []
    prev = None
    for n in range(1, max_len + 1):
        m = len(key) - n + 1
        if m <= 0:
            break
        if prev is None:
            pos = np.flatnonzero(key >= 0)
            pair = key[pos]
        else:
            pos = np.flatnonzero((prev[:m] >= 0) & (key[n - 1:] >= 0))
            pair = prev[pos].astype(np.int64) * n_keys + key[pos + n - 1]
        if pos.size == 0:
            break
        levels.append(_level(stream, n, pos, pair, n_keys))
        prev = levels[-1].ids
    return levels


def _level(stream: Stream, n: int, pos: np.ndarray, pair: np.ndarray, n_keys: int) -> Level:
    uniq, first, inv = np.unique(pair, return_index=True, return_inverse=True)
    t = uniq.size
    ids = np.full(stream.key.shape, -1, np.int32)
    ids[pos] = inv
    model_side = pos < stream.split
    n_docs = max(len(stream.doc_start), 1)
    doc_pairs = _distinct(inv.astype(np.int64) * n_docs + stream.doc[pos])
    gram, text = doc_pairs // n_docs, doc_pairs % n_docs
    in_model = text < stream.model_docs
    return Level(
        n=n, ids=ids,
        prefix=uniq // n_keys if n > 1 else np.full(t, -1, np.int64),
        last=uniq % n_keys if n > 1 else uniq,
        first=pos[first],
        model=np.bincount(inv[model_side], minlength=t),
        human=np.bincount(inv[~model_side], minlength=t),
        model_docs=np.bincount(gram[in_model], minlength=t),
        human_docs=np.bincount(gram[~in_model], minlength=t))


def _distinct(x: np.ndarray) -> np.ndarray:
    """The sorted distinct values of x (np.unique's sort path; its hash path is slower here)."""
    x = np.sort(x)
    return x[np.concatenate(([True], x[1:] != x[:-1]))] if x.size else x


def gram_table(stream: Stream, levels: Sequence[Level], n: int) -> dict[tuple[str, ...], tuple[int, int]]:
    """Every gram of order n as its key tokens -> (model count, human count) (for reports and tests)."""
    lv = levels[n - 1]
    cols, ids = [], np.arange(lv.model.size)
    for k in range(n, 0, -1):
        cols.append(levels[k - 1].last[ids])
        ids = levels[k - 1].prefix[ids]
    keys = np.stack(cols[::-1], axis=1)
    return {tuple(stream.keys[t] for t in row): (int(m), int(h)) for row, m, h in zip(keys, lv.model, lv.human)}


def written(tokens: Sequence[str], spaces: Sequence[bool]) -> str:
    """Tokens joined as written: a space before a token where the text had whitespace."""
    out = tokens[0] if tokens else ""
    for tok, sp in zip(tokens[1:], spaces):
        out += (" " if sp else "") + tok
    return out


def occurrences(stream: Stream, level: Level, ids) -> dict[int, np.ndarray]:
    """Model positions of each gram of `ids` (of the level's order), in text order."""
    want = np.asarray(sorted({int(i) for i in ids}), np.int64)
    model_ids = level.ids[:stream.split]
    pos = np.flatnonzero(np.isin(model_ids, want))
    found = model_ids[pos]
    return {int(g): pos[found == g] for g in want}


def written_form(stream: Stream, n: int, positions) -> str:
    """The most frequent written form of an n-gram over its positions (the earliest on a tie)."""
    forms: Counter = Counter()
    for p in positions:
        forms[(tuple(int(s) for s in stream.surface[p:p + n]), tuple(bool(x) for x in stream.space[p + 1:p + n]))] += 1
    (toks, spaces), _ = forms.most_common(1)[0]
    return written([stream.surfaces[t] for t in toks], spaces)


def char_span(stream: Stream, text: str, pos: int, n: int) -> tuple[int, int]:
    """Character offsets in `text` (the text the position lies in) of the n tokens from `pos`: the
    text is tokenized again, one separator after each sentence as in the stream."""
    flat: list = []
    for sent in sentences(text):
        flat += sent
        flat.append(None)
    k = pos - int(stream.doc_start[stream.doc[pos]])
    return flat[k][1], flat[k + n - 1][2]
