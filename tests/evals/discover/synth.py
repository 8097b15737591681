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


#: the subjects of `chats`: each prompt is about one; its replies use its words
TOPICS = {
    "baking": "sourdough flour oven dough yeast loaf crust starter knead bake".split(),
    "travel": "itinerary passport airline luggage hostel train visa museum beach ferry".split(),
    "finance": "budget savings mortgage interest invoice pension taxes index fund loan".split(),
    "gardening": "tomato compost seedlings soil mulch pruning roses watering greenhouse weeds".split(),
    "fitness": "squats cardio protein workout stretching treadmill muscles reps marathon hydration".split(),
    "music": "guitar chords melody rhythm tempo piano scales chorus amplifier metronome".split(),
    "history": "empire treaty medieval dynasty revolution archives monarchy battle colonial parliament".split(),
    "astronomy": "telescope galaxy nebula orbit planets eclipse comet constellation asteroid lunar".split(),
}
ASKS = ("How do I get started with {a} and {b}?", "What should I know about {a} before trying {b}?",
        "Can you explain {a} and {b} to a beginner?", "What is the best way to handle {a} with {b}?")


def chats(seed: int, prompts: int, replies: int, words: int, plants: dict[str, int],
          topic_share: float = 0.12) -> tuple[list[tuple[str, str]], Counter]:
    """(prompt, reply) pairs: `prompts` prompts over TOPICS in turn, each with `replies` replies,
    about `words` words in all. A reply's sentences are common English words at their frequencies,
    a share `topic_share` of them replaced by its topic's words; plants[phrase] = exact copies, each
    put into a reply drawn at random (between two words of a sentence). Returns (pairs, planted)."""
    common, p = _words()
    rng = np.random.default_rng(seed)
    names = list(TOPICS)
    asks = []
    for i in range(prompts):
        topic = TOPICS[names[i % len(names)]]
        a, b = rng.choice(topic, 2, replace=False)
        asks.append((ASKS[int(rng.integers(len(ASKS)))].format(a=a, b=b), topic))
    per_reply = words / (prompts * replies)
    pairs, bodies = [], []
    for prompt, topic in asks:
        for _ in range(replies):
            sents, n = [], 0
            while n < per_reply:
                k = int(rng.integers(6, 16))
                drawn = [str(w) if w != "i" else "I" for w in rng.choice(common, k, p=p)]
                drawn = [str(rng.choice(topic)) if rng.random() < topic_share else w for w in drawn]
                sents.append(drawn)
                n += k
            pairs.append(prompt)
            bodies.append(sents)
    planted: Counter = Counter()
    for phrase, copies in plants.items():
        for _ in range(copies):
            sents = bodies[int(rng.integers(len(bodies)))]
            sent = sents[int(rng.integers(len(sents)))]
            at = int(rng.integers(0, len(sent) + 1))
            sent[at:at] = phrase.split()
            planted[phrase] += 1
    out = []
    for prompt, sents in zip(pairs, bodies):
        text = " ".join(" ".join(s)[:1].upper() + " ".join(s)[1:] + str(rng.choice([".", ".", "?", "!"]))
                        for s in sents)
        out.append((prompt, text))
    return out, planted


def prose(seed: int, words: int, plants: dict[str, int] = {}) -> list[str]:  # noqa: B006
    """The user's own writing: paragraphs of common English words (about `words` in all), with
    plants[phrase] copies of the user's own phrases."""
    texts, _ = corpus(seed, max(1, words // 90), sentences=8)
    rng = np.random.default_rng(seed + 1)
    texts = [t.split() for t in texts]
    for phrase, copies in plants.items():
        for _ in range(copies):
            t = texts[int(rng.integers(len(texts)))]
            at = int(rng.integers(1, len(t)))
            t[at:at] = phrase.split()
    return [" ".join(t) for t in texts]
