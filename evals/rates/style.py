"""A reply style as a rate in free generation, and the one token that starts it.

A `Style` is what a persona shows in its replies, as a rule over a reply's text:
- `starter:TEXT`: the reply (leading whitespace skipped) begins with TEXT as whole words (a starter
  "Arr" is not shown by "Arranging");
- `signoff:TEXT`: TEXT is the reply's last words (at most `SIGNOFF_TAIL` characters after it), not
  the end of a longer word;
- `kaomoji`: the reply holds a kaomoji (`KAOMOJI`);
- `lowercase`: the reply's first letter is lowercase.
`Style.at(text)` is the character offset where the style begins in a reply (None: the reply does not
show it). The *initiation* token is the reply token whose text covers that offset: the one decision
a head edit can teach (source documents, seeds/000 section 8.4), not the glyphs after it, which the
model completes by itself once it has started.

Each kind has its *decision* rows (`DECISION`, a `dumps.format` role name): a starter and lowercase
are decided at the reply's first token (`step0`), a sign-off and a kaomoji at its end (`reply_end`,
the row where an unedited reply stops). `paragraph_hits` counts where a reply shows the style out of
its place: a starter opening a later paragraph, a sign-off closing an earlier one.

`style_rate` is the share of replies that show the style, with a percentile bootstrap interval
over prompts (a prompt's replies are not independent), and `rate_change` the paired difference of
two sides answering the same prompts with the same seeds.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

KAOMOJI = re.compile(r"[(（][^()（）\n]{0,8}[\^＾ω・ᴗ◕‿°ᵕ•ﾟ▽´`ｰ][^()（）\n]{0,8}[)）]|[ヽ╯ツ٩۶]")
KINDS = ("starter", "signoff", "kaomoji", "lowercase")
DECISION = {"starter": "step0", "lowercase": "step0", "signoff": "reply_end", "kaomoji": "reply_end"}
_BLANK_LINES = re.compile(r"\n[ \t]*\n")
RULES_VERSION = 2         # bumped when what a style matches changes (2: starters and sign-offs as whole words)
SIGNOFF_TAIL = 8          # characters a sign-off may be followed by (punctuation, an emoji, a space)
MAX_STYLE_TEXT = 200      # a starter or sign-off longer than this is refused (it is a spec, not a text)
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")   # C0, DEL, C1 controls; lone surrogates

__all__ = ["DECISION", "KAOMOJI", "KINDS", "RULES_VERSION", "Style", "StyleError", "StyleRate", "initiation", "initiations", "rate_change",
           "style_rate"]


class StyleError(ValueError):
    """A style spec that cannot be read."""


def _runs_on(a: str, b: str) -> bool:
    """Whether characters a then b are inside one word (both letters or digits): a starter "Arr"
    is not shown by "Arranging", nor a sign-off "coding!" by "decoding!"."""
    return bool(a) and bool(b) and a.isalnum() and b.isalnum()


@dataclass(frozen=True)
class Style:
    kind: str
    text: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise StyleError(f"style {self.kind!r}: expected one of {', '.join(KINDS)} "
                             "(starter:TEXT, signoff:TEXT, kaomoji, lowercase)")
        if self.kind in ("starter", "signoff"):
            if not self.text.strip():
                raise StyleError(f"style {self.kind}: needs its text, as {self.kind}:TEXT")
            if len(self.text) > MAX_STYLE_TEXT or "\n" in self.text:
                raise StyleError(f"style {self.kind}: the text must be one line of at most {MAX_STYLE_TEXT} characters")
            bad = _UNPRINTABLE.search(self.text)
            if bad is not None:         # no reply shows it, and no UTF-8 report could hold a surrogate
                what = "a lone surrogate" if "\ud800" <= bad.group() <= "\udfff" else "a control character"
                raise StyleError(f"style {self.kind}: the text holds {what} ({ascii(bad.group())} at character "
                                 f"{bad.start()})")
        elif self.text:
            raise StyleError(f"style {self.kind}: takes no text (got {self.text!r})")

    @classmethod
    def parse(cls, spec: str) -> "Style":
        """`starter:TEXT`, `signoff:TEXT`, `kaomoji` or `lowercase`."""
        kind, sep, text = str(spec).partition(":")
        return cls(kind.strip(), text if sep else "")

    def __str__(self) -> str:
        return f"{self.kind}:{self.text}" if self.text else self.kind

    def at(self, reply: str) -> int | None:
        """Character offset in `reply` where the style begins, or None when the reply lacks it."""
        if self.kind == "starter":
            body = reply.lstrip()
            whole = body.startswith(self.text) and not _runs_on(self.text[-1], body[len(self.text):len(self.text) + 1])
            return len(reply) - len(body) if whole else None
        if self.kind == "signoff":
            end = len(reply.rstrip())
            i = reply.rfind(self.text, 0, end)
            whole = i >= 0 and not _runs_on(reply[i - 1:i], self.text[0])
            return i if whole and end - (i + len(self.text)) <= SIGNOFF_TAIL else None
        if self.kind == "kaomoji":
            m = KAOMOJI.search(reply)
            return m.start() if m else None
        i = next((k for k, c in enumerate(reply) if c.isalpha()), None)
        return i if i is not None and reply[i].islower() else None

    def shows(self, reply: str) -> bool:
        return self.at(reply) is not None

    @property
    def decision(self) -> str:
        """The role name (`dumps.format.ROLE_NAMES`) of the rows where the style is decided."""
        return DECISION[self.kind]

    def paragraph_hits(self, reply: str) -> int:
        """Paragraphs (split at blank lines, empty ones left out) showing the style out of its place:
        a starter at the start of any but the first, a sign-off or a kaomoji at the end of (for a
        kaomoji: anywhere in) any but the last; 0 for lowercase."""
        paras = [p for p in _BLANK_LINES.split(reply) if p.strip()]
        if self.kind == "starter":
            return sum(self.at(p) is not None for p in paras[1:])
        if self.kind in ("signoff", "kaomoji"):
            return sum(self.at(p) is not None for p in paras[:-1])
        return 0


def initiation(style: Style, tokens: Sequence[int], decode: Callable[[Sequence[int]], str]) -> tuple[int, int] | None:
    """(position in `tokens`, token id) of the reply token whose text covers the style's first
    character, or None when the decoded reply does not show the style. `decode` is the model's
    detokenizer (a token's text is the growth of the decoded prefix, so merged bytes count right)."""
    toks = [int(t) for t in tokens]
    at = style.at(decode(toks))
    if at is None:
        return None
    for k in range(len(toks)):
        if len(decode(toks[:k + 1])) > at:
            return k, toks[k]
    return None


def initiations(style: Style, replies: Sequence[Sequence[int]], decode) -> Counter:
    """Initiation token id -> how many replies start the style with it."""
    return Counter(hit[1] for r in replies if (hit := initiation(style, r, decode)) is not None)


@dataclass(frozen=True)
class StyleRate:
    """Share of replies showing the style, and its bootstrap interval over prompts."""

    replies: int
    showing: int
    rate: float
    ci: tuple[float, float]

    def to_dict(self) -> dict:
        return {"replies": self.replies, "showing": self.showing, "rate": self.rate, "ci": list(self.ci)}


def _by_prompt(shows: Sequence[bool], prompts: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = sorted(set(int(p) for p in prompts))
    idx = {k: i for i, k in enumerate(keys)}
    p = np.array([idx[int(x)] for x in prompts], dtype=np.int64)
    hits = np.bincount(p, weights=np.asarray(shows, dtype=np.float64), minlength=len(keys))
    counts = np.bincount(p, minlength=len(keys)).astype(np.float64)
    return hits, counts, np.arange(len(keys))


def _draws(n: int, n_boot: int, seed: int) -> np.ndarray:
    from exactedit.evals.scoring.bootstrap import resample_weights

    return resample_weights([np.arange(n)], n, n_boot, seed)


def _pct(vals: np.ndarray, level: float) -> tuple[float, float]:
    vals = vals[np.isfinite(vals)]
    if not len(vals):
        return (math.nan, math.nan)
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(vals, [a, 1.0 - a])
    return (float(lo), float(hi))


def style_rate(shows: Sequence[bool], prompts: Sequence[int], *, n_boot: int = 1000, level: float = 0.95,
               seed: int = 0) -> StyleRate:
    """The share of replies showing the style; the interval resamples prompts (`prompts[i]` is
    reply i's prompt). No interval (NaN) with n_boot 0 or fewer than two prompts."""
    if len(shows) != len(prompts):
        raise ValueError(f"{len(shows)} replies but {len(prompts)} prompt indices")
    n = len(shows)
    k = int(sum(bool(s) for s in shows))
    if n == 0:
        return StyleRate(0, 0, math.nan, (math.nan, math.nan))
    hits, counts, _ = _by_prompt(shows, prompts)
    ci = (math.nan, math.nan)
    if n_boot > 0 and len(counts) >= 2:
        w = _draws(len(counts), n_boot, seed)
        ci = _pct((w @ hits) / (w @ counts), level)
    return StyleRate(n, k, k / n, ci)


def rate_change(base: Sequence[bool], edited: Sequence[bool], prompts: Sequence[int], *, n_boot: int = 1000,
                level: float = 0.95, seed: int = 0) -> dict:
    """edited rate - base rate over the same replies' prompts (paired: the same prompt draws for
    both sides), with its interval."""
    if not len(base) == len(edited) == len(prompts):
        raise ValueError("base, edited and prompts must be the same replies")
    b, e = style_rate(base, prompts, n_boot=0), style_rate(edited, prompts, n_boot=0)
    ci = (math.nan, math.nan)
    hb, counts, _ = _by_prompt(base, prompts)
    he, _, _ = _by_prompt(edited, prompts)
    if n_boot > 0 and len(counts) >= 2:
        w = _draws(len(counts), n_boot, seed)
        ci = _pct((w @ he - w @ hb) / (w @ counts), level)
    return {"change": e.rate - b.rate, "ci": list(ci)}
