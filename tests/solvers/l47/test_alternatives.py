"""Alternatives that read as language: the rejected token's case / spacing / same-text variants are
never raised (they count as rejected), and an alternative needs a base-probability floor."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.solvers.l47.alternatives import choose, floor_warnings, is_variant
from exactedit.solvers.l47.config import WfldError


@pytest.mark.parametrize("cand, rej, want", [
    (b" Example", b" example", True),     # case
    (b"example", b" example", True),      # spacing
    (b"EXAMPLE", b" example", True),
    (b"\nexample", b" example", True),
    (b" example", b" example", True),     # same text, another id
    (b" ex", b" example", True),          # a prefix: another tokenization spells it on
    (b"Ex", b" example", True),
    (b" simple", b" example", False),
    (b" examples", b" example", True),    # an extension: "Here's an examples" still reads the phrase
    (b" exam", b" example", True),
    (b" use", b" used", True),
    (b" ", b" example", False),           # no text after stripping
    (b"", b" example", False),            # a special token
    (b" use", b" utilize", False),
    (b" An", b" an", True),               # case of a short word
    (b" a", b" an", False),               # a one-letter prefix is its own word ("Here's a ...")
    (b" another", b" an", False),         # extensions of a two-letter word are other words
    (b" and", b" an", False),
    (b" e", b" example", False),
])
def test_is_variant(cand, rej, want):
    assert is_variant(cand, rej) is want


TEXT = {0: b" example", 1: b" Example", 2: b"example", 3: b" simple", 4: b" instance", 5: b"<sp>",
        6: b" ex", 7: b" illustration", 8: b" idea"}


def _case(probs: dict[int, float]):
    ids = np.array([sorted(probs, key=lambda i: -probs[i])])
    logits = np.log(np.array([[probs[i] for i in ids[0]]]))
    return ids, logits, np.zeros(1)


def test_choose_holds_variants_and_applies_the_floor():
    ids, logits, lse = _case({0: 0.6, 1: 0.1, 4: 0.08, 2: 0.05, 5: 0.04, 6: 0.03, 7: 0.02, 3: 0.001, 8: 0.0005})
    tb = lambda i: b"" if i == 5 else TEXT[i]  # noqa: E731 - 5 is special
    a = choose(ids, logits, lse, [0], specials=[5], k=3, floor=0.01, token_bytes=tb)
    assert a.ids.tolist() == [[4, 7, -1]]           # " simple" (0.001) is below the floor
    np.testing.assert_allclose(a.p_alt[0, :2], [0.08, 0.02])
    assert sorted(a.variants[0].tolist()) == [1, 2, 6]  # case, spacing, prefix variants: not raised
    assert not a.below_floor[0]
    b = choose(ids, logits, lse, [0], specials=[5], k=3, floor=0.0, token_bytes=tb)
    assert b.ids.tolist() == [[4, 7, 3]]


def test_choose_keeps_one_alternative_below_the_floor():
    ids, logits, lse = _case({0: 0.97, 1: 0.02, 3: 0.006, 8: 0.004})
    a = choose(ids, logits, lse, [0], specials=[], k=2, floor=0.01, token_bytes=TEXT.__getitem__)
    assert a.ids.tolist() == [[3, -1]] and a.below_floor[0]
    (w,) = floor_warnings(a, ["Here's an example"], 0.01)
    assert "1 of 1 positions" in w and "Here's an example" in w
    with pytest.raises(WfldError, match="no candidate"):
        choose(ids[:, :2], logits[:, :2], lse, [0], specials=[], k=2, floor=0.01, token_bytes=TEXT.__getitem__)


def test_same_sense_words_are_held_at_their_phrase_only():
    """" instance" named as a paraphrase of " example" for the first position's phrase: held with the
    rejected token there (as a variant, never raised); the second position's phrase names none."""
    from exactedit.solvers.l47.alternatives import same_sense_ids

    ids, logits, lse = _case({0: 0.6, 4: 0.1, 7: 0.08, 8: 0.05, 3: 0.04})
    ids, logits, lse = np.repeat(ids, 2, 0), np.repeat(logits, 2, 0), np.zeros(2)
    tb = TEXT.__getitem__
    held = same_sense_ids(["Instance"], tb, len(TEXT))
    assert held == {4}                                # up to case and leading whitespace
    a = choose(ids, logits, lse, [0, 0], specials=[5], k=2, floor=0.01, token_bytes=tb, same_sense=[held, frozenset()])
    assert a.ids.tolist() == [[7, 8], [4, 7]]
    assert a.variants[0].tolist() == [4] and a.variants[1].tolist() == [-1]


def test_same_sense_config_parses_and_refuses_bad_input():
    from exactedit.solvers.l47.config import WfldConfig, parse_same_sense

    assert parse_same_sense("you can use = utilize, employ") == ("you can use", ("utilize", "employ"))
    for bad in ("you can use", "=utilize", "you can use=,"):
        with pytest.raises(ValueError, match="PHRASE=WORD"):
            parse_same_sense(bad)
    cfg = WfldConfig(same_sense=(("you can use", ("utilize",)),))
    assert WfldConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="given twice"):
        WfldConfig(same_sense=(("a b", ("c",)), ("a b", ("d",))))
