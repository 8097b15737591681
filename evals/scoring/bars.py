"""The bars of SPEC.md section 7 as pure functions of `RowScores` and a `BarContext`.

Each bar gives `BarRow`s: (bar, number, threshold, pass) with the number of rows it stands on and a
bootstrap interval over documents. A bar with no rows to stand on has `passed = None` ("n/a"): it
never passes silently. Scopes, by the split role of each row's document:
- (a) train documents, slop positions not held out; (b) the held-out slop positions of train
  documents; (c) the documents of `heldout_role` (dev, test or blind);
- (d) `collateral` documents, legitimate uses of each word (next token = the word, not a slop
  position): a word with fewer than `collateral_min_uses` uses is not measured, and its (d) rows
  fail saying so (never a pass on two uses, never a silent n/a); (e) `anchors` documents, one row
  per domain;
- (f), (g) and the persona bars: the chat documents of `heldout_role`.
A slop position is prefix-exact: the row's tokens end with a banned phrase's prefix (within the
document) and the actual next token is its final token (the rejected token).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from exactedit.dumps.format import ROLE_REPLY, ROLE_REPLY_END
from exactedit.evals.scoring import bootstrap as bs
from exactedit.evals.protocol.protocol import Bars, ResolvedTokens
from exactedit.solvers.tail.decision import decision_rows, role_bits
from exactedit.solvers.tail.scores import RowScores, slop_positions, word_positions
from exactedit.evals.protocol.splits import Splits, same_doc_heldout

HELDOUT_ROLES = ("dev", "test", "blind")


@dataclass(frozen=True)
class BarRow:
    """One bar, named by a stable `key` (e.g. "c_reduction", "g_kld"): `number` compared with
    `threshold` by `op` (">=" or "<="). `passed` is None when there were no rows (n = 0). `ci` is
    the bootstrap interval over documents (NaN when it cannot be formed). `base` and `edited` are
    the two sides when the number compares them. A row with `gating` False is reported beside the
    bars (e.g. a persona's KL over every row, when the bar is registered off the decision rows): it
    has no `passed` and the verdict ignores it."""

    key: str
    bar: str
    label: str
    number: float
    threshold: float
    op: str
    passed: bool | None
    n: int
    ci: tuple[float, float] = (math.nan, math.nan)
    base: float = math.nan
    edited: float = math.nan
    scope: str = ""
    gating: bool = True


@dataclass(frozen=True)
class BarContext:
    """What the bars need besides RowScores: token ids, thresholds, which role is held out, and
    the rows held out for bar (b) (bool [T]; None: no same-document hold-out)."""

    tokens: ResolvedTokens
    bars: Bars
    heldout_role: str = "dev"
    heldout_b: np.ndarray | None = None
    vocab: tuple[str, ...] = ()

    def name(self, token: int) -> str:
        """A token as text for labels (repr of its text when the vocabulary is known)."""
        return repr(self.vocab[token]) if 0 <= token < len(self.vocab) else f"token {token}"

    def __post_init__(self):
        if self.heldout_role not in HELDOUT_ROLES:
            raise ValueError(f"heldout_role must be one of {HELDOUT_ROLES}, got {self.heldout_role!r}")


def _row(key, bar, label, number, threshold, op, n, ci=(math.nan, math.nan), base=math.nan, edited=math.nan,
         scope="") -> BarRow:
    if n == 0 or not np.isfinite(number):
        passed = None
    else:
        passed = bool(number >= threshold) if op == ">=" else bool(number <= threshold)
    return BarRow(key, bar, label, float(number), float(threshold), op, passed, int(n),
                  tuple(float(c) for c in ci), float(base), float(edited), scope)


def _measured(r: BarRow, label: str, min_uses: int) -> BarRow:
    """A bar (d) row on fewer than `min_uses` uses measures nothing: it fails, its label saying
    "`label` (n uses < min_uses)" (its number, where there is one, kept for the reader)."""
    if r.n >= min_uses:
        return r
    return dataclasses.replace(r, label=f"{label} ({r.n} uses < {min_uses})", passed=False)


def _docs_mask(s: RowScores, roles) -> np.ndarray:
    return np.isin(s.doc_roles(), list(roles))


def chat_docs(s: RowScores) -> np.ndarray:
    """bool [n_docs]: a document is chat when tagged "chat" or when any row predicts reply text."""
    has_reply = np.bincount(s.doc, weights=(s.roles & ROLE_REPLY) != 0, minlength=len(s.docs)) > 0
    return np.array([("chat" in d.tags) for d in s.docs], dtype=bool) | has_reply


def _strata(s: RowScores, mask: np.ndarray) -> list[np.ndarray]:
    return [np.unique(s.doc[mask])]


def _mean_bar(s: RowScores, ctx: BarContext, key, bar, label, values, mask, threshold, op, scope) -> BarRow:
    sums, counts = bs.per_doc(values, mask, s.doc, len(s.docs))
    n = int(counts.sum())
    mean = sums.sum() / n if n else math.nan
    b = ctx.bars
    ci = bs.interval(bs.ratio(sums, counts), _strata(s, mask), len(s.docs), b.bootstrap, b.ci_level, b.bootstrap_seed)
    return _row(key, bar, label, mean, threshold, op, n, ci, scope=scope)


def _reduction_bar(s: RowScores, ctx: BarContext, key, bar, label, mask, scope) -> BarRow:
    """1 - mean p'(rejected) / mean p(rejected) over the masked slop positions."""
    pb, pe = np.exp(s.logp_base), np.exp(s.logp_edit)
    sb, n = bs.per_doc(pb, mask, s.doc, len(s.docs))
    se, _ = bs.per_doc(pe, mask, s.doc, len(s.docs))
    cnt = int(n.sum())
    base, edit = (sb.sum() / cnt, se.sum() / cnt) if cnt else (math.nan, math.nan)
    red = 1.0 - edit / base if cnt and base > 0 else math.nan
    b = ctx.bars
    ci = bs.interval(lambda w: 1.0 - bs.ratio(se, sb)(w), _strata(s, mask), len(s.docs), b.bootstrap,
                     b.ci_level, b.bootstrap_seed)
    return _row(key, bar, label, red, b.slop_min_reduction, ">=", cnt, ci, base, edit, scope)


def same_doc_mask(s: RowScores, splits: Splits, phrases, keys=None) -> np.ndarray:
    """bool [T]: the slop positions of train documents that the split holds out for bar (b), per
    document and per banned word (a phrase's final token). `keys` maps a trace name to the key its
    draw is seeded with (`eval score` gives each dump's sha256, as `solve wfld` does; default: the
    name)."""
    slop = slop_positions(s, phrases)
    out = np.zeros(s.rows, dtype=bool)
    train = [i for i, d in enumerate(s.docs) if d.role == "train"]
    for trace in dict.fromkeys(s.docs[i].trace for i in train):
        in_trace = [i for i in train if s.docs[i].trace == trace]
        rows = np.flatnonzero(np.isin(s.doc, in_trace) & (slop >= 0))
        starts = {i: int(np.flatnonzero(s.doc == i)[0]) for i in in_trace}
        docs = [s.docs[int(s.doc[r])].name for r in rows]
        within = [int(r) - starts[int(s.doc[r])] for r in rows]
        words = [int(phrases[int(k)][-1]) for k in slop[rows]]
        key = (keys or {}).get(trace, trace)
        out[rows[same_doc_heldout(splits, key, docs, within, words)]] = True
    return out


def special_flips(s: RowScores, ctx: BarContext, mask: np.ndarray) -> np.ndarray:
    """bool [T]: rows in `mask` at a non-terminal position (the actual next token is known and not
    a special) whose edited argmax is a special token it was not before."""
    sp = np.asarray(ctx.tokens.specials)
    non_terminal = (s.next >= 0) & ~np.isin(s.next, sp)
    return mask & non_terminal & np.isin(s.argmax_edit, sp) & (s.argmax_edit != s.argmax_base)


def turn_end_rows(s: RowScores, ctx: BarContext) -> np.ndarray:
    """bool [T]: real assistant turn ends. Rows marked ROLE_REPLY_END; in documents whose dump
    carries no roles at all, every row whose next token is the turn end."""
    has_roles = np.bincount(s.doc, weights=s.roles != 0, minlength=len(s.docs)) > 0
    marked = (s.roles & ROLE_REPLY_END) != 0
    return np.where(has_roles[s.doc], marked, s.next == ctx.tokens.turn_end)


def _flip_and_turn_end_bars(s: RowScores, ctx: BarContext, scope_mask, prefix: str, bar: str, scope: str
                            ) -> list[BarRow]:
    b, end = ctx.bars, ctx.tokens.turn_end
    flips = special_flips(s, ctx, scope_mask)
    ends = turn_end_rows(s, ctx) & scope_mask
    lost = ends & (s.argmax_base == end) & (s.argmax_edit != end)
    return [
        _row(f"{prefix}_flips", bar, "argmax flips to specials, non-terminal rows", flips.sum(),
             b.max_special_flips, "<=", int(scope_mask.sum()), scope=scope),
        _row(f"{prefix}_turn_end_lost", bar, "turn ends lost (base argmax was the turn end)", lost.sum(),
             0, "<=", int(ends.sum()), scope=scope),
        _mean_bar(s, ctx, f"{prefix}_turn_end_dlogp", bar, "turn-end mean dlogp at real turn ends", s.dlogp,
                  ends, b.turn_end_min_dlogp, ">=", scope),
    ]


def anti_slop_bars(s: RowScores, ctx: BarContext) -> tuple[BarRow, ...]:
    """Bars (a)-(g) of SPEC.md section 7."""
    tk, b, ho = ctx.tokens, ctx.bars, ctx.heldout_role
    slop = slop_positions(s, tk.phrases)
    held_b = ctx.heldout_b if ctx.heldout_b is not None else np.zeros(s.rows, dtype=bool)
    train = _docs_mask(s, ["train"]) & (slop >= 0)
    heldout_docs = _docs_mask(s, [ho])
    at_c = heldout_docs & (slop >= 0)
    rows = [
        _reduction_bar(s, ctx, "a_reduction", "(a)", "slop p(rejected) reduction, train positions",
                       train & ~held_b, "train"),
        _reduction_bar(s, ctx, "b_reduction", "(b)", "slop p(rejected) reduction, same-document held-out",
                       train & held_b, "train"),
        _reduction_bar(s, ctx, "c_reduction", "(c)", "slop p(rejected) reduction, separate documents", at_c, ho),
    ]
    new_special = at_c & np.isin(s.argmax_edit, tk.specials) & (s.argmax_edit != s.argmax_base)
    rows.append(_row("c_new_special", "(c)", "slop positions whose new argmax is a special", new_special.sum(),
                     b.new_argmax_max_special, "<=", int(at_c.sum()), scope=ho))
    coll = _docs_mask(s, ["collateral"])
    words = word_positions(s, tk.collateral_words, slop)
    low = (s.dlogp < b.collateral_low).astype(float)
    for wi, w in enumerate(tk.collateral_words):
        m = coll & (words == wi)
        rows.append(_measured(_mean_bar(s, ctx, f"d_mean:{w}", "(d)", f"{ctx.name(w)}: mean dlogp, legitimate uses",
                                        s.dlogp, m, b.collateral_min_mean, ">=", "collateral"),
                              f"{ctx.name(w)}: not measured", b.collateral_min_uses))
        rows.append(_measured(_mean_bar(s, ctx, f"d_low:{w}", "(d)",
                                        f"{ctx.name(w)}: share of uses below {b.collateral_low}",
                                        low, m, b.collateral_max_low_share, "<=", "collateral"),
                              f"{ctx.name(w)}: share below {b.collateral_low} not measured", b.collateral_min_uses))
    for domain, m in _domains(s):
        rows.append(_mean_bar(s, ctx, f"e_kld:{domain}", "(e)", f"mean KLD vs base, domain {domain}", s.kl, m,
                              b.engine_max_kld, "<=", "anchors"))
    chat = heldout_docs & chat_docs(s)[s.doc]
    where = f"{ho} chat"
    rows += _flip_and_turn_end_bars(s, ctx, chat, "f", "(f)", where)
    rows.append(_mean_bar(s, ctx, "g_kld", "(g)", "non-slop mean KLD", s.kl, chat & (slop < 0),
                          b.chat_max_kld, "<=", where))
    rows.append(_mean_bar(s, ctx, "g_ordinary", "(g)", "ordinary-token mean dlogp", s.dlogp,
                          chat & ordinary_rows(s, ctx, slop), b.ordinary_min_dlogp, ">=", where))
    return tuple(rows)


def ordinary_rows(s: RowScores, ctx: BarContext, slop: np.ndarray) -> np.ndarray:
    """Rows whose actual next token is known, not special, not a style token, not a slop position."""
    tk = ctx.tokens
    return (s.next >= 0) & ~np.isin(s.next, tk.specials) & ~np.isin(s.next, tk.style) & (slop < 0)


def _domains(s: RowScores) -> list[tuple[str, np.ndarray]]:
    out = []
    anchors = [i for i, d in enumerate(s.docs) if d.role == "anchors"]
    for name in dict.fromkeys(s.docs[i].domain or s.docs[i].trace for i in anchors):
        ids = [i for i in anchors if (s.docs[i].domain or s.docs[i].trace) == name]
        out.append((name, np.isin(s.doc, ids)))
    return out


def style_rows(s: RowScores, ctx: BarContext) -> np.ndarray:
    """Rows whose next token is a style token inside a reply (any row, in a dump without roles)."""
    in_reply = ((s.roles & ROLE_REPLY) != 0) | (s.roles == 0)
    return np.isin(s.next, ctx.tokens.style) & in_reply


def _gain_ratio(s: RowScores, ctx: BarContext) -> BarRow:
    """Held-out / train mean dlogp on style tokens. A train gain <= 0 fails: nothing generalizes."""
    b, ho = ctx.bars, ctx.heldout_role
    style = style_rows(s, ctx)
    tr, he = _docs_mask(s, ["train"]) & style, _docs_mask(s, [ho]) & style
    st, ct = bs.per_doc(s.dlogp, tr, s.doc, len(s.docs))
    sh, ch = bs.per_doc(s.dlogp, he, s.doc, len(s.docs))
    label, scope = f"style-token gain ratio {ho}/train", f"train, {ho}"
    if not ct.sum() or not ch.sum():
        return _row("persona_ratio", "persona", label, math.nan, b.persona_min_ratio, ">=", 0, scope=scope)
    g_tr, g_ho = st.sum() / ct.sum(), sh.sum() / ch.sum()

    def stat(w):
        with np.errstate(divide="ignore", invalid="ignore"):
            gt = (w @ st) / (w @ ct)
            return np.where(gt > 0, ((w @ sh) / (w @ ch)) / gt, np.nan)

    ci = bs.interval(stat, [np.unique(s.doc[tr]), np.unique(s.doc[he])], len(s.docs), b.bootstrap,
                     b.ci_level, b.bootstrap_seed)
    n = int(ct.sum() + ch.sum())
    if g_tr <= 0:
        return BarRow("persona_ratio", "persona", label + " (train gain <= 0)", math.nan, b.persona_min_ratio,
                      ">=", False, n, ci, float(g_tr), float(g_ho), scope)
    return _row("persona_ratio", "persona", label, g_ho / g_tr, b.persona_min_ratio, ">=", n, ci,
                base=g_tr, edited=g_ho, scope=scope)


def off_decision(s: RowScores, ctx: BarContext) -> np.ndarray:
    """bool [T]: rows off the style's decision rows (`solvers.tail.decision.decision_rows` with the
    protocol's `bars.persona_decision` roles and the style tokens)."""
    return ~decision_rows(s.roles, s.next, ctx.tokens.style, role_bits(ctx.bars.persona_decision))


def _kl_pair(s: RowScores, ctx: BarContext, key: str, label: str, m: np.ndarray, scope: str) -> list[BarRow]:
    """The persona KL bar on `m`: over every row; with decision rows registered, the bar is over the
    rows off them and the all-rows mean is reported beside it (not gating)."""
    b = ctx.bars
    every = _mean_bar(s, ctx, key, "persona", label, s.kl, m, b.persona_max_kl, "<=", scope)
    if not b.persona_decision:
        return [every]
    off = _mean_bar(s, ctx, key.replace(":", "_off:", 1), "persona", f"{label}, off the decision rows "
                    f"({b.persona_decision} and style tokens)", s.kl, m & off_decision(s, ctx), b.persona_max_kl_off,
                    "<=", scope)
    return [off, dataclasses.replace(every, label=f"{label}, every row (reported)", passed=None, gating=False)]


def persona_bars(s: RowScores, ctx: BarContext) -> tuple[BarRow, ...]:
    """Persona bars: held-out/train gain ratio on style tokens, held-out, blind and anchor KL (off
    the decision rows when the protocol registers them, `off_decision`), special flips, and the turn
    end kept at real turn ends."""
    ho = ctx.heldout_role
    rows = [_gain_ratio(s, ctx)]
    for role in [ho] + (["blind"] if ho != "blind" else []):
        m = _docs_mask(s, [role])
        if role == ho or m.any():
            rows += _kl_pair(s, ctx, f"persona_kl:{role}", f"mean KL, {role} documents", m, role)
    for domain, m in _domains(s):
        rows += _kl_pair(s, ctx, f"persona_kl_anchors:{domain}", f"mean KL, anchors {domain}", m, "anchors")
    rows += _flip_and_turn_end_bars(s, ctx, _docs_mask(s, [ho]), "persona", "persona", ho)
    return tuple(rows)


@dataclass(frozen=True)
class PhraseRow:
    """Mean p(rejected) of one banned phrase, base and edited, over the slop positions of a scope."""

    phrase: int
    tokens: tuple[int, ...]
    n: int
    base: float
    edited: float
    text: str = ""


def per_phrase(s: RowScores, ctx: BarContext, roles=None) -> tuple[PhraseRow, ...]:
    roles = roles or [ctx.heldout_role]
    slop = slop_positions(s, ctx.tokens.phrases)
    scope = _docs_mask(s, roles)
    out = []
    for pi, phrase in enumerate(ctx.tokens.phrases):
        m = scope & (slop == pi)
        n = int(m.sum())
        base = float(np.exp(s.logp_base[m]).mean()) if n else math.nan
        edit = float(np.exp(s.logp_edit[m]).mean()) if n else math.nan
        text = "".join(ctx.vocab[t] for t in phrase) if ctx.vocab else ""
        out.append(PhraseRow(pi, tuple(int(t) for t in phrase), n, base, edit, text))
    return tuple(out)


def verdict(rows) -> str:
    """"pass" when every bar passed, "fail" when any failed, else "incomplete" (some bar is n/a).
    Rows reported beside the bars (`gating` False) are not bars."""
    rows = [r for r in rows if r.gating]
    if any(r.passed is False for r in rows):
        return "fail"
    return "pass" if rows and all(r.passed for r in rows) else "incomplete"
