"""What `exactedit persona` works on: the model, the persona (a system prompt), the style it shows
(evals/rates/style.py), the user's prompt files (or a bundled model's, for `exactedit demo --model
NAME --persona`: runs/bundled/NAME/persona/persona.toml and its files) and the head solve's settings."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exactedit.errors import ExacteditError
from exactedit.runs.loop.inputs import bundled_dir, bundled_file, bundled_template, lines, read_settings, text_files

LOOP = "persona"        # the bundled inputs' folder: runs/bundled/NAME/persona/
PERSONA_FILE = "persona.toml"
MAX_SYSTEM_CHARS = 4000         # a persona prompt longer than this is refused (it is read from a user's file)

__all__ = ["PERSONA_FILE", "PersonaConfig", "PersonaError", "persona_defaults"]


class PersonaError(ExacteditError):
    """The persona run cannot go on: a file or setting missing or malformed, a style never shown."""


@dataclass(frozen=True)
class PersonaConfig:
    """A persona run. `system` is the persona's system prompt; `style` a Style spec (starter:TEXT,
    signoff:TEXT, kaomoji, lowercase). The solve's stopping rule and bars are the seeds' (SPEC.md
    section 7): keep the last step with dev/train >= `min_ratio` on the style positions."""

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
    verify_tokens: int = 192
    n_boot: int = 1000
    device: str = "auto"
    chat_template: str | None = None

    def __post_init__(self):
        if min(self.samples, self.rate_samples, self.max_new, self.verify_tokens, self.edit_count,
               self.every, self.max_steps) < 1:
            raise PersonaError("samples, rate_samples, max_new, verify_tokens, edit_count, every and max_steps "
                               "must be >= 1")
        if not 0 < self.dev < 0.5:
            raise PersonaError(f"dev: the dev (and test) share of the prompts must be in (0, 0.5), got {self.dev}")
        if self.rank < 1 or self.rank > self.edit_count:
            raise PersonaError(f"rank: expected 1 <= rank <= edit_count ({self.edit_count}), got {self.rank}")
        if self.system is not None and (not self.system.strip() or len(self.system) > MAX_SYSTEM_CHARS):
            raise PersonaError(f"system: the persona prompt must be non-empty and at most {MAX_SYSTEM_CHARS} "
                               "characters")

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
