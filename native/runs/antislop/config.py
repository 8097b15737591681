"""What `exactedit antislop` works on: the model, the user's files (or a bundled model's, for
`exactedit demo --model NAME`) and the settings, with their defaults per bundled model
(native/runs/data/NAME/defaults.toml, chosen on dev data)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exactedit.quant.errors import ExacteditError

DATA = Path(__file__).resolve().parent.parent / "data"

__all__ = ["AntislopConfig", "AntislopError", "DATA", "bundled_file", "bundled_template", "model_defaults", "read_settings", "text_files"]


class AntislopError(ExacteditError):
    """The run cannot go on: an output directory that is not a run's, a file not given, a bad setting."""


def _lines(path) -> tuple[str, ...]:
    with open(path, encoding="utf-8") as fh:
        return tuple(line.strip() for line in fh if line.strip() and not line.lstrip().startswith("#"))


@dataclass(frozen=True)
class AntislopConfig:
    """What a run works on and how. `model` is a GGUF path or a public model name (`exactedit demo
    --model NAME`); the files default to the bundled ones of a name with data (native/runs/data/NAME/),
    and must be given otherwise."""

    model: str = "qwen"
    prompts: str | None = None          # one prompt per line: the solve's data
    rate_prompts: str | None = None     # one prompt per line: held-out, for the phrase rates only
    phrases: str | None = None          # one banned phrase per line, or discover's JSON
    top: int | None = None              # the first `top` phrases of `phrases` (discover's JSON: its usable ones)
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
    key: str = "dense"                  # solve wfld --key (docs/real-model.md: chosen on dev)
    word_holds: int = 2000              # solve wfld --word-holds (every plausible row of the solve side)
    strength_grid: tuple[float, ...] = (1.0, 0.8, 0.6, 0.45, 0.3, 0.2)   # solve wfld --strength-grid (per phrase, on dev)
    chat_template: str | None = None    # a Jinja2 chat template file (default: the bundled chat_template.jinja, if any)
    rules_bias: float = 6.0             # the shipped rules' prefix penalty (shape compile --bias), nats

    @classmethod
    def for_model(cls, model: str = "qwen", **given) -> "AntislopConfig":
        """The config for `model`: the fields `given` (None: not given), else the model's bundled
        defaults.toml, else the class defaults."""
        return cls(model=model, **{**model_defaults(model), **{k: v for k, v in given.items() if v is not None}})

    def __post_init__(self):
        if min(self.samples, self.rate_samples, self.max_new, self.verify_tokens) < 1:
            raise AntislopError("samples, rate_samples, max_new and verify_tokens must be >= 1")
        if self.corpus_tokens < 0 or self.word_holds < 0:
            raise AntislopError("corpus_tokens and word_holds must be >= 0")
        if not self.rules_bias > 0:
            raise AntislopError(f"rules_bias must be > 0, got {self.rules_bias!r}")

    @property
    def bundled(self) -> Path | None:
        """native/runs/data/NAME/ when `model` names a model with bundled inputs, else None."""
        name = str(self.model)
        return DATA / name if "/" not in name and (DATA / name).is_dir() else None

    def wfld_config(self):
        """solve wfld's settings of the run."""
        from exactedit.solvers.wfld.config import WfldConfig

        try:
            return WfldConfig(ridge=self.ridge, background=self.background, same_sense=self.same_sense_words(),
                              key=self.key, word_holds=self.word_holds, strength_grid=tuple(self.strength_grid))
        except ValueError as exc:
            raise AntislopError(str(exc)) from None

    def file(self, name: str) -> Path:
        return bundled_file(getattr(self, name), self.bundled, name, f"{name}.txt", self.model, AntislopError)

    def phrase_list(self) -> tuple[str, ...]:
        """The phrases solved for: the phrases file's lines, or discover's JSON's usable entries
        (each at its measured ban point), the first `top` of them."""
        from exactedit.solvers.phrases import PhraseError, load_phrases

        try:
            return load_phrases(self.file("phrases"), self.top)
        except PhraseError as exc:
            raise AntislopError(str(exc)) from None

    def watched(self) -> tuple[str, ...]:
        """The extra phrases of the rate measurement: --watch, else the bundled watch.txt, else none."""
        if self.watch is None and not (self.bundled and (self.bundled / "watch.txt").is_file()):
            return ()
        return _lines(self.file("watch"))

    def same_sense_words(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """solve wfld's same-sense words: --same-sense, else the bundled same_sense.txt, else none."""
        if self.same_sense is None and not (self.bundled and (self.bundled / "same_sense.txt").is_file()):
            return ()
        from exactedit.solvers.wfld.config import parse_same_sense

        path = self.file("same_sense")
        try:
            return tuple(parse_same_sense(line) for line in _lines(path))
        except ValueError as exc:
            raise AntislopError(f"{path}: {exc}") from None

    def template(self):
        """The chat template the demo renders with (quant.chat_template.GivenTemplate): --chat-template,
        else the bundled chat_template.jinja; None: the GGUF's own."""
        return bundled_template(self.chat_template, self.bundled)

    def text_files(self) -> tuple[Path, ...]:
        return text_files(self.texts, self.bundled)


def bundled_file(given, bundled: Path | None, flag: str, filename: str, model, error: type[Exception]) -> Path:
    """The file given for --FLAG, else the bundled model's `filename`; neither: `error` naming the flag."""
    if given is not None:
        return Path(given)
    path = (bundled or DATA / "-") / filename
    if not path.is_file():
        raise error(f"--{flag.replace('_', '-')}: not given, and {model!r} has no bundled {filename} (bundled "
                    f"inputs: {sorted(p.name for p in DATA.iterdir())}); give the file")
    return path


def bundled_template(given, bundled: Path | None):
    """The chat template a run renders with (quant.chat_template.GivenTemplate): the file given,
    else the bundled model's chat_template.jinja; None: the GGUF's own."""
    from exactedit.native.llamacpp.chat import given_template

    path = given
    if path is None and bundled and (bundled / "chat_template.jinja").is_file():
        path = bundled / "chat_template.jinja"
    return None if path is None else given_template(path)


def text_files(given, bundled: Path | None) -> tuple[Path, ...]:
    """The plain texts of a run: each given path, a directory standing for its *.txt files (sorted);
    none given: the bundled model's texts/ folder, if any."""
    if given is None:
        folder = (bundled or DATA / "-") / "texts"
        return tuple(sorted(folder.glob("*.txt"))) if folder.is_dir() else ()
    out: list[Path] = []
    for t in given:
        p = Path(t)
        out += sorted(p.glob("*.txt")) if p.is_dir() else [p]
    return tuple(out)


DEFAULTS_FILE = "defaults.toml"
_TUPLES = {"strength_grid": float, "texts": str}


def model_defaults(model: str) -> dict:
    """The bundled per-model settings (native/runs/data/NAME/defaults.toml: AntislopConfig field =
    value), {} when the model has none. An unknown field or a wrong type names the file and field."""
    path = DATA / str(model) / DEFAULTS_FILE
    if "/" in str(model) or not path.is_file():
        return {}
    return read_settings(path, AntislopConfig, AntislopError, exclude=("model",), tuples=_TUPLES)


def read_settings(path: Path, cls, error: type[Exception], *, exclude=(), tuples=None) -> dict:
    """A bundled TOML of `cls`'s fields (field = value), checked against each field's default: an
    unknown or excluded field, or a value of the wrong type, raises `error` naming the file and the
    field. `tuples`: field -> element type of the fields that are lists. A field whose default is
    None takes a string when its annotation says str."""
    import dataclasses
    import tomllib

    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise error(f"{path}: cannot read as TOML ({exc})") from None
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in exclude}
    tuples = tuples or {}
    out = {}
    for key, value in raw.items():
        if key not in fields:
            raise error(f"{path}: {key}: not a setting here (one of {sorted(fields)})")
        f = fields[key]
        default = f.default
        if key in tuples:
            if not isinstance(value, list) or not all(isinstance(v, (tuples[key], int)) for v in value):
                raise error(f"{path}: {key}: expected a list of {tuples[key].__name__}, got {value!r}")
            value = tuple(tuples[key](v) for v in value)
        else:
            want = str if default is None and str(f.type).startswith("str") else None if default is None else type(default)
            if want is not None and (isinstance(value, bool) != (want is bool) or (
                    not isinstance(value, want) and not (want is float and isinstance(value, int)))):
                raise error(f"{path}: {key}: expected {want.__name__}, got {value!r}")
        out[key] = float(value) if isinstance(default, float) else value
    return out
