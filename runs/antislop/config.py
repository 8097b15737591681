"""What `exactedit antislop` works on: the model, the user's files (or a bundled model's, for
`exactedit demo --model NAME`) and the settings, with their defaults per bundled model
(runs/bundled/NAME/antislop/defaults.toml, chosen on dev data)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exactedit.errors import ExacteditError
from exactedit.runs.loop.inputs import bundled_dir, bundled_file, bundled_template, lines, read_settings, text_files
from exactedit.solvers.l47.gated.config import ANTISLOP_RIDGES

LOOP = "antislop"       # the bundled inputs' folder: runs/bundled/NAME/antislop/
AUTO_KEY, AUTO_KEYS = "auto", ("dense", "gated")
RATE_SEED = 10_000        # the rate prompts' seeds start at seed + this: never a data reply's seed
CORPUS_AFTER = 4          # tokens past each use in a corpus window (runs/data/corpus.py `after`)
# the settings `exactedit antislop` (and `demo --model`) has a flag for; the others come from the
# model's bundled defaults.toml or the class
FLAGS = frozenset({"phrases", "top", "kind", "prompts", "rate_prompts", "watch", "texts", "same_sense", "chat_template",
                   "samples", "rate_samples", "max_new", "seed", "ridge", "corpus_tokens", "key", "word_holds",
                   "strength_grid", "gated_headroom", "rules_bias", "rules_mode", "gpu_layers"})

__all__ = ["AntislopConfig", "AntislopError", "LOOP", "RATE_SEED", "model_defaults"]


class AntislopError(ExacteditError):
    """The run cannot go on: an output directory that is not a run's, a file not given, a bad setting."""


@dataclass(frozen=True)
class AntislopConfig:
    """What a run works on and how. `model` is a GGUF path or a public model name (`exactedit demo
    --model NAME`); the files default to the bundled ones of a name with data (runs/bundled/NAME/antislop/),
    and must be given otherwise."""

    model: str = "qwen"
    prompts: str | None = None          # one prompt per line: the solve's data
    rate_prompts: str | None = None     # one prompt per line: held-out, for the phrase rates only
    phrases: str | None = None          # one banned phrase per line, or discover's JSON
    top: int | None = None              # the first `top` phrases of `phrases` (discover's JSON: its usable ones)
    kind: str = "style"                 # discover's JSON: the entries of this kind (style, mixed, topic, a list, any)
    watch: str | None = None            # phrases measured in generation too, not solved for (optional)
    same_sense: str | None = None       # PHRASE=WORD[,WORD] per line: paraphrases held, never raised (optional)
    texts: tuple[str, ...] | None = None  # plain texts (legitimate uses, plain anchors)
    samples: int = 2                    # replies per data prompt
    rate_samples: int = 2               # replies per rate prompt
    max_new: int = 160
    seed: int = 0
    verify_tokens: int = 192            # tokens of the held-out reply verify live runs
    n_boot: int = 1000
    ridge: float = 0.01                 # solve wfld's background ridge (docs/real-model.md: the dev rule)
    background: str = "anchors+train"   # solve wfld's background rows (docs/real-model.md: measured on dev)
    corpus_tokens: int = 12_000         # prefill budget of the teacher-forced corpus (dataset corpus); 0: none
    corpus_context: int = 32            # tokens of context before each use in a corpus window
    key: str = "dense"                  # solve wfld --key, or "auto": dense and gated both solved, chosen on dev
    word_holds: int = 2000              # solve wfld --word-holds (every plausible row of the solve side)
    strength_grid: tuple[float, ...] = (1.0, 0.8, 0.6, 0.45, 0.3, 0.2)   # solve wfld --strength-grid (per phrase, on dev)
    # the gated edit's grid: its column lowers the phrase's token by strength x max(gap + margin,
    # margin) nats at the unit's contexts only (solvers.l47.gated.column), so (d) leaves room for
    # strong points; the weakest of equal dev cuts is taken (frontier.CUT_TIE)
    gated_strength_grid: tuple[float, ...] = (4.0, 2.0, 1.0, 0.5)
    # the gated units' activation at their contexts, in multiples of the model's 99.9th percentile
    # of |hh| (WfldConfig.gated_headroom): a larger one fires the unit harder, so the same cut needs
    # a smaller down column (ffn_down's block scales bound each entry)
    gated_headroom: float = 4.0
    # the gates' ridges, one chosen per phrase on dev when several (WfldConfig.gated_ridges: one by
    # default, as chosen on the 21-phrase run's dev; the grid is solvers.l47.gated.config.RIDGES)
    gated_ridges: tuple[float, ...] = ANTISLOP_RIDGES
    chat_template: str | None = None    # a Jinja2 chat template file (default: the bundled chat_template.jinja, if any)
    rules_bias: float = 6.0             # the shipped rules' prefix penalty (shape compile --bias), nats
    rules_mode: str = "penalty"         # the rates stage's rules arms: "penalty", or "rewind" (phrases rolled back)
    gpu_layers: int | None = None       # the engine's n_gpu_layers in the data, corpus and rates stages (-1: all);
    #                                     None: all with a GPU build of llama-cpp-python, else 0 (verify stays on the CPU)

    @classmethod
    def for_model(cls, model: str = "qwen", **given) -> "AntislopConfig":
        """The config for `model`: the fields `given` (None: not given), else the model's bundled
        defaults.toml, else the class defaults."""
        return cls(model=model, **{**model_defaults(model), **{k: v for k, v in given.items() if v is not None}})

    def __post_init__(self):
        problems = self.problems()
        if problems:
            from exactedit.runs.loop.settings import refusal

            raise refusal(AntislopError, f"exactedit antislop --model {self.model}", problems)

    def problems(self) -> list[str]:
        """Every setting the run could not use, each naming the setting (and its flag): checked
        here, before any file is read or anything generated (runs/loop/settings.py), with the
        settings of the later stages built now from these (solve wfld's, each grid and the ridge
        through WfldConfig; the rules' penalty as `shape compile` takes it) and the seeds of every
        reply (data and rate replies) in llama.cpp's range. What needs a file read or the corpus
        module (same-sense words, the corpus's settings) is preflight's (runs/antislop/checks.py)."""
        from exactedit.native.llamacpp.rewind import RULES_MODES
        from exactedit.runs.loop import settings as st
        from exactedit.solvers.l47.config import KEYS, WfldConfig

        out = st.integers(self, {"samples": 1, "rate_samples": 1, "max_new": 1, "verify_tokens": 1, "n_boot": 0,
                                 "corpus_tokens": 0, "corpus_context": 1, "word_holds": 0}, FLAGS,
                          {"samples": (st.MAX_SAMPLES, "replies per data prompt"),
                           "rate_samples": (st.MAX_SAMPLES, "replies per rate prompt"),
                           "n_boot": (st.MAX_BOOT, "bootstrap resamples")})
        if self.top is not None:
            out += st.integers(self, {"top": 1}, FLAGS)
        if self.gpu_layers is not None:
            out += st.downstream(lambda: self.engine_settings(), ["gpu_layers"], FLAGS)
        out += _kind_problems(self.kind, st.flag("kind", FLAGS))
        out += st.reply_room(self.max_new, FLAGS)
        out += st.utf8_paths(self, ("model", "prompts", "rate_prompts", "phrases", "watch", "same_sense", "texts",
                                    "chat_template"), FLAGS)
        out += st.seeds(self.seed, {"the data replies": (0, self.samples), "the rate replies":
                                    (RATE_SEED, self.rate_samples)}, FLAGS)
        if self.key not in KEYS + (AUTO_KEY,):
            out.append(f"{st.flag('key', FLAGS)}: expected one of {KEYS + (AUTO_KEY,)}, got {self.key!r}")
        for name, field in (("ridge", "ridge"), ("background", "background"), ("strength_grid", "strength_grid"),
                            ("gated_strength_grid", "strength_grid"), ("gated_headroom", "gated_headroom"),
                            ("gated_ridges", "gated_ridges")):
            out += st.downstream(lambda: WfldConfig(**{field: getattr(self, name)}), [name], FLAGS)
        out += self._rules_problems(st)
        if self.rules_mode not in RULES_MODES:
            out.append(f"{st.flag('rules_mode', FLAGS)}: expected one of {', '.join(RULES_MODES)}, "
                       f"got {self.rules_mode!r}")
        return out

    def _rules_problems(self, st) -> list[str]:
        """The shipped rules' prefix penalty: > 0 nats, and a number float32 holds exactly, the test
        `shape compile` applies (solvers.shaping.rules.parse_shape): the rules hold it in float32,
        and a bias that is not what the report says is refused, not rounded."""
        from exactedit.solvers.shaping.rules import parse_shape

        b, where = self.rules_bias, st.flag("rules_bias", FLAGS)
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or not b > 0:
            return [f"{where}: expected a finite number of nats > 0, got {b!r}"]
        try:
            parse_shape(f"prefix-penalty={float(b)!r}")
        except ValueError:
            with np.errstate(over="ignore"):
                near = float(np.float32(b))
            return [f"{where}: {b!r} is not a float32 number (the compiled rules hold the penalty in float32, "
                    f"as {near!r}): give one float32 holds exactly, e.g. {_f32_near(b)}"]
        return []

    def engine_settings(self):
        """The engine's settings of the stages that generate or capture (data, corpus, rates): the
        default EngineSettings with `gpu_layers` (None: native.llamacpp.engine.default_gpu_layers)."""
        from exactedit.native.llamacpp.engine import EngineSettings, default_gpu_layers

        return EngineSettings(n_gpu_layers=default_gpu_layers() if self.gpu_layers is None else self.gpu_layers)

    def corpus_config(self, chat_template=None):
        """`dataset corpus`'s settings of the run (runs/data/corpus.py CorpusConfig)."""
        from exactedit.runs.data.corpus import CorpusConfig

        return CorpusConfig(max_tokens=self.corpus_tokens, context=self.corpus_context, after=CORPUS_AFTER,
                            seed=self.seed, chat_template=chat_template)

    def keys(self) -> tuple[str, ...]:
        """The edit kinds the solve stage solves: the key, or for "auto" the dense and the gated edit."""
        return AUTO_KEYS if self.key == AUTO_KEY else (self.key,)

    @property
    def bundled(self) -> Path | None:
        """runs/bundled/NAME/antislop/ when `model` names a model with bundled inputs, else None."""
        return bundled_dir(self.model, LOOP)

    def wfld_config(self, key: str | None = None):
        """solve wfld's settings of the run (with `key`: that edit kind's, for "auto")."""
        from exactedit.solvers.l47.config import WfldConfig

        try:
            return WfldConfig(ridge=self.ridge, background=self.background, same_sense=self.same_sense_words(),
                              key=key or self.keys()[0], word_holds=self.word_holds,
                              strength_grid=tuple(self.gated_strength_grid if (key or self.keys()[0]) == "gated"
                                                  else self.strength_grid),
                              gated_headroom=self.gated_headroom, gated_ridges=tuple(self.gated_ridges))
        except ValueError as exc:
            raise AntislopError(str(exc)) from None

    def file(self, name: str) -> Path:
        return bundled_file(getattr(self, name), self.bundled, name, f"{name}.txt", self.model, AntislopError)

    def phrase_list(self) -> tuple[str, ...]:
        """The phrases solved for: the phrases file's lines, or discover's JSON's usable entries of
        `kind` (each at its measured ban point), the first `top` of them."""
        from exactedit.solvers.phrases import PhraseError, load_phrases

        try:
            return load_phrases(self.file("phrases"), self.top, self.kind)
        except PhraseError as exc:
            raise AntislopError(str(exc)) from None

    def watched(self) -> tuple[str, ...]:
        """The extra phrases of the rate measurement: --watch, else the bundled watch.txt, else none."""
        if self.watch is None and not (self.bundled and (self.bundled / "watch.txt").is_file()):
            return ()
        return lines(self.file("watch"))

    def same_sense_words(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """solve wfld's same-sense words: --same-sense, else the bundled same_sense.txt, else none."""
        if self.same_sense is None and not (self.bundled and (self.bundled / "same_sense.txt").is_file()):
            return ()
        from exactedit.solvers.l47.config import parse_same_sense

        path = self.file("same_sense")
        try:
            return tuple(parse_same_sense(line) for line in lines(path))
        except ValueError as exc:
            raise AntislopError(f"{path}: {exc}") from None

    def template(self):
        """The chat template the demo renders with (quant.model.chat_template.GivenTemplate): --chat-template,
        else the bundled chat_template.jinja; None: the GGUF's own."""
        return bundled_template(self.chat_template, self.bundled)

    def text_files(self) -> tuple[Path, ...]:
        return text_files(self.texts, self.bundled)


def _kind_problems(kind, where: str) -> list[str]:
    """discover's entry kinds asked for, as `solvers.phrases.kinds_of` takes them."""
    from exactedit.solvers.phrases import kinds_of

    try:
        kinds_of(kind)
    except ValueError as exc:
        return [f"{where}: {exc}"]
    return []


def _f32_near(x: float) -> str:
    """Numbers near `x` that float32 holds exactly and the penalty takes (> 0, finite): multiples of
    1/8 and 1/2 around it where float32 holds them, else the float32 nearest it (before: 1e39 was
    offered for 1e39, which float32 holds as inf, nothing at all for 1e-45, and 1e308 was an
    OverflowError traceback)."""
    f32 = np.finfo(np.float32)

    def exact(v: float) -> bool:
        return 0 < v <= float(f32.max) and float(np.float32(v)) == v

    picks = [v for v in ((round(x * 8) / 8, round(x * 2) / 2, float(round(x))) if x < float(f32.max) else ()) if exact(v)]
    if not picks:
        near = float(np.float32(min(x, float(f32.max))))
        picks = [near if exact(near) else float(f32.smallest_subnormal)]
    return " or ".join(f"{v:g}" if float(f"{v:g}") == v else repr(v) for v in dict.fromkeys(picks))


DEFAULTS_FILE = "defaults.toml"
_TUPLES = {"strength_grid": float, "gated_strength_grid": float, "texts": str}


def model_defaults(model: str) -> dict:
    """The bundled per-model settings (runs/bundled/NAME/antislop/defaults.toml: AntislopConfig field =
    value), {} when the model has none. An unknown field or a wrong type names the file and field."""
    folder = bundled_dir(model, LOOP, DEFAULTS_FILE)
    if folder is None:
        return {}
    path = folder / DEFAULTS_FILE
    return read_settings(path, AntislopConfig, AntislopError, exclude=("model",), tuples=_TUPLES)
