"""What an antislop run's files and settings cannot give, found before any generation, beside the
model and phrase checks of runs/loop/preflight.py (and refused in its one error):

- `file_problems(cfg, phrases)`: the settings that need their files read: solve wfld's settings
  for every edit kind the run solves (`AntislopConfig.wfld_config`, the same-sense file parsed),
  and the same-sense phrases among the run's phrases (`solve wfld` refuses any other, after the
  data stage's generation); and the corpus stage's settings (`AntislopConfig.corpus_config`).
- `word_uses(cfg, phrases)`: where each banned word's ordinary uses will come from before the
  model's own replies add theirs, so a word that bar (d) will not measure is named before the
  run, not after it. A use is the word after a space, not followed by a letter or digit, and not
  the end of a banned phrase (the phrase matcher's whole-word occurrences, solvers/phrases.py);
  counted on the text, not the tokens, so an estimate: the tokenizer may cut a longer word
  (" snippets") into the word and more. Dev (the strength's choice) gets uses from the held-out
  replies and the corpus's dev part only; the collateral (bar (d)) from the collateral replies,
  the corpus's collateral part and about a third of the texts' uses (runs/data/dataset.py deals
  the text chunks holding a use to collateral, train and anchors in turn). Each corpus part's
  uses are those in its source documents (the corpus's split, runs/data/corpus.py) up to what its
  token budget can window when shared by the words. A word with fewer than the bars' minimum
  (`Bars.collateral_min_uses`) on dev or in the collateral is warned about: unless the replies
  use it, its phrase's strength is limited (`WfldConfig.unmeasured_strength`) and its bar (d)
  fails as not measured; the run still ships.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from exactedit.errors import ExacteditError, FieldError
from exactedit.runs.antislop.config import CORPUS_AFTER, AntislopConfig, AntislopError
from exactedit.runs.loop.preflight import Problem

TEXT_SHARE = 3      # one in three text chunks holding a use goes to the collateral (dataset.text_sets)

__all__ = ["UsesCheck", "WordUses", "count_uses", "file_problems", "word_uses"]


def file_problems(cfg: AntislopConfig, phrases: Sequence[str]) -> list[Problem]:
    """The settings read from files, checked as the solve stage will use them, and the corpus
    stage's settings built as it builds them (module doc)."""
    out: list[Problem] = []
    if cfg.corpus_tokens:
        try:
            cfg.corpus_config()
        except ExacteditError as exc:
            out.append(Problem("settings", "corpus_context", f"the corpus stage's settings: {exc}"))
    for key in cfg.keys():
        try:
            wcfg = cfg.wfld_config(key)
        except (AntislopError, ExacteditError, OSError, UnicodeDecodeError) as exc:
            out.append(Problem(str(cfg.same_sense or "settings"), f"solve wfld --key {key}", str(exc)))
            continue
        unknown = [p for p, _ in wcfg.same_sense if p not in phrases]
        if unknown:
            out.append(Problem(str(cfg.file("same_sense")), "same_sense", f"{unknown} are not phrases of the run "
                               f"({len(phrases)} phrases): the solve holds a phrase's paraphrases, so each must "
                               "name one of them"))
            break
    return out


def count_uses(text: str, word: str, phrases: Sequence[str], capitalized: bool = True) -> int:
    """Ordinary uses of `word` (with its leading space, " use") in `text`: its whole-word
    occurrences after a space, less the occurrences of the `phrases` that end in it."""
    from exactedit.solvers.phrases import text_occurrences

    n = len(re.findall(re.escape(word) + r"(?!\w)", text))
    return max(0, n - sum(text_occurrences(text, list(phrases), capitalized)))


@dataclass(frozen=True)
class WordUses:
    """One banned word (a phrase's last word after a space) and its uses found before generation."""

    word: str
    phrases: tuple[str, ...]
    texts: int                  # in the run's plain texts (about a third reach the collateral, none dev)
    corpus: dict                # corpus part -> uses in its source documents, at most its budget's windows
    dev: int                    # what dev gets before the held-out replies: the corpus's dev part
    collateral: int             # what the collateral gets before its replies: corpus + a third of the texts'

    def measured(self, min_uses: int) -> bool:
        return self.dev >= min_uses and self.collateral >= min_uses


@dataclass(frozen=True)
class UsesCheck:
    min_uses: int               # the bars' minimum (Bars.collateral_min_uses)
    limit: float                # the strength an unmeasured word's phrase is held to (WfldConfig)
    words: tuple[WordUses, ...]
    warnings: tuple[str, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def _words(phrases: Sequence[str]) -> dict[str, list[str]]:
    from exactedit.solvers.phrases import split_last_word

    out: dict[str, list[str]] = {}
    for p in phrases:
        split = split_last_word(" ".join(p.split()))
        if split is not None:
            out.setdefault(split[1], []).append(p)
    return out


def _texts(paths: Sequence[Path]) -> list[str]:
    """The run's plain texts, each a regular UTF-8 file within the texts' cap (FieldError naming it)."""
    from exactedit.files import MAX_TEXT_BYTES, decode_utf8, read_regular

    return [decode_utf8(read_regular(p, MAX_TEXT_BYTES, FieldError, "texts"), p, FieldError, "texts") for p in paths]


def word_uses(cfg: AntislopConfig, phrases: Sequence[str], *, corpus_sources=None, texts=None) -> UsesCheck:
    """Per banned word, its uses in the run's texts and the corpus's dev and collateral parts (see
    the module doc), and a warning per word that they do not measure. `corpus_sources` (a list of
    runs.data.corpus.Source) default to the corpus the run's corpus stage reads (the bundled general
    English and the standard library's docstrings; none with corpus_tokens 0); `texts` (strings) to the run's text files."""
    from exactedit.evals.protocol.protocol import Bars
    from exactedit.runs.data.corpus import corpus_sources as read_corpus, split_sources

    min_uses = Bars().collateral_min_uses
    limit = cfg.wfld_config(cfg.keys()[0]).unmeasured_strength
    words = _words(phrases)
    texts = _texts(cfg.text_files()) if texts is None else list(texts)
    corpus = cfg.corpus_config() if cfg.corpus_tokens else None       # corpus_tokens 0: the stage is skipped
    if corpus is None:
        corpus_sources = []
    elif corpus_sources is None:
        corpus_sources = read_corpus(corpus)
    parts = split_sources([s.name for s in corpus_sources], corpus) if corpus_sources else {}
    window = cfg.corpus_context + 1 + CORPUS_AFTER
    capitalized = corpus.capitalized if corpus is not None else True
    found, warnings = [], []
    for word, ps in words.items():
        t = sum(count_uses(x, word, ps, capitalized) for x in texts)
        by_part = {}
        for part in ("dev", "collateral"):
            budget = int(cfg.corpus_tokens * corpus.shares()[part]) if corpus is not None else 0
            n = sum(count_uses(corpus_sources[i].text, word, ps, capitalized) for i in parts.get(part, ()))
            by_part[part] = min(n, budget // (window * len(words)))
        w = WordUses(word, tuple(ps), t, by_part, by_part["dev"], by_part["collateral"] + t // TEXT_SHARE)
        found.append(w)
        if not w.measured(min_uses):
            warnings.append(_warning(w, min_uses, limit, bool(corpus_sources)))
    return UsesCheck(min_uses, limit, tuple(found), tuple(warnings))


def _warning(w: WordUses, need: int, limit: float, corpus: bool) -> str:
    src = "the corpus (the bundled general English and the standard library's docstrings)" if corpus else "no corpus (corpus_tokens 0)"
    fixes = []
    if w.collateral < need:
        fixes.append(f"--texts with ordinary uses of {w.word.strip()!r} (about {TEXT_SHARE * need} of them: a "
                     "third of the texts' uses go to the collateral)")
    if w.dev < need:
        fixes.append(f"data prompts whose replies use {w.word.strip()!r} ordinarily" +
                     (", or a larger --corpus-tokens" if corpus else ", or --corpus-tokens > 0"))
    return (f"{w.word!r} ({', '.join(repr(p) for p in w.phrases)}): before the model's replies, {w.dev} ordinary "
            f"uses on dev and {w.collateral} in the collateral (texts {w.texts}; {src}), fewer than {need}: unless "
            f"the replies use it, (d) cannot measure it, its phrase's strength is held to {limit:g} and its bar (d) "
            f"fails as not measured; to measure it, give " + " and ".join(fixes))
