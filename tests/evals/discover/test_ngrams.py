"""N-gram counts of both corpora: the numpy orders against a plain-Python count of the same
definition (hypothesis), case folded at sentence starts only (names and "I" kept), texts per gram,
the written form and an occurrence's characters."""
from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactedit.evals.discover.ngrams import (char_span, count_grams, encode, gram_table, occurrences,
                                             written_form)
from exactedit.evals.discover.tokens import sentences


def _starts(sent, i):
    return i == 0 or sent[i - 1] in ("(", ":")


def brute(model: list[str], human: list[str], n: int) -> tuple[dict, dict]:
    """{gram: (model count, human count)} and {gram: (model texts, human texts)}, by the definition:
    sentences of tokens; a Titlecase sentence-initial token counts lowercase-first unless the written
    form is more common mid-sentence than the folded one, or is the pronoun I."""
    docs = [[[t[0] for t in s] for s in sentences(x)] for x in model + human]
    mid = Counter(tok for d in docs for s in d for i, tok in enumerate(s) if not _starts(s, i))

    def key(s, i):
        tok = s[i]
        if _starts(s, i) and tok[:1].isupper() and tok[1:] == tok[1:].lower() and not (tok == "I" or tok[:2] == "I'"):
            folded = tok[0].lower() + tok[1:]
            if mid[folded] >= mid[tok]:
                return folded
        return tok

    counts, texts = Counter(), Counter()
    for d, doc in enumerate(docs):
        side = 0 if d < len(model) else 1
        seen = set()
        for s in doc:
            keys = [key(s, i) for i in range(len(s))]
            for i in range(len(keys) - n + 1):
                g = tuple(keys[i:i + n])
                counts[g, side] += 1
                seen.add(g)
        for g in seen:
            texts[g, side] += 1
    grams = {g for g, _ in counts}
    return ({g: (counts[g, 0], counts[g, 1]) for g in grams}, {g: (texts[g, 0], texts[g, 1]) for g in grams})


PIECES = ["Here's", "here's", ":", "an", "example", "The", "the", "I", "i", "Python", "python", "a", "b", "IBM",
          ".", ",", "!", "?", "—", "...", "(", ")", "\n", "\n\n", "\n- ", "\n# ", "\"", "**", "e.g.", "don't",
          "`x`", "\n```\ncode here\n```\n"]
texts = st.lists(st.lists(st.sampled_from(PIECES), max_size=40).map(" ".join), min_size=1, max_size=4)


@given(texts, texts)
@example(["Here's an example. here's an example"], ["Python is. I think Python"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_counts_equal_the_plain_definition(model, human):
    stream = encode(model, human)
    levels = count_grams(stream, 4)
    for n in range(1, 5):
        want, want_texts = brute(model, human, n)
        got = gram_table(stream, levels, n) if n <= len(levels) else {}
        assert got == want, n
        if got:
            lv = levels[n - 1]
            keys = list(gram_table(stream, levels, n))
            got_texts = {g: (int(a), int(b)) for g, a, b in zip(keys, lv.model_docs, lv.human_docs)}
            assert got_texts == want_texts, n


def test_a_phrase_at_a_sentence_start_and_inside_one_is_one_phrase():
    stream = encode(["Here's an example. So here's an example.", "- Here's an example\n\n\"Here's an example"],
                    ["the end"])
    table = gram_table(stream, count_grams(stream, 3), 3)
    assert table[("here's", "an", "example")] == (4, 0)
    assert ("Here's", "an", "example") not in table
    stream = encode(["Note: Here's an example. (Here's an example)"], ["the end"])     # clause starts
    table = gram_table(stream, count_grams(stream, 3), 3)
    assert table[("here's", "an", "example")] == (2, 0)
    stream = encode(["so Here's an example. Here's an example"], ["the end"])     # mid-sentence capital kept
    table = gram_table(stream, count_grams(stream, 3), 3)
    assert table[("Here's", "an", "example")] == (2, 0)


def test_no_gram_crosses_a_sentence_end_but_the_final_mark_ends_one():
    stream = encode(["It was the end. To be clear, the end. to be"], ["x y"])
    table = gram_table(stream, count_grams(stream, 2), 2)
    assert ("end", "to") not in table and ("end", ".") in table and table[("end", ".")] == (2, 0)


def test_names_and_i_keep_their_capital_at_a_sentence_start():
    stream = encode(["Python is fast. I like Python. I do. I'm here.", "However, the end. however"],
                    ["We use Python daily."])
    table = gram_table(stream, count_grams(stream, 1), 1)
    assert table[("Python",)] == (2, 1) and ("python",) not in table
    assert table[("I",)] == (2, 0) and ("i",) not in table and table[("I'm",)] == (1, 0)
    assert table[("however",)] == (2, 0) and ("However",) not in table
    assert table[("we",)] == (0, 1)           # no mid-sentence form either way: folded


def test_written_form_is_the_most_frequent_and_spans_point_at_the_text():
    model = ["end—to one. end — to two.", "say end—to three. \u201cEnd\u2014to\u201d four"]
    stream = encode(model, ["nothing here"])
    levels = count_grams(stream, 3)
    lv = levels[2]
    table = list(gram_table(stream, levels, 3))
    g = table.index(("end", "—", "to"))
    pos = occurrences(stream, lv, [g])[g]
    assert len(pos) == 4 and written_form(stream, 3, pos) == "end—to"
    d = int(stream.doc[pos[-1]])
    s, e = char_span(stream, model[d], int(pos[-1]), 3)
    assert model[d][s:e] == "End\u2014to"
    assert int(lv.first[g]) == int(pos[0]) and int(lv.model_docs[g]) == 2


def test_words_and_tokens_per_side():
    stream = encode(["One, two. Three!"], ["four five"])
    assert (stream.words(True), stream.tokens(True), stream.words(False), stream.tokens(False)) == (3, 6, 2, 2)
    assert np.all(stream.key[stream.surface < 0] == -1)
