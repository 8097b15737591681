"""The pre-registered evaluation protocol: a TOML file read into a frozen `Protocol`.

The file fixes, before any solve, which traces play which role, how pooled documents are split
(by source and character, never by row; seeded), the stopping rule, the bars and their thresholds
(SPEC.md section 7) and the edit-set rule. Its sha256 is what the ledger registers. The format is
documented in docs/evals.md; every error names the file, the field and what was expected.
`write_protocol` writes one (a TOML writer, every string escaped) and reads it back the same way.
"""
from __future__ import annotations

import hashlib
import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Mapping, Sequence

from exactedit.errors import FieldError
from exactedit.files import atomic_write_bytes, read_regular

TRACE_ROLES = ("pool", "train", "dev", "test", "blind", "anchors", "collateral")
SPLIT_KEYS = ("source", "character")
EDIT_SET_RULES = ("explicit", "top-train-style")
MAX_STEPS = 100_000              # a stopping rule's step budget: --max-steps 10^15 ran (and tracked) for ever
MAX_PROTOCOL_BYTES = 16 << 20    # a protocol (TOML, read whole): its phrase tuples as ids, 400k of them fit

Token = str | int


class ProtocolError(FieldError):
    """A protocol file is malformed or asks for something impossible."""


@dataclass(frozen=True)
class Trace:
    """One dump directory and the role of its documents."""

    name: str
    path: Path
    role: str
    domain: str = ""


@dataclass(frozen=True)
class SplitRule:
    """How pooled documents become train / dev / test: whole (source, character) groups, seeded."""

    by: tuple[str, ...] = SPLIT_KEYS
    seed: int = 0
    train: float = 0.6
    dev: float = 0.2
    test: float = 0.2
    same_doc_heldout: float = 0.33

    def __post_init__(self):
        if not self.by or any(k not in SPLIT_KEYS for k in self.by) or len(set(self.by)) != len(self.by):
            raise ValueError(f"split.by must be distinct keys from {SPLIT_KEYS}, got {list(self.by)}")
        shares = (self.train, self.dev, self.test)
        if any(not (0.0 <= s <= 1.0) for s in shares) or not math.isclose(sum(shares), 1.0, abs_tol=1e-9):
            raise ValueError(f"split.train + dev + test must be shares summing to 1, got {shares}")
        if not 0.0 <= self.same_doc_heldout < 1.0:
            raise ValueError(f"split.same_doc_heldout must be in [0, 1), got {self.same_doc_heldout}")


@dataclass(frozen=True)
class StoppingRule:
    """Every `every` steps up to `max_steps`: keep the last step with dev/train >= min_ratio and
    dev gain > min_dev_gain on the `metric` token class; if none qualifies, ship no edit. With a
    finite `max_dev_kl_off`, the rule also watches the mean dev KL off the style's decision rows
    (`bars.persona_decision`): the first checkpoint above it (or without a number) stops the
    search, so only the steps before it may be kept."""

    every: int = 5
    max_steps: int = 300
    metric: str = "style"
    min_ratio: float = 0.75
    min_dev_gain: float = 0.0
    max_dev_kl_off: float = math.inf

    def __post_init__(self):
        if self.every < 1 or self.max_steps < self.every:
            raise ValueError(f"stopping needs 1 <= every <= max_steps, got {self.every}, {self.max_steps}")
        if self.max_steps > MAX_STEPS:      # the solve runs every step (no early stop) and tracks each checkpoint
            raise ValueError(f"stopping.max_steps: {self.max_steps} is more than the {MAX_STEPS} steps a solve may "
                             "take (it runs them all, after the generation)")
        if self.metric not in ("style", "ordinary", "all"):
            raise ValueError(f"stopping.metric must be style, ordinary or all, got {self.metric!r}")
        if not self.max_dev_kl_off > 0:
            raise ValueError(f"stopping.max_dev_kl_off must be > 0 (inf: not watched), got {self.max_dev_kl_off}")

    @property
    def watches_kl(self) -> bool:
        return math.isfinite(self.max_dev_kl_off)

    def choose(self, steps: Sequence[int], train_gain: Sequence[float], dev_gain: Sequence[float], *,
               dev_kl_off: Sequence[float] | None = None) -> int | None:
        """The step the rule keeps from a trajectory, or None (ship no edit). `dev_kl_off`: each
        checkpoint's mean dev KL off the decision rows (needed when the rule watches it)."""
        if self.watches_kl and dev_kl_off is None:
            raise ValueError("stopping.max_dev_kl_off is set: the rule needs the dev KL off the decision rows")
        kls = dev_kl_off if self.watches_kl else [math.nan] * len(steps)
        chosen = None
        for step, tr, dv, kl in zip(steps, train_gain, dev_gain, kls, strict=True):
            if step % self.every or step > self.max_steps:
                continue
            if self.watches_kl and not kl <= self.max_dev_kl_off:     # NaN: nothing seen, so it stops too
                break
            if tr > 0 and dv > self.min_dev_gain and dv / tr >= self.min_ratio:
                chosen = step
        return chosen


@dataclass(frozen=True)
class Bars:
    """Thresholds of SPEC.md section 7 (letters as there) and of the blind sign-off."""

    slop_min_reduction: float = 0.5          # (a)-(c): 1 - mean p'(rejected) / mean p(rejected)
    new_argmax_max_special: int = 0          # (c): slop positions whose new argmax became a special
    collateral_min_mean: float = -0.05       # (d): each word's mean dlogp
    collateral_low: float = -0.10            # (d): an occurrence counts as low below this
    collateral_max_low_share: float = 0.10   # (d): each word's share of low occurrences
    collateral_min_uses: int = 5             # (d): a word with fewer uses is not measured: the bar fails
    engine_max_kld: float = 0.01             # (e): mean KLD vs base per eval domain
    max_special_flips: int = 0               # (f): argmax flips to specials, non-terminal rows
    turn_end_min_dlogp: float = -0.05        # (f): mean dlogp of the turn end at real turn ends
    chat_max_kld: float = 0.005              # (g): non-slop KLD on held-out chat
    ordinary_min_dlogp: float = -0.01        # (g): ordinary-token mean dlogp on held-out chat
    persona_min_ratio: float = 0.70          # persona: held-out / train gain on style tokens
    persona_max_kl: float = 0.005            # persona: blind and held-out KL (all rows)
    persona_decision: str = ""               # persona: role names of the style's decision rows (e.g. "step0")
    persona_max_kl_off: float = 0.005        # persona: the same KL off those rows (the verdict's, when registered)
    blind_factor: float = 1.5                # blind lands within this factor of the dev numbers
    bootstrap: int = 1000                    # resamples over documents
    ci_level: float = 0.95
    bootstrap_seed: int = 0

    def __post_init__(self):
        if not 0.0 < self.ci_level < 1.0:
            raise ValueError(f"bars.ci_level must be in (0, 1), got {self.ci_level}")
        if self.bootstrap < 0 or self.blind_factor < 1.0:
            raise ValueError("bars.bootstrap must be >= 0 and bars.blind_factor >= 1")
        if self.new_argmax_max_special < 0 or self.max_special_flips < 0:
            raise ValueError("bars' flip counts must be >= 0")
        if self.collateral_min_uses < 1:
            raise ValueError(f"bars.collateral_min_uses must be >= 1, got {self.collateral_min_uses}")
        from exactedit.dumps.format import ROLE_NAMES

        unknown = [n for n in (x.strip() for x in self.persona_decision.split(",")) if n and n not in ROLE_NAMES]
        if unknown:
            raise ValueError(f"bars.persona_decision: unknown row roles {unknown} (known: {', '.join(ROLE_NAMES)})")


@dataclass(frozen=True)
class EditSetRule:
    """Which output rows an edit may touch: an explicit list, or the train split's most frequent
    style tokens (never dev or test)."""

    rule: str = "top-train-style"
    count: int = 16
    tokens: tuple[Token, ...] = ()

    def __post_init__(self):
        if self.rule not in EDIT_SET_RULES:
            raise ValueError(f"edit_set.rule must be one of {EDIT_SET_RULES}, got {self.rule!r}")
        if self.rule == "explicit" and not self.tokens:
            raise ValueError("edit_set.rule = 'explicit' needs edit_set.tokens")
        if self.count < 1:
            raise ValueError(f"edit_set.count must be >= 1, got {self.count}")


@dataclass(frozen=True)
class TokenSets:
    """Token strings (as the model's table decodes them) or ids the bars and rules refer to."""

    specials: tuple[Token, ...] = ("<|im_end|>", "<|im_start|>", "<think>", "</think>", "<|endoftext|>")
    turn_end: Token = "<|im_end|>"
    style: tuple[Token, ...] = ()
    phrases: tuple[tuple[Token, ...], ...] = ()
    collateral_words: tuple[Token, ...] = ()

    def __post_init__(self):
        if any(len(p) < 2 for p in self.phrases):
            raise ValueError("every slop phrase needs a prefix and a final token (>= 2 tokens)")


@dataclass(frozen=True)
class Protocol:
    """A parsed protocol file. `sha256` is over the file's bytes: what the ledger registers."""

    path: Path
    sha256: str
    name: str
    traces: tuple[Trace, ...]
    split: SplitRule = field(default_factory=SplitRule)
    stopping: StoppingRule = field(default_factory=StoppingRule)
    bars: Bars = field(default_factory=Bars)
    edit_set: EditSetRule = field(default_factory=EditSetRule)
    tokens: TokenSets = field(default_factory=TokenSets)
    description: str = ""

    def __post_init__(self):
        names = [t.name for t in self.traces]
        if len(set(names)) != len(names):
            raise ValueError(f"trace names must be unique, got {names}")

    def trace(self, name: str) -> Trace:
        for t in self.traces:
            if t.name == name:
                return t
        raise ProtocolError(self.path, "traces", f"no trace named {name!r} (have {[t.name for t in self.traces]})")

    def word_list(self) -> tuple[Token, ...]:
        """The collateral words: as listed, else each phrase's final token."""
        if self.tokens.collateral_words:
            return self.tokens.collateral_words
        return tuple(dict.fromkeys(p[-1] for p in self.tokens.phrases))


_TOP_KEYS = {"name", "description", "traces", "split", "stopping", "bars", "edit_set", "tokens"}


def load_protocol(path) -> Protocol:
    """Read and validate a protocol file; raise ProtocolError naming the bad field. A regular file
    of at most MAX_PROTOCOL_BYTES (a FIFO or a device is refused, not waited on or read on)."""
    path = Path(path)
    return _parse(path, read_regular(path, MAX_PROTOCOL_BYTES, ProtocolError, "file"))


def write_protocol(path, name: str, traces: Sequence[Trace], *, description: str = "",
                   split: SplitRule | None = None, stopping: StoppingRule | None = None, bars: Bars | None = None,
                   edit_set: EditSetRule | None = None, tokens: TokenSets | None = None) -> Protocol:
    """Write a protocol file at `path` (written by tomli_w, so every string is escaped; *.tmp,
    fsync, rename) and return it as `load_protocol` reads it. Each section given is written whole;
    one left out takes its defaults when read. The text is validated before anything is written."""
    import tomli_w

    path = Path(path)
    doc: dict = {"name": name}
    if description:
        doc["description"] = description
    doc["traces"] = [{"name": t.name, "path": str(t.path), "role": t.role, **({"domain": t.domain} if t.domain else {})}
                     for t in traces]
    for key, value in (("split", split), ("stopping", stopping), ("bars", bars), ("edit_set", edit_set),
                       ("tokens", tokens)):
        if value is not None:
            doc[key] = {f.name: _toml_value(getattr(value, f.name)) for f in fields(value)}
    text = tomli_w.dumps(doc)
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:               # a path of bytes that are not UTF-8: no TOML holds it
        line = text.count("\n", 0, exc.start) + 1
        raise ProtocolError(path, "file", f"line {line} holds a lone surrogate ({ascii(exc.object[exc.start])}): a "
                            "path or name that is not UTF-8 text; no TOML file holds it") from None
    protocol = _parse(path, raw)
    atomic_write_bytes(path, raw)
    return protocol


def _toml_value(v):
    return [_toml_value(x) for x in v] if isinstance(v, (tuple, list)) else v


def _parse(path: Path, raw: bytes) -> Protocol:
    if len(raw) > MAX_PROTOCOL_BYTES:               # write_protocol: refused before writing, as reading would
        raise ProtocolError(path, "file", f"{len(raw)} bytes, over the limit of {MAX_PROTOCOL_BYTES}")
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProtocolError(path, "toml", f"not valid UTF-8 TOML: {exc}") from exc
    except RecursionError:
        raise ProtocolError(path, "toml", "not valid TOML (nested too deeply)") from None
    _no_unknown(path, "", doc, _TOP_KEYS)
    name = _get(path, doc, "name", str)
    if not name.strip():
        raise ProtocolError(path, "name", "expected a non-empty string")
    traces = tuple(_trace(path, i, t) for i, t in enumerate(_get(path, doc, "traces", list)))
    if not traces:
        raise ProtocolError(path, "traces", "expected at least one [[traces]] table")
    sections = {
        "split": (SplitRule, {"by": tuple}),
        "stopping": (StoppingRule, {}),
        "bars": (Bars, {}),
        "edit_set": (EditSetRule, {"tokens": tuple}),
        "tokens": (TokenSets, {"specials": tuple, "style": tuple, "collateral_words": tuple,
                               "phrases": lambda ps: tuple(tuple(p) for p in ps)}),
    }
    built = {key: _section(path, key, doc.get(key, {}), cls, conv) for key, (cls, conv) in sections.items()}
    try:
        return Protocol(path=path, sha256=hashlib.sha256(raw).hexdigest(), name=name, traces=traces,
                        description=str(doc.get("description", "")), **built)
    except ValueError as exc:
        raise ProtocolError(path, "traces", str(exc)) from exc


def _trace(path: Path, i: int, t) -> Trace:
    where = f"traces[{i}]"
    if not isinstance(t, dict):
        raise ProtocolError(path, where, "expected a table")
    _no_unknown(path, where, t, {"name", "path", "role", "domain"})
    role = _get(path, t, "role", str, where)
    if role not in TRACE_ROLES:
        raise ProtocolError(path, f"{where}.role", f"expected one of {TRACE_ROLES}, got {role!r}")
    rel = Path(_get(path, t, "path", str, where))
    return Trace(name=_get(path, t, "name", str, where), path=rel if rel.is_absolute() else path.parent / rel,
                 role=role, domain=str(t.get("domain", "")))


def _section(path: Path, key: str, table, cls, conv: Mapping):
    if not isinstance(table, dict):
        raise ProtocolError(path, key, "expected a table")
    known = set(cls.__dataclass_fields__)
    _no_unknown(path, key, table, known)
    kwargs = {}
    for name, value in table.items():
        default = cls.__dataclass_fields__[name].default
        if name in conv:
            if not isinstance(value, list):
                raise ProtocolError(path, f"{key}.{name}", f"expected an array, got {type(value).__name__}")
            _check_tokens(path, f"{key}.{name}", value)
            value = conv[name](value)
        elif isinstance(default, bool) or not _same_kind(default, value):
            raise ProtocolError(path, f"{key}.{name}",
                                f"expected {type(default).__name__}, got {type(value).__name__} {value!r}")
        kwargs[name] = float(value) if isinstance(default, float) else value
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise ProtocolError(path, key, str(exc)) from exc


def _same_kind(default, value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, (int, str)):
        return isinstance(value, type(default)) or (isinstance(default, str) and isinstance(value, int))
    return True


def _check_tokens(path: Path, where: str, values: list) -> None:
    for i, v in enumerate(values):
        items = v if isinstance(v, list) else [v]
        for x in items:
            if isinstance(x, bool) or not isinstance(x, (str, int)) or (isinstance(x, int) and x < 0):
                raise ProtocolError(path, f"{where}[{i}]", f"expected token strings or ids >= 0, got {x!r}")


def _get(path: Path, table: dict, key: str, kind: type, where: str = ""):
    name = f"{where}.{key}" if where else key
    if key not in table:
        raise ProtocolError(path, name, "missing")
    if not isinstance(table[key], kind):
        raise ProtocolError(path, name, f"expected {kind.__name__}, got {type(table[key]).__name__}")
    return table[key]


def _no_unknown(path: Path, where: str, table: dict, known: set) -> None:
    extra = sorted(set(table) - known)
    if extra:
        raise ProtocolError(path, where or "file", f"unknown keys {extra} (known: {sorted(known)})")


@dataclass(frozen=True)
class ResolvedTokens:
    """TokenSets as ids of one model's table."""

    specials: tuple[int, ...]
    turn_end: int
    style: tuple[int, ...]
    phrases: tuple[tuple[int, ...], ...]
    collateral_words: tuple[int, ...]
    edit_set: tuple[int, ...]


def resolve_tokens(protocol: Protocol, vocab: Sequence[str]) -> ResolvedTokens:
    """Map the protocol's token strings to ids of `vocab` (id -> decoded text); ids pass through."""
    index: dict[str, list[int]] = {}
    for i, text in enumerate(vocab):
        index.setdefault(text, []).append(i)

    def one(tok: Token, where: str) -> int:
        if isinstance(tok, int):
            if tok >= len(vocab):
                raise ProtocolError(protocol.path, where, f"token id {tok} >= vocabulary size {len(vocab)}")
            return tok
        ids = index.get(tok, [])
        if len(ids) != 1:
            what = "is not in" if not ids else f"is ambiguous ({len(ids)} ids) in"
            raise ProtocolError(protocol.path, where, f"token {tok!r} {what} the model's table")
        return ids[0]

    ts = protocol.tokens
    many = lambda toks, where: tuple(one(t, f"{where}[{i}]") for i, t in enumerate(toks))  # noqa: E731
    specials = many(ts.specials, "tokens.specials")
    turn_end = one(ts.turn_end, "tokens.turn_end")
    edit = many(protocol.edit_set.tokens, "edit_set.tokens")
    if set(edit) & set(specials) or turn_end in edit:
        raise ProtocolError(protocol.path, "edit_set.tokens", "special tokens are never in the edit set")
    return ResolvedTokens(
        specials=tuple(dict.fromkeys(specials + (turn_end,))), turn_end=turn_end,
        style=many(ts.style, "tokens.style"),
        phrases=tuple(many(p, f"tokens.phrases[{i}]") for i, p in enumerate(ts.phrases)),
        collateral_words=many(protocol.word_list(), "tokens.collateral_words"), edit_set=edit)
