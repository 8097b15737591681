"""Variant artefacts in free generation: a banned phrase's last word coming back as its own case or
spacing variant ("Here's an Example", "Here's anexample", "you can  use"), the visible sign that an
edit raised the rejected token's twins instead of real alternatives (SPEC.md section 7).

A variant is found in decoded text where the phrase's prefix (as written, or capitalized) starts at a
word boundary and is followed by the last word in any form that is not the phrase itself: other
letter case, no space, or more than one space. Pure string functions; tests in
tests/evals/rates/test_artefacts.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from exactedit.solvers.phrases import phrase_forms, split_last_word

__all__ = ["Artefact", "variant_artefacts"]


@dataclass(frozen=True)
class Artefact:
    phrase: str
    reply: int          # index into the texts
    at: int             # character offset of the prefix
    found: str          # the text from the prefix to the end of the variant word


def _pattern(prefix: str, last: str) -> re.Pattern:
    """prefix, then optional whitespace, then `last` in any case, ending at a word boundary; the
    prefix starts at a word boundary."""
    return re.compile(r"(?<![\w])" + re.escape(prefix) + r"(\s*)(" + re.escape(last.strip()) + r")(?!\w)",
                      re.IGNORECASE)


def variant_artefacts(texts: Sequence[str], phrases: Sequence[str], capitalized: bool = True) -> list[Artefact]:
    """Every case or spacing variant of each phrase's last word after its prefix in `texts`."""
    out = []
    for phrase in phrases:
        cut = split_last_word(phrase)
        if cut is None:
            continue
        prefix, last = cut
        exact = {form for form in phrase_forms(phrase, capitalized)}
        prefixes = {split_last_word(f)[0] for f in exact if split_last_word(f)}
        for pre in sorted(prefixes):
            pat = _pattern(pre.rstrip(), last)
            for i, text in enumerate(texts):
                for m in pat.finditer(text):
                    if text[m.start():m.start() + len(pre)] != pre:   # the prefix's own case must match
                        continue
                    found = m.group(0)
                    if found in exact:
                        continue
                    out.append(Artefact(phrase, i, m.start(), found))
    return out
