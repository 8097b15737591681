"""Which tokens an FTPO target raises, and which it holds.

At an FTPO position the rejected token y should drop; the freed mass should go to words that
read as language there, not to another spelling of y. Measured on Qwen, raising the position's
plain top tokens gave "Here's an Example", "Here's anexample" (y's own case and spacing
variants) and "Here's an simple" (a word with almost no base probability after the prefix).
So, per position, from the base distribution's top tokens:
- variants of y: tokens whose text equals y's up to case and leading whitespace (" example",
  "example", " Example", "EXAMPLE", and other ids with y's own bytes), is a proper, non-empty
  prefix of it so normalized (" ex", "Ex": another tokenization spells y on), or extends it
  (" examples": the text still reads the phrase, "Here's an examples"; measured on Qwen as the
  best sub-floor candidate after "Here's an"). They would continue the phrase, so they count as
  rejected: never raised, and each moves with the rejected token (the same logit change, so it
  keeps its base ratio to it). Holding their logits still instead would hand them the freed mass
  in proportion: where p(y) = 0.999, a variant at 5e-5 would rise to ~3%;
- same-sense words: tokens the user names as the rejected word's paraphrases for one phrase
  ("you can use" -> " utilize": measured on Qwen as the best raised alternative at 3 of 7
  positions, "you can utilize" the same slop). Matched up to case and leading whitespace, and
  treated as variants: never raised, each moving with the rejected token;
- alternatives: the `k` highest-logit tokens that are neither y, a variant nor special, and have
  base probability >= `floor` there. The best such token is kept even below the floor (the mass
  has to go somewhere: the position is marked), the others are dropped, so a position may raise
  fewer than k (padded with -1).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from exactedit.solvers.l47.config import WfldError


class Alternatives(NamedTuple):
    """Per FTPO position (P of them): what is raised and which variants move with the rejected
    token. -1 / NaN pad."""

    ids: np.ndarray          # int64 [P, k] raised alternatives, by decreasing base logit
    p_alt: np.ndarray        # float64 [P, k] their base probabilities
    variants: np.ndarray     # int64 [P, m] variants of the rejected token among the candidates
    p_var: np.ndarray        # float64 [P, m]
    below_floor: np.ndarray  # bool [P]: the only alternative is below the floor


def normalized(text: bytes) -> str:
    """A token's text for the variant test: UTF-8 (invalid bytes kept distinct), leading
    whitespace stripped, case folded."""
    return text.decode("utf-8", errors="surrogateescape").lstrip().casefold()


MIN_PREFIX = 2       # a one-letter prefix (" a" of " an") is a word of its own, not a spelling on
MIN_EXTENDED = 3     # extensions of a word this short (" an" -> " and", " another") are other words


def is_variant(candidate: bytes, rejected: bytes) -> bool:
    """Same text as the rejected token up to case and leading whitespace, a prefix of it (at least
    MIN_PREFIX characters), or an extension of it (when it has at least MIN_EXTENDED), so
    normalized: a spelling whose text would still read the phrase."""
    c, r = normalized(candidate), normalized(rejected)
    if not c or not r:
        return False
    if c == r:
        return True
    return (r.startswith(c) and len(c) >= MIN_PREFIX) or (c.startswith(r) and len(r) >= MIN_EXTENDED)


def same_sense_ids(words: Sequence[str], token_bytes, vocab: int) -> frozenset[int]:
    """Every token whose text is one of `words` up to case and leading whitespace."""
    want = {normalized(w.encode("utf-8")) for w in words}
    return frozenset(i for i in range(vocab) if normalized(token_bytes(i)) in want)


def choose(topk_ids, topk_logits, lse, rejected, specials: Sequence[int], k: int, floor: float,
           token_bytes, same_sense: Sequence[frozenset[int]] | None = None) -> Alternatives:
    """Alternatives and the rejected token's variants from a vocab pass's top tokens (`topk_ids` / `topk_logits`
    [P, m] by decreasing logit, `lse` [P]); `token_bytes(id) -> bytes` (b"" for specials);
    `same_sense[p]`: ids held as variants at position p (the phrase's same-sense words)."""
    ids = np.asarray(topk_ids, dtype=np.int64)
    logits = np.asarray(topk_logits, dtype=np.float64)
    lse = np.asarray(lse, dtype=np.float64)
    rejected = np.asarray(rejected, dtype=np.int64)
    P, m = ids.shape
    if k < 1:
        raise WfldError("mining", "alternatives", f"k must be >= 1, got {k}")
    if not 0.0 <= floor < 1.0:
        raise WfldError("mining", "alternatives", f"the base-probability floor must be in [0, 1), got {floor}")
    banned = {int(s) for s in specials}
    out = np.full((P, k), -1, np.int64)
    p_out = np.full((P, k), np.nan)
    variants, below = [], np.zeros(P, dtype=bool)
    for p in range(P):
        y = int(rejected[p])
        yb = token_bytes(y)
        alts, hv = [], []
        for tok, lg in zip(ids[p], logits[p]):
            tok = int(tok)
            if tok == y or tok in banned:
                continue
            prob = float(np.exp(lg - lse[p]))
            if is_variant(token_bytes(tok), yb) or (same_sense is not None and tok in same_sense[p]):
                hv.append((tok, prob))
            elif len(alts) < k and (prob >= floor or not alts):
                alts.append((tok, prob))
        if not alts:
            raise WfldError("mining", "alternatives", f"position {p}: no candidate in the top {m} tokens is "
                            "neither the rejected token, a variant of it nor special (raise the pool)")
        below[p] = len(alts) == 1 and alts[0][1] < floor
        out[p, :len(alts)] = [a for a, _ in alts]
        p_out[p, :len(alts)] = [q for _, q in alts]
        variants.append(hv)
    width = max((len(v) for v in variants), default=0)
    var_ids = np.full((P, width), -1, np.int64)
    var_p = np.full((P, width), np.nan)
    for p, hv in enumerate(variants):
        if hv:
            var_ids[p, :len(hv)] = [t for t, _ in hv]
            var_p[p, :len(hv)] = [q for _, q in hv]
    return Alternatives(out, p_out, var_ids, var_p, below)


def floor_warnings(alts: Alternatives, phrase_names, floor: float) -> list[str]:
    """One warning per phrase with positions whose best alternative is below the floor: there the
    rejected token is near-certain, and whatever takes its mass is a token the model gives < floor
    (an artefact in generation, e.g. "Here's an simple" where p(" example") = 0.999)."""
    out = []
    for name in dict.fromkeys(phrase_names):
        sel = np.array([n == name for n in phrase_names])
        bad = int(np.sum(alts.below_floor[sel]))
        if bad:
            out.append(f"phrase {name!r}: {bad} of {int(sel.sum())} positions have no alternative with base "
                       f"probability >= {floor:g} (the rejected token is near-certain there; what replaces it "
                       "is a token the model barely gives, an artefact risk; consider banning the phrase's "
                       "prefix instead)")
    return out


def raised_table(alts: Alternatives, where, phrase_names, rejected, cond_index, base_logits, logits,
                 lse, name) -> list[dict]:
    """What was raised and moved with the rejected token where: per FTPO position {trace, row,
    phrase, rejected, p_rej, raised: [{token, p_base, dlogit}], variants: [...], below_floor}.
    `cond_index(p, kind, j)` gives the condition index of the position's j-th alternative /
    variant (or None),
    `base_logits` / `logits` the conditions' exact logits before and after, `name(id)` a token's
    text, `lse` [P] the base log-partition (p_rej = exp(base rejected logit - lse))."""
    out = []
    for p, (trace, row) in enumerate(where):
        item = {"trace": trace, "row": int(row), "phrase": phrase_names[p], "rejected": name(int(rejected[p])),
                "below_floor": bool(alts.below_floor[p])}
        k0 = cond_index(p, "rejected", 0)
        item["p_rej"] = float(np.exp(base_logits[k0] - lse[p])) if k0 is not None else None
        item["rej_dlogit"] = float(logits[k0] - base_logits[k0]) if k0 is not None else None
        for key, ids, probs in (("raised", alts.ids, alts.p_alt), ("variants", alts.variants, alts.p_var)):
            cells = []
            for j, tok in enumerate(ids[p]):
                if tok < 0:
                    continue
                ci = cond_index(p, key, j)
                cells.append({"token": name(int(tok)), "p_base": float(probs[p, j]),
                              "dlogit": float(logits[ci] - base_logits[ci]) if ci is not None else None})
            item[key] = cells
        out.append(item)
    return out
