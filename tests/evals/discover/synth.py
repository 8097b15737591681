"""Synthetic corpora with phrases planted at known rates, for the discovery tests.

Sentences are random draws of common English words at their English frequencies (wordfreq's list),
so a "human-like" corpus and a "model" corpus drawn with another seed differ by chance alone; plants
are phrases inserted into a sentence with a given probability, between two drawn words (or first,
where the sentence's capital letter lands on the phrase; or last, before its final mark). `corpus` returns the texts
and how many times each phrase was planted, the number discover must find.
"""
from __future__ import annotations

from collections import Counter
from functools import cache

import numpy as np


@cache
def _words() -> tuple[tuple[str, ...], np.ndarray]:
    from wordfreq import top_n_list, word_frequency

    words = tuple(w for w in top_n_list("en", 2000) if w.isalpha() and len(w) > 1 or w in ("a", "i"))
    p = np.array([word_frequency(w, "en") for w in words])
    return words, p / p.sum()


def corpus(seed: int, docs: int, plants: dict[str, float] = {}, sentences: int = 8,  # noqa: B006
           every_doc: dict[str, int] = {}) -> tuple[list[str], Counter]:  # noqa: B006
    """`docs` texts of `sentences` sentences; plants[phrase] = probability per sentence;
    every_doc[phrase] = copies put into the first text only. Returns (texts, planted counts)."""
    words, p = _words()
    rng = np.random.default_rng(seed)
    planted: Counter = Counter()
    texts = []
    for d in range(docs):
        out = []
        for _ in range(sentences):
            drawn = [str(w) if w != "i" else "I" for w in rng.choice(words, int(rng.integers(6, 16)), p=p)]
            slots: list[list[str]] = [[] for _ in range(len(drawn) + 1)]     # plants go between drawn words,
            for phrase, rate in plants.items():                            # never inside another plant
                if rng.random() < rate:
                    slots[int(rng.integers(0, len(slots)))] += phrase.split()
                    planted[phrase] += 1
            sent = [w for i, slot in enumerate(slots) for w in slot + drawn[i:i + 1]]
            text = " ".join(sent)
            out.append(text[0].upper() + text[1:] + str(rng.choice([".", ".", ".", "?", "!"])))
        if d == 0:
            for phrase, copies in every_doc.items():
                out += [f"So {phrase} again." for _ in range(copies)]
                planted[phrase] += copies
        texts.append(" ".join(out))
    return texts, planted
