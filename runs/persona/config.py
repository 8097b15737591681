"""What `exactedit persona` works on: the model, the persona (a system prompt), the style it shows
(evals/rates/style.py), the user's prompt files (or a bundled model's, for `exactedit demo --model
NAME --persona`: runs/bundled/NAME/persona/persona.toml and its files) and the head solve's settings."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from exactedit.errors import ExacteditError
from exactedit.runs.loop.inputs import bundled_dir, bundled_file, bundled_template, lines, read_settings, text_files
from exactedit.solvers.l47.gated.config import RIDGES

LOOP = "persona"        # the bundled inputs' folder: runs/bundled/NAME/persona/
PERSONA_FILE = "persona.toml"
MAX_SYSTEM_CHARS = 4000         # a persona prompt longer than this is refused (it is read from a user's file)
MAX_EDIT_COUNT = 1024           # |S|: a style's initiation tokens are a handful; more is no style's edit set
RATE_SEED = 10_000        # rate replies' seeds start at seed + this: never a data reply's seed
DEVICES = ("auto", "cpu", "gpu")
_UNTYPABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")   # controls but tab and newlines; surrogates
# the settings `exactedit persona` has a flag for; the others come from persona.toml or the class
FLAGS = frozenset({"system", "style", "prompts", "rate_prompts", "texts", "chat_template", "samples", "rate_samples",
                   "max_new", "seed", "edit_count", "rank", "lr", "max_steps", "device", "hold", "watch_kl", "edit"})
EDITS = ("head", "gated")       # the rank-r head edit, or a gated unit of the last FFN (solvers/l47/gated/style.py)

__all__ = ["PERSONA_FILE", "PersonaConfig", "PersonaError", "RATE_SEED", "persona_defaults"]


class PersonaError(ExacteditError):
    """The persona run cannot go on: a file or setting missing or malformed, a style never shown."""


@dataclass(frozen=True)
class PersonaConfig:
    """A persona run. `system` is the persona's system prompt; `style` a Style spec (starter:TEXT,
    signoff:TEXT, kaomoji, lowercase). The solve's stopping rule and bars are the seeds' (SPEC.md
    section 7): keep the last step with dev/train >= `min_ratio` on the style positions; with
    `watch_kl`, only before the first checkpoint whose mean dev KL off the style's decision rows
    passes the registered bar (`bars.persona_max_kl_off`). `hold` is the head solve's (rows of the
    anchors held in its KL term: "none", or "paragraph", the paragraph starts after a blank line).
    `edit` "gated": instead of the head edit, one rewritten unit of the last FFN that fires at the
    style's decision rows only (solvers/l47/gated/style.py), its strength chosen on dev within the
    same bar off the decision rows; `gated_grid` the strengths tried, at each of `gated_headrooms`
    (the unit's activation at the decision rows in multiples of the model's 99.9th percentile:
    the way past ffn_down's block scales), `gated_ridges` the gate's ridges (one chosen on dev)."""

    model: str = "qwen"
    system: str | None = None
    style: str | None = None
    prompts: str | None = None          # one prompt per line: the solve's data (split train / dev / test)
    rate_prompts: str | None = None     # one prompt per line: held out, for the style rates only
    texts: tuple[str, ...] | None = None  # plain texts: anchors (half) and the cost's plain text (half)
    samples: int = 1                    # replies per data prompt and side
    rate_samples: int = 2               # replies per rate prompt and side
    max_new: int = 128
    seed: int = 0
    dev: float = 0.2                    # share of the data prompts for dev, and for test
    edit_count: int = 1                 # |S|: the train split's most frequent initiation tokens
    rank: int = 1
    null_k: int = 32
    lr: float = 1e-3
    w_kl: float = 100.0
    every: int = 5
    max_steps: int = 300
    min_ratio: float = 0.75             # the seeds' rule: a margin over the 0.70 bar
    watch_kl: bool = False              # the rule also stops where the dev KL off the decision rows passes the bar
    hold: str = "none"                  # anchors' rows held in the solve's KL term (HeadSolveConfig.hold)
    edit: str = "head"                  # "head" (solve head) or "gated" (a unit of the last FFN)
    gated_grid: tuple[float, ...] = (0.5, 0.7, 0.8, 0.9, 1.0, 2.0, 4.0)  # the unit's strengths, chosen on dev
    gated_headrooms: tuple[float, ...] = (4.0, 16.0)       # its activation scales, chosen on dev with them
    gated_ridges: tuple[float, ...] = RIDGES               # its gate's ridges, one chosen on dev (gated.ridge)
    verify_tokens: int = 192
    n_boot: int = 1000
    device: str = "auto"
    chat_template: str | None = None

    def __post_init__(self):
        problems = self.problems()
        if problems:
            from exactedit.runs.loop.settings import refusal

            raise refusal(PersonaError, f"exactedit persona --model {self.model}", problems)

    def problems(self) -> list[str]:
        """Every setting the run could not use, each naming the setting (and its flag), before any
        file is read or anything generated (runs/loop/settings.py): the solve's settings built now
        (`head_config`, `stopping`: what the solve stage builds after generation), the seeds of
        every reply in llama.cpp's range."""
        from exactedit.runs.loop import settings as st

        counts = {"samples": (st.MAX_SAMPLES, "replies per prompt and side"),
                  "rate_samples": (st.MAX_SAMPLES, "replies per rate prompt and side"),
                  "n_boot": (st.MAX_BOOT, "bootstrap resamples"),
                  "edit_count": (MAX_EDIT_COUNT, "the edit set S is the train split's most frequent initiation "
                                                 "tokens: a style has a handful")}
        out = st.integers(self, {"samples": 1, "rate_samples": 1, "max_new": 1, "verify_tokens": 1, "edit_count": 1,
                                 "rank": 1, "null_k": 0, "every": 1, "max_steps": 1, "n_boot": 0}, FLAGS, counts)
        counted = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (self.rank, self.edit_count))
        if counted and self.rank > min(self.edit_count, MAX_EDIT_COUNT):     # A is |S| x rank
            most = self.edit_count if self.edit_count <= MAX_EDIT_COUNT else f"at most {MAX_EDIT_COUNT}"
            out.append(f"{st.flag('rank', FLAGS)}: expected 1 <= rank <= edit_count ({most}), got {self.rank}")
        out += st.numbers(self, {"dev": (0, 0.5, "()"), "lr": (0, None, "()"), "w_kl": (0, None, "[)"),
                                 "min_ratio": (0, None, "()")}, FLAGS)
        out += st.reply_room(self.max_new, FLAGS)
        if isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 1:
            # lr 1e308 passed, and the solve ended in NaN weights after the whole generation
            out.append(f"{st.flag('lr', FLAGS)}: {self.lr!r} is more than 1: Adam moves each head weight by about "
                       "lr a step, and the head's weights are of order 0.1")
        out += st.utf8_paths(self, ("model", "prompts", "rate_prompts", "texts", "chat_template"), FLAGS)
        out += st.seeds(self.seed, {"the persona and plain replies": (0, self.samples),
                                    "the rate replies": (RATE_SEED, self.rate_samples)}, FLAGS)
        if self.device not in DEVICES:
            out.append(f"{st.flag('device', FLAGS)}: expected one of {DEVICES}, got {self.device!r}")
        if self.edit not in EDITS:
            out.append(f"{st.flag('edit', FLAGS)}: expected one of {EDITS}, got {self.edit!r}")
        for name, hi, what in (("gated_grid", 16, "strengths"), ("gated_headrooms", 64, "activation scales"),
                               ("gated_ridges", 100, "ridges")):
            vals = getattr(self, name)
            if not (isinstance(vals, (tuple, list)) and vals and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 < x <= hi
                    for x in vals)):
                out.append(f"{name}: expected {what} in (0, {hi}], got {vals!r}")
        if not isinstance(self.watch_kl, bool):
            out.append(f"{st.flag('watch_kl', FLAGS)}: expected true or false, got {self.watch_kl!r}")
        if self.system is not None and (not isinstance(self.system, str) or not self.system.strip()
                                        or len(self.system) > MAX_SYSTEM_CHARS):
            out.append(f"{st.flag('system', FLAGS)}: the persona prompt must be non-empty and at most "
                       f"{MAX_SYSTEM_CHARS} characters")
        elif self.system is not None and (bad := _UNTYPABLE.search(self.system)) is not None:
            # a lone surrogate (a byte no UTF-8 holds, as the shell hands it over) failed tokenizing
            # with a UnicodeEncodeError after the run had started; a NUL ends the text in C
            what = "a lone surrogate" if "\ud800" <= bad.group() <= "\udfff" else "a control character"
            out.append(f"{st.flag('system', FLAGS)}: the persona prompt holds {what} ({ascii(bad.group())} at "
                       f"character {bad.start()}); give UTF-8 text")
        if not out:
            out += st.downstream(self.head_config, ["rank", "null_k", "lr", "w_kl", "hold"], FLAGS)
            out += st.downstream(self.stopping, ["every", "max_steps", "min_ratio", "watch_kl"], FLAGS)
        return out

    def model_problems(self, n: int, vocab: int) -> list[tuple[str, str]]:
        """The settings the model bounds, as (setting, why) pairs, checked by preflight_head with the
        model's head read (before any generation; the solve refused them, or ran out of memory, only
        after it): `rank` <= n, the head's input width (B is n x rank; a rank past n adds no
        direction), `null_k` < n (the null space keeps n - null_k directions for the edit),
        `edit_count` <= the head's rows (S is a set of the model's tokens)."""
        from exactedit.runs.loop import settings as st

        out = []
        for name, high, what in (("rank", n, f"the model's width n = {n}: the edit's B is n x rank"),
                                 ("null_k", n - 1, f"the model's width n = {n} less one: the null space must leave "
                                                   "the edit a direction"),
                                 ("edit_count", vocab, f"the model's {vocab} tokens (the head's rows)")):
            v = getattr(self, name)
            if isinstance(v, int) and v > high:
                out.append((st.flag(name, FLAGS), f"{v} is more than {high}, {what}"))
        return out

    def head_config(self):
        """`solve head`'s settings of the run (solvers.head.config.HeadSolveConfig)."""
        from exactedit.solvers.head.config import HeadSolveConfig

        return HeadSolveConfig(rank=self.rank, null_k=self.null_k, lr=self.lr, w_kl=self.w_kl, hold=self.hold)

    def stopping(self):
        """The protocol's stopping rule of the run (evals.protocol.protocol.StoppingRule)."""
        from exactedit.evals.protocol.protocol import Bars, StoppingRule

        return StoppingRule(every=self.every, max_steps=self.max_steps, metric="style", min_ratio=self.min_ratio,
                            max_dev_kl_off=Bars().persona_max_kl_off if self.watch_kl else math.inf)

    @classmethod
    def for_model(cls, model: str = "qwen", **given) -> "PersonaConfig":
        """The config for `model`: the fields `given` (None: not given), else the model's bundled
        persona.toml, else the class defaults."""
        return cls(model=model, **{**persona_defaults(model), **{k: v for k, v in given.items() if v is not None}})

    @property
    def bundled(self) -> Path | None:
        """runs/bundled/NAME/persona/ when `model` names a model with a bundled persona, else None."""
        return bundled_dir(self.model, LOOP, PERSONA_FILE)

    def file(self, name: str) -> Path:
        return bundled_file(getattr(self, name), self.bundled, name, f"{name}.txt", self.model, PersonaError)

    def lines(self, name: str) -> tuple[str, ...]:
        try:
            return lines(self.file(name))
        except (OSError, UnicodeDecodeError) as exc:
            raise PersonaError(f"{self.file(name)}: cannot read as UTF-8 text ({exc})") from None

    def persona(self) -> str:
        if self.system is None:
            raise PersonaError("--system: the persona's system prompt is not given (and the model has no bundled "
                               f"{PERSONA_FILE})")
        return self.system

    def style_spec(self):
        from exactedit.evals.rates.style import Style, StyleError

        if self.style is None:
            raise PersonaError("--style: not given (starter:TEXT, signoff:TEXT, kaomoji or lowercase)")
        try:
            return Style.parse(self.style)
        except StyleError as exc:
            raise PersonaError(f"--style: {exc}") from None

    def template(self):
        return bundled_template(self.chat_template, self.bundled)

    def text_files(self) -> tuple[Path, ...]:
        return text_files(self.texts, self.bundled)


def persona_defaults(model: str) -> dict:
    """runs/bundled/NAME/persona/persona.toml: PersonaConfig field = value; {} when there is none. An
    unknown field or a wrong type names the file and the field."""
    folder = bundled_dir(model, LOOP, PERSONA_FILE)
    if folder is None:
        return {}
    path = folder / PERSONA_FILE
    return read_settings(path, PersonaConfig, PersonaError, exclude=("model", "texts"))
