"""`HeadSolveConfig`: every knob of `solve head`, validated; CLI flags map 1:1 to its fields.

What is *not* here on purpose: the edit set, the step budget, the evaluation cadence and the
stopping rule. They are pre-registered in the protocol file (`edit_set`, `stopping`), so a run
cannot quietly change them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from exactedit.errors import FieldError
from exactedit.solvers.head.adam import AdamConfig
from exactedit.solvers.head.objective import Weights

Token = str | int
BACKENDS = ("jax", "numpy")
HOLDS = ("none", "paragraph")     # rows of the protocol's anchors traces held in J's KL term
_NON_NEGATIVE = ("w_nll", "w_margin", "w_ul", "w_close", "w_kl", "w_guard", "guard_eps", "ridge")


class HeadSolveError(FieldError):
    """A head solve cannot run on these inputs (names the input, the field and what was expected)."""


@dataclass(frozen=True)
class HeadSolveConfig:
    """A head solve. `rank` 0 means full rows of S; r >= 1 means dW_S = A B^T. `null_k` is the
    number of top eigenvectors of the train anchors' mix covariance the edit must not move (0: none).
    Weights as in SPEC.md section 4; `openers` / `closers` are the sets O and Cl (token strings as the
    model's table decodes them, or ids). `hold` adds rows of the protocol's anchors traces to the
    exact-KL term (and the null space's anchors): "none", or "paragraph", the rows that predict a
    paragraph's first token after a blank line (solvers.tail.decision.paragraph_starts)."""

    rank: int = 1
    null_k: int = 32
    lr: float = 1e-3
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    w_nll: float = 1.0
    w_margin: float = 0.0
    margin: float = 1.0
    w_ul: float = 0.0
    w_close: float = 0.0
    w_kl: float = 100.0
    w_guard: float = 1.0
    guard_eps: float = 0.05
    ridge: float = 0.0
    openers: tuple[Token, ...] = ()
    closers: tuple[Token, ...] = ()
    backend: str = "jax"
    tile_rows: int = 8192
    unregistered: bool = False
    hold: str = "none"

    def __post_init__(self):
        for name in ("rank", "null_k", "tile_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"HeadSolveConfig.{name} must be an integer, got {value!r}")
        if self.rank < 0:
            raise ValueError(f"HeadSolveConfig.rank must be >= 0 (0 = full rows), got {self.rank}")
        if self.null_k < 0:
            raise ValueError(f"HeadSolveConfig.null_k must be >= 0, got {self.null_k}")
        if self.tile_rows < 1:
            raise ValueError(f"HeadSolveConfig.tile_rows must be >= 1, got {self.tile_rows}")
        if self.backend not in BACKENDS:
            raise ValueError(f"HeadSolveConfig.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.hold not in HOLDS:
            raise ValueError(f"HeadSolveConfig.hold must be one of {HOLDS}, got {self.hold!r}")
        for name in ("openers", "closers"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, tuple):
                raise ValueError(f"HeadSolveConfig.{name} must be a tuple of tokens, got {value!r}")
            for tok in value:
                if isinstance(tok, bool) or not isinstance(tok, (str, int)) or (isinstance(tok, int) and tok < 0):
                    raise ValueError(f"HeadSolveConfig.{name}: expected token strings or ids >= 0, got {tok!r}")
        for f in fields(self):
            if f.type == "float" and not _finite(getattr(self, f.name)):
                raise ValueError(f"HeadSolveConfig.{f.name} must be a finite number, got {getattr(self, f.name)!r}")
            if f.name in _NON_NEGATIVE and getattr(self, f.name) < 0:
                raise ValueError(f"HeadSolveConfig.{f.name} must be >= 0, got {getattr(self, f.name)!r}")
        if not isinstance(self.unregistered, bool):
            raise ValueError(f"HeadSolveConfig.unregistered must be a bool, got {self.unregistered!r}")
        try:
            self.weights
            self.adam
        except ValueError as exc:
            raise ValueError(f"HeadSolveConfig: {exc}") from None

    @property
    def weights(self) -> Weights:
        return Weights(nll=self.w_nll, margin=self.w_margin, margin_m=self.margin, ul=self.w_ul,
                       close=self.w_close, kl=self.w_kl, guard=self.w_guard, guard_eps=self.guard_eps,
                       ridge=self.ridge)

    @property
    def adam(self) -> AdamConfig:
        return AdamConfig(lr=self.lr, b1=self.adam_b1, b2=self.adam_b2, eps=self.adam_eps)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("openers", "closers"):
            out[name] = list(out[name])
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "HeadSolveConfig":
        known = {f.name for f in fields(cls)}
        extra = sorted(set(obj) - known)
        if extra:
            raise ValueError(f"HeadSolveConfig: unknown keys {extra}")
        kwargs = dict(obj)
        for name in ("openers", "closers"):
            if name in kwargs:
                kwargs[name] = tuple(kwargs[name])
        return cls(**kwargs)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
