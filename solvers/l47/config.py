"""`WfldConfig`: every knob of `solve wfld`, validated; CLI flags map 1:1 to its fields.

The solve (SPEC.md section 5) asks, at each train FTPO position, for the rejected token to end
`margin` nats below its best natural alternative, for the `alternatives` top non-rejected,
non-special tokens to rise by `delta_cho` (> 0: the freed mass goes to real words, not to the turn
end), and for the special-token logits to stay where they were (at target rows and at the
`special_rows` most at-risk anchor rows). Among all edits that do this, it takes the one with the
least energy on the anchors' hh (covariance + `ridge`), with dW h = 0 exactly on the span of each
banned word's legitimate uses (at most `null_rank` directions per word). `gn_iters` Gauss-Newton
rounds re-linearize the head at the edit as shipped, until the exact logits move less than
`gn_tol` between rounds.

Alternatives come from the `alt_pool` top base tokens, must have base probability >= `alt_floor`
and are never a case / spacing / same-text variant of the rejected token (those are held;
`solvers.l47.alternatives`). Shipping (`ship`): "round" re-quantizes each edited row with ggml's
quantizer; "feedback" chooses its codes within the row's original block scales to keep the held
directions (`solvers.l47.ship`, weight `ship_hold_weight` against the background, `ship_sweeps`
polish sweeps); "auto" is feedback on coarse types (Q6_K) and round otherwise.

With a `strength_grid`, each phrase's strength is chosen on dev (`solvers.l47.frontier`); a phrase
whose word has too few legitimate uses on dev for bar (d) to measure it gets at most
`unmeasured_strength` (default 0.3, cautious), and the report names the word.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from exactedit.errors import FieldError

#: the gated anti-slop edit's gate ridges by default: the first of gated.config.RIDGES alone (on
#: Qwen's 21-phrase run the grid raised dev's non-slop chat KL from 0.0074 to 0.011 at the same
#: dev cut: docs/solve-wfld.md)
ANTISLOP_RIDGES = (1e-3,)

BACKENDS = ("jax", "numpy")
SHIP_MODES = ("auto", "feedback", "round")
BACKGROUNDS = ("anchors", "anchors+train")
HELDOUT_ROLES = ("dev", "test")
KEYS = ("dense", "discriminative", "units", "gated")   # solvers.l47.key; gated: solvers.l47.gated


class WfldError(FieldError):
    """A WFLD solve cannot run on these inputs (names the input, the field and what was expected)."""


def parse_phrase_margin(text: str) -> tuple[str, float]:
    """'right away=0.5' -> ('right away', 0.5): a per-phrase margin (CLI --phrase-margin)."""
    phrase, sep, value = text.rpartition("=")
    if not sep or not phrase.strip():
        raise ValueError(f"phrase margin {text!r}: expected PHRASE=NATS")
    try:
        nats = float(value)
    except ValueError:
        raise ValueError(f"phrase margin {text!r}: {value!r} is not a number") from None
    return phrase.strip(), nats


def parse_same_sense(text: str) -> tuple[str, tuple[str, ...]]:
    """'you can use=utilize,employ' -> ('you can use', ('utilize', 'employ')): words of the same
    sense as a phrase's final token (CLI --same-sense)."""
    phrase, sep, value = text.rpartition("=")
    words = tuple(w.strip() for w in value.split(",") if w.strip())
    if not sep or not phrase.strip() or not words:
        raise ValueError(f"same-sense words {text!r}: expected PHRASE=WORD[,WORD...]")
    return phrase.strip(), words


@dataclass(frozen=True)
class WfldConfig:
    """A WFLD solve of blk.L.ffn_down_shexp (or the last ffn_down of an rmsnorm tail)."""

    margin: float = 1.0
    phrase_margins: tuple[tuple[str, float], ...] = ()
    same_sense: tuple[tuple[str, tuple[str, ...]], ...] = ()   # per phrase: words held with its final token
    delta_cho: float = 0.5
    alternatives: int = 3
    alt_floor: float = 0.01
    alt_pool: int = 32
    capitalized: bool = True
    null_rank: int = 8
    key: str = "dense"                   # the edit's input side (solvers.l47.key): dense, discriminative, units
    key_dims: int = 4                    # per word: directions (discriminative) or units (units) at most
    key_floor: float = 0.05              # plausible contexts: base p(word) >= this, outside the slop contexts
    key_min_ratio: float = 5.0           # units: mean |h| on slop rows / on plausible rows at least this
    key_null_rank: int = 0               # per word, null directions inside a restricted key
    word_holds: int = 0                  # per word, its likeliest plausible contexts whose logit is held (0: none)
    word_hold_eps: float = 1e-4          # relative Tikhonov weight of those holds (soft: a slop-like row may give)
    strength: float = 1.0                # every FTPO target scaled by this (the edit's strength)
    strength_grid: tuple[float, ...] = ()  # non-empty: the strength chosen on dev among these
    unmeasured_strength: float = 0.3     # with a grid: the most for a phrase whose word dev cannot measure
    gated_headroom: float = 4.0          # gated: the units fire at this many times the 99.9th pct of |hh| (solvers.l47.gated.edit)
    # gated: the gates' ridges, one chosen per phrase on dev (gated.ridge) when several are given
    gated_ridges: tuple[float, ...] = ANTISLOP_RIDGES
    gated_target_eps: float = 1e-2       # gated: the targets' Tikhonov weight (one direction per phrase serves every context)
    null_tol: float = 1e-6
    ridge: float = 1e-2
    background: str = "anchors"          # rows of the metric C: "anchors", or "anchors+train" (less their slop contexts)
    special_rows: int = 256
    specials: tuple[str, ...] = ()       # () = the model's own guards (quant.model.specials.ModelSpecials)
    turn_end: str = ""                   # "" = the model's own end-of-turn token
    gn_iters: int = 4
    gn_tol: float = 0.02
    ship: str = "auto"
    ship_hold_weight: float = 1e4
    ship_sweeps: int = 1
    target_eps: float = 1e-6
    hold_eps: float = 1e-9
    same_doc_heldout: float = 0.33
    seed: int = 0
    heldout_role: str = "dev"
    backend: str = "jax"
    tile_rows: int = 8192
    unregistered: bool = False

    def __post_init__(self):
        ints = {"alternatives": 1, "alt_pool": 1, "null_rank": 0, "key_dims": 1, "key_null_rank": 0, "word_holds": 0, "special_rows": 0, "gn_iters": 1, "seed": 0,
                "tile_rows": 1, "ship_sweeps": 0}
        for name, low in ints.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"WfldConfig.{name} must be an integer >= {low}, got {value!r}")
        for f in fields(self):
            if f.type == "float":
                value = getattr(self, f.name)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ValueError(f"WfldConfig.{f.name} must be a finite number, got {value!r}")
        if self.margin < 0:
            raise ValueError(f"WfldConfig.margin must be >= 0 nats, got {self.margin}")
        if self.delta_cho <= 0:
            raise ValueError("WfldConfig.delta_cho must be > 0: with no raise of the alternatives the freed "
                             f"mass goes to the most generic continuation (the turn end); got {self.delta_cho}")
        if not 0.0 <= self.alt_floor < 1.0:
            raise ValueError(f"WfldConfig.alt_floor must be a probability in [0, 1), got {self.alt_floor}")
        if self.alt_pool < self.alternatives:
            raise ValueError(f"WfldConfig.alt_pool ({self.alt_pool}) must be >= alternatives ({self.alternatives})")
        if self.key not in KEYS:
            raise ValueError(f"WfldConfig.key must be one of {KEYS}, got {self.key!r}")
        if not 0.0 < self.key_floor < 1.0:
            raise ValueError(f"WfldConfig.key_floor must be a probability in (0, 1), got {self.key_floor}")
        if self.key_min_ratio < 1.0:
            raise ValueError(f"WfldConfig.key_min_ratio must be >= 1, got {self.key_min_ratio}")
        if not 0.0 < self.strength <= 4.0:
            raise ValueError(f"WfldConfig.strength must be in (0, 4], got {self.strength}")
        if not isinstance(self.strength_grid, tuple) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0.0 < x <= 4.0
                for x in self.strength_grid):
            raise ValueError(f"WfldConfig.strength_grid must be a tuple of strengths in (0, 4], got {self.strength_grid!r}")
        if not 0.0 < self.unmeasured_strength <= 4.0:
            raise ValueError(f"WfldConfig.unmeasured_strength must be in (0, 4], got {self.unmeasured_strength}")
        if not 0.0 < self.gated_headroom <= 64.0:
            raise ValueError(f"WfldConfig.gated_headroom must be in (0, 64], got {self.gated_headroom}")
        if not (isinstance(self.gated_ridges, tuple) and self.gated_ridges and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0.0 < x <= 100.0
                for x in self.gated_ridges)):
            raise ValueError(f"WfldConfig.gated_ridges must be a tuple of ridges in (0, 100], got {self.gated_ridges!r}")
        if self.background not in BACKGROUNDS:
            raise ValueError(f"WfldConfig.background must be one of {BACKGROUNDS}, got {self.background!r}")
        if self.ship not in SHIP_MODES:
            raise ValueError(f"WfldConfig.ship must be one of {SHIP_MODES}, got {self.ship!r}")
        for name in ("gated_target_eps", "null_tol", "ridge", "target_eps", "hold_eps", "word_hold_eps", "gn_tol", "ship_hold_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"WfldConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.same_doc_heldout < 1.0:
            raise ValueError(f"WfldConfig.same_doc_heldout must be in [0, 1), got {self.same_doc_heldout}")
        if self.heldout_role not in HELDOUT_ROLES:
            raise ValueError(f"WfldConfig.heldout_role must be one of {HELDOUT_ROLES}, got {self.heldout_role!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"WfldConfig.backend must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("capitalized", "unregistered"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"WfldConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.specials, tuple) or not all(isinstance(s, str) and s for s in self.specials):
            raise ValueError(f"WfldConfig.specials must be a tuple of token strings (empty: the model's own), "
                             f"got {self.specials!r}")
        if not isinstance(self.turn_end, str):
            raise ValueError(f"WfldConfig.turn_end must be a token string (empty: the model's own), got {self.turn_end!r}")
        if self.specials and self.turn_end and self.turn_end not in self.specials:
            raise ValueError(f"WfldConfig.turn_end {self.turn_end!r} must be one of the specials {self.specials}")
        if not isinstance(self.phrase_margins, tuple):
            raise ValueError(f"WfldConfig.phrase_margins must be a tuple of (phrase, nats), got {self.phrase_margins!r}")
        seen = set()
        for item in self.phrase_margins:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and item[0].strip()
                    and isinstance(item[1], (int, float)) and not isinstance(item[1], bool)
                    and math.isfinite(item[1]) and item[1] >= 0):
                raise ValueError(f"WfldConfig.phrase_margins: expected (phrase, nats >= 0), got {item!r}")
            if item[0] in seen:
                raise ValueError(f"WfldConfig.phrase_margins: {item[0]!r} given twice")
            seen.add(item[0])

        if not isinstance(self.same_sense, tuple) or not all(
                isinstance(i, tuple) and len(i) == 2 and isinstance(i[0], str) and i[0].strip()
                and isinstance(i[1], tuple) and i[1] and all(isinstance(w, str) and w.strip() for w in i[1])
                for i in self.same_sense):
            raise ValueError(f"WfldConfig.same_sense must be a tuple of (phrase, (word, ...)), got {self.same_sense!r}")
        if len({p for p, _ in self.same_sense}) != len(self.same_sense):
            raise ValueError("WfldConfig.same_sense: a phrase given twice")

    def margin_for(self, phrase: str) -> float:
        """The margin of one banned phrase: its override, else `margin`."""
        return float(dict(self.phrase_margins).get(phrase, self.margin))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["phrase_margins"] = [[p, float(m)] for p, m in self.phrase_margins]
        out["same_sense"] = [[p, list(ws)] for p, ws in self.same_sense]
        out["specials"] = list(self.specials)
        out["strength_grid"] = [float(x) for x in self.strength_grid]
        out["gated_ridges"] = [float(x) for x in self.gated_ridges]
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "WfldConfig":
        known = {f.name for f in fields(cls)}
        extra = sorted(set(obj) - known)
        if extra:
            raise ValueError(f"WfldConfig: unknown keys {extra}")
        kwargs = dict(obj)
        if "phrase_margins" in kwargs:
            kwargs["phrase_margins"] = tuple((str(p), float(m)) for p, m in kwargs["phrase_margins"])
        if "same_sense" in kwargs:
            kwargs["same_sense"] = tuple((str(p), tuple(str(w) for w in ws)) for p, ws in kwargs["same_sense"])
        if "specials" in kwargs:
            kwargs["specials"] = tuple(kwargs["specials"])
        if "strength_grid" in kwargs:
            kwargs["strength_grid"] = tuple(float(x) for x in kwargs["strength_grid"])
        if "gated_ridges" in kwargs:
            kwargs["gated_ridges"] = tuple(float(x) for x in kwargs["gated_ridges"])
        return cls(**kwargs)
