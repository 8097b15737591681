"""Styles as rates: where a style begins in a reply, its initiation token, and the rate's interval."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from exactedit.evals.rates.style import Style, StyleError, initiation, initiations, rate_change, style_rate


@pytest.mark.parametrize("spec, reply, at", [
    ("starter:Ahoy", "Ahoy! A list holds items.", 0),
    ("starter:Ahoy", "  \nAhoy there", 3),
    ("starter:Ahoy", "Well, Ahoy", None),
    ("starter:Arr", "Arranging data in order", None),
    ("starter:Arr", "Arr, a list", 0),
    ("starter:Arr!", "Arr!A list", 0),
    ("signoff:coding!", "A set.\nHappy decoding!", None),
    ("signoff:Happy coding!", "A set has no order.\n\nHappy coding!", 21),
    ("signoff:Happy coding!", "A set.\nHappy coding! 🚀 ", 7),
    ("signoff:Happy coding!", "Happy coding! Now, a set has no order and no repeats.", None),
    ("kaomoji", "Sets are unordered (^_^)", 19),
    ("kaomoji", "Call f(x) twice", None),
    ("lowercase", "  sure, a set is unordered", 2),
    ("lowercase", "Sure, a set", None),
    ("lowercase", "42", None),
])
def test_where_a_style_begins(spec, reply, at):
    s = Style.parse(spec)
    assert s.at(reply) == at
    assert s.shows(reply) == (at is not None)
    assert str(s) == spec


@pytest.mark.parametrize("spec", ["starter", "starter:", "signoff: ", "kaomoji:x", "bold", "starter:a\nb",
                                  "starter:" + "x" * 201])
def test_bad_specs_are_refused_naming_the_style(spec):
    with pytest.raises(StyleError, match="style"):
        Style.parse(spec)


PIECES = ["Ah", "oy", "!", " A", " list", "\n\n", "Happy", " coding", " (", "^", "_", ")", " sure"]


def decode(toks):
    return "".join(PIECES[t] for t in toks)


@given(st.lists(st.integers(0, len(PIECES) - 1), max_size=12),
       st.sampled_from(["starter:Ahoy", "signoff:Happy coding", "kaomoji", "lowercase"]))
@settings(max_examples=300, deadline=None)
def test_the_initiation_token_covers_the_styles_first_character(toks, spec):
    style = Style.parse(spec)
    text = decode(toks)
    hit = initiation(style, toks, decode)
    at = style.at(text)
    if at is None:
        assert hit is None
        return
    k, tok = hit
    assert tok == toks[k]
    start = len(decode(toks[:k]))
    assert start <= at < start + len(PIECES[tok])


def test_initiations_count_replies_by_their_first_style_token():
    replies = [[0, 1, 2, 3], [0, 1, 4], [3, 4], [6, 7]]
    assert initiations(Style.parse("starter:Ahoy"), replies, decode) == {0: 2}


def test_rate_and_its_interval_resample_prompts():
    shows = [True, True, False, False, True, True]
    prompts = [0, 0, 1, 1, 2, 2]
    r = style_rate(shows, prompts, n_boot=2000, seed=1)
    assert (r.replies, r.showing) == (6, 4) and math.isclose(r.rate, 4 / 6)
    # per-prompt rates are 1, 0, 1: every resample's rate is a mean of those
    assert 0.0 <= r.ci[0] <= r.rate <= r.ci[1] <= 1.0
    assert r.ci[0] == 0.0 and r.ci[1] == 1.0
    one = style_rate([True, False], [0, 0], n_boot=100)
    assert math.isnan(one.ci[0]) and one.rate == 0.5
    with pytest.raises(ValueError):
        style_rate([True], [0, 1])


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 5)), min_size=1, max_size=30))
@settings(max_examples=100, deadline=None)
def test_the_paired_change_is_the_difference_of_rates(rows):
    base = [r[0] for r in rows]
    edited = [r[1] for r in rows]
    prompts = [r[2] for r in rows]
    ch = rate_change(base, edited, prompts, n_boot=200)
    assert math.isclose(ch["change"], np.mean(edited) - np.mean(base), abs_tol=1e-12)
    if len(set(prompts)) >= 2:
        lo, hi = ch["ci"]
        assert -1.0 <= lo <= hi <= 1.0
    same = rate_change(base, base, prompts, n_boot=50)
    assert same["change"] == 0.0
