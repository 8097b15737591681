"""What a head solve reports per split: gains per token class, KL, flips to specials, turn ends.

Token classes (rows inside assistant replies, next token known):
- style: the next token is one of the protocol's style tokens (`tokens.style`);
- ordinary: any other non-special next token;
- all: both.
A gain is the mean change of log p(next token) over a class's rows, in nats per token, computed
from the exact effect of the shipped edit (`rowdata.effect`). A flip is a non-terminal row (next
token known and not special) whose argmax becomes a special token it was not before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from exactedit.dumps.format import ROLE_REPLY, ROLE_REPLY_END
from exactedit.solvers.head.rowdata import Effect, RowData

CLASSES = ("style", "ordinary", "all")


@dataclass(frozen=True)
class ClassGains:
    style: float
    ordinary: float
    all: float
    n_style: int
    n_ordinary: int

    def of(self, metric: str) -> float:
        return getattr(self, metric)


@dataclass(frozen=True)
class SplitReport:
    """One split (train, dev, test) or one anchor trace under the shipped edit."""

    name: str
    rows: int
    docs: int
    gains: ClassGains
    kl_mean: float
    kl_p99: float
    kl_max: float
    top1_agree: float
    special_flips: int
    turn_ends: int
    turn_end_p_base: float
    turn_end_p_edit: float

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        out["gains"] = dict(self.gains.__dict__)
        return out

    @classmethod
    def from_json(cls, obj: dict) -> "SplitReport":
        return cls(**{**obj, "gains": ClassGains(**obj["gains"])})


@dataclass(frozen=True, eq=False)
class ClassMasks:
    style: np.ndarray
    ordinary: np.ndarray

    @property
    def all(self) -> np.ndarray:
        return self.style | self.ordinary


def class_masks(rd: RowData, style: Sequence[int], specials: Sequence[int]) -> ClassMasks:
    in_reply = ((rd.roles & ROLE_REPLY) != 0) & (rd.next >= 0)
    is_style = np.isin(rd.next, np.asarray(style, dtype=np.int64))
    is_special = np.isin(rd.next, np.asarray(specials, dtype=np.int64))
    return ClassMasks(in_reply & is_style, in_reply & ~is_style & ~is_special)


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if x.size else float("nan")


def gains(eff: Effect, masks: ClassMasks) -> ClassGains:
    d = eff.dlogp
    return ClassGains(_mean(d[masks.style]), _mean(d[masks.ordinary]), _mean(d[masks.all]),
                      int(masks.style.sum()), int(masks.ordinary.sum()))


def special_flips(rd: RowData, eff: Effect, specials: Sequence[int]) -> np.ndarray:
    """Rows (bool) that flip to a special token at a non-terminal position."""
    sp = np.asarray(specials, dtype=np.int64)
    non_terminal = (rd.next >= 0) & ~np.isin(rd.next, sp)
    return non_terminal & np.isin(eff.argmax_edit, sp) & (eff.argmax_edit != rd.argmax)


def split_report(name: str, rd: RowData, eff: Effect, masks: ClassMasks, specials: Sequence[int],
                 turn_end: int) -> SplitReport:
    ends = (rd.roles & ROLE_REPLY_END) != 0
    col = rd.sel([turn_end])[:, 0]
    p_base = np.exp(col - rd.lse)[ends]
    p_edit = np.exp(col - rd.lse - eff.dlse)[ends]
    kl = eff.kl
    return SplitReport(
        name=name, rows=rd.rows, docs=len(np.unique(rd.doc)), gains=gains(eff, masks),
        kl_mean=_mean(kl), kl_p99=float(np.percentile(kl, 99)) if kl.size else float("nan"),
        kl_max=float(kl.max()) if kl.size else float("nan"),
        top1_agree=_mean((eff.argmax_edit == rd.argmax).astype(np.float64)),
        special_flips=int(special_flips(rd, eff, specials).sum()), turn_ends=int(ends.sum()),
        turn_end_p_base=_mean(p_base), turn_end_p_edit=_mean(p_edit))
