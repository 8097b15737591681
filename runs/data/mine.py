"""`exactedit mine`: the model's own replies, their slop contexts, and phrase rates in free generation.

For each prompt the model's own chat template (from its GGUF, or the Jinja2 file given as
`chat_template`; rendered in Jinja2's sandbox) writes one user turn and the generation prompt
(the BOS prepended when the vocabulary adds one and the template did not write it); the engine samples `samples` replies (seeds
`seed`, `seed + 1`, ...) up to the model's turn end (or another end-of-generation token) or
`max_new` tokens (generation's door, native/llamacpp/sample.py; a reply cut at the cap is truncated and counted). Banned phrases are found by the toolkit's one
phrase matcher (solvers/phrases.py, the one `solve wfld` mines with): a *context* is a row
whose tokens end with a phrase's prefix, prefix-exact, and whose next token is its final token.

Replies with a context are written as one dump (prompt + reply per document, re-evaluated with the
dump's recorded settings) for `solve wfld`: tags `chat`, `slop` and the user's, row roles from the
model's turn framing (a truncated reply has no reply-end role), names stable across runs (the
prompt's hash and the seed), source `mine` and one character per prompt unless given, so
splits group a prompt's replies together.

Rates, per model (base, and `edited` on the same prompts and seeds): the phrase rates of
evals/rates/phrase_rates.py (replies containing each phrase, per 1,000 tokens, continuation at its
prefix, with bootstrap intervals over prompts, what follows the prefix, the tokens whose rate
moved most), and style rates (kaomoji, lowercase starts, slop starters, empty turns).

The generation loop takes a logits processor per side (`processors={"base": f, "edited": g}`,
native/llamacpp/sample.py): the hook sampler-side shaping plugs into. `reply_jobs` and `reply_stops`
are the door's jobs and stop tokens of `mine`, `dataset build` and `persona`'s sampling.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from exactedit.evals.rates.phrase_rates import PhraseRates, Reply, phrase_rates
from exactedit.evals.rates.style import KAOMOJI
from exactedit.native.llamacpp.capture import capture_dump
from exactedit.native.llamacpp.chat import ModelChat, model_chat, prompt_tokens, reply_name, short_hash
from exactedit.native.llamacpp.documents import labelled
from exactedit.native.llamacpp.generate import Generation, Sampling
from exactedit.native.llamacpp.sample import LogitsProcessor, sample_replies
from exactedit.native.llamacpp.engine import EngineError, EngineSettings, LlamaEngine
from exactedit.solvers.phrases import PhraseMatcher, Span, TokenBytes, parse_phrases

Progress = Callable[[int, int], None]
DEFAULT_STARTERS = ("Certainly", "Sure", "Absolutely", "Of course", "Great question", "Great")


@dataclass(frozen=True)
class MineConfig:
    sampling: Sampling = Sampling(max_new=256)   # how each reply is sampled; its seed is the first reply's
    samples: int = 1                      # replies per prompt (seeds seed, seed + 1, ...)
    starters: tuple[str, ...] = DEFAULT_STARTERS
    capitalized: bool = True
    tags: tuple[str, ...] = ()            # added to the dump's documents (beside chat, slop)
    source: str = "mine"
    character: str | None = None          # None: one character per prompt ("p-" + its hash)
    n_boot: int = 1000
    level: float = 0.95
    chat_fallback: str | None = None      # the framing when the model's template is refused (native.llamacpp.chat)
    chat_template: str | None = None      # a Jinja2 chat template file, used instead of the model's (native.llamacpp.chat)

    def __post_init__(self):
        if self.samples < 1 or self.n_boot < 0 or not 0 < self.level < 1:
            raise EngineError("MineConfig", "values", "samples >= 1, n_boot >= 0 and 0 < level < 1")
        for name in ("starters", "tags"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not isinstance(self.sampling, Sampling):
            raise EngineError("MineConfig", "sampling", f"expected a Sampling, got {type(self.sampling).__name__}")

    def seeds(self) -> tuple[int, ...]:
        return tuple(self.sampling.seed + s for s in range(self.samples))


@dataclass(frozen=True)
class SlopContext:
    doc: str
    row: int              # the dump row that predicts the rejected token (global row index)
    phrase: str
    rejected: int


@dataclass(frozen=True)
class StyleRates:
    replies: int
    kaomoji: float
    lowercase_start: float
    slop_starter: float
    empty_step0: float


@dataclass(frozen=True)
class ReplyInfo:
    name: str
    prompt: int
    seed: int
    tokens: int
    stop: str
    text: str


@dataclass(frozen=True)
class MineResult:
    dump: str | None
    contexts: tuple[SlopContext, ...]
    replies: tuple[ReplyInfo, ...]
    rates: dict[str, StyleRates]
    phrase_rates: PhraseRates
    chat: dict = field(default_factory=dict)
    edited_replies: tuple[ReplyInfo, ...] = ()

    def to_dict(self) -> dict:
        pr = self.phrase_rates.to_dict()
        return {"dump": self.dump, "contexts": [asdict(c) for c in self.contexts],
                "replies": [asdict(r) for r in self.replies],
                "edited_replies": [asdict(r) for r in self.edited_replies],
                "rates": {k: asdict(v) for k, v in self.rates.items()},
                **{k: v for k, v in pr.items() if k != "replies"}, "chat": self.chat}


def style_rates(texts: Sequence[str], first_tokens_eog: Sequence[bool], starters: Sequence[str]) -> StyleRates:
    n = len(texts)
    if n == 0:
        return StyleRates(0, 0.0, 0.0, 0.0, 0.0)
    letters = [next((c for c in t if c.isalpha()), "") for t in texts]
    return StyleRates(n, sum(bool(KAOMOJI.search(t)) for t in texts) / n,
                      sum(c.islower() for c in letters) / n,
                      sum(t.lstrip().startswith(tuple(starters)) for t in texts) / n,
                      sum(bool(e) for e in first_tokens_eog) / n)


def reply_jobs(prompt_tokens: Sequence[np.ndarray], cfg: MineConfig) -> list[tuple[np.ndarray, Sampling]]:
    """The door's jobs (native/llamacpp/sample.py): per prompt, one per seed (`cfg.seeds()`), the
    prompt's in a row; `by_prompt` groups the replies back."""
    return [(p, replace(cfg.sampling, seed=int(seed))) for p in prompt_tokens for seed in cfg.seeds()]


def reply_stops(chat: ModelChat, engine: LlamaEngine) -> tuple[int, ...]:
    """The tokens a reply stops after: the model's own ends of generation, and any special
    llama.cpp also ends generation on; refused when there is none (a reply could only end at max_new)."""
    sp = chat.specials
    stops = tuple(sorted(set(sp.end_of_generation) | {t for t in sp.specials if engine.is_eog(t)}))
    if not stops:
        raise EngineError(engine.path, "stop_ids", "no stop token: a reply could only end at max_new")
    return stops


def by_prompt(gens: Sequence[Generation], samples: int) -> list[list[Generation]]:
    """The replies of `reply_jobs`' jobs, per prompt (one per seed)."""
    return [list(gens[i:i + samples]) for i in range(0, len(gens), samples)]


def _sample(model, ptoks, chat: ModelChat, cfg: MineConfig, settings: EngineSettings,
            processor: LogitsProcessor | None, progress: Progress | None, sequential: bool) -> list[list[Generation]]:
    """Per prompt, one reply per seed on `model`, to its turn end (the hook: `processor`); batched
    unless there is a processor or `sequential` (native/llamacpp/sample.py)."""
    with LlamaEngine(model, settings) as engine:
        gens = sample_replies(engine, reply_jobs(ptoks, cfg), stop_ids=reply_stops(chat, engine),
                              turn_end=chat.specials.turn_end, processor=processor, sequential=sequential,
                              progress=progress)
    return by_prompt(gens, cfg.samples)


def reply_infos(prompts, samples, chat: ModelChat) -> tuple[ReplyInfo, ...]:
    return tuple(ReplyInfo(reply_name(p, s.seed), i, s.seed, int(s.tokens.size), s.stop,
                           chat.table.decode([t for t in s.tokens if t not in chat.specials.end_of_generation]))
                 for i, (p, row) in enumerate(zip(prompts, samples)) for s in row)


def _style(samples, infos, chat: ModelChat, starters) -> StyleRates:
    flat = [s for row in samples for s in row]
    eog = [bool(s.tokens.size) and int(s.tokens[0]) in set(chat.specials.end_of_generation) for s in flat]
    return style_rates([r.text for r in infos], eog, starters)


def _replies(samples) -> list[Reply]:
    return [Reply(i, s.seed, s.prompt, s.tokens, s.truncated) for i, row in enumerate(samples) for s in row]


def run_mine(model, prompts: Sequence[str], phrases: Sequence[str], out=None, *, edited=None,
         config: MineConfig | None = None, settings: EngineSettings | None = None,
         processors: Mapping[str, LogitsProcessor] | None = None, overwrite: bool = False,
         progress: Progress | None = None) -> MineResult:
    cfg = config or MineConfig()
    settings = settings or EngineSettings()
    processors = dict(processors or {})
    if not prompts:
        raise EngineError(model, "prompts", "no prompts")
    phrases = parse_phrases(list(phrases), "phrases")
    chat = model_chat(model, fallback=cfg.chat_fallback, template=cfg.chat_template)
    prompt_texts = [chat.prompt(p) for p in prompts]
    with LlamaEngine(model, settings) as engine:
        ptoks = [prompt_tokens(engine, t, engine.bos_if_added()) for t in prompt_texts]
    total = len(prompts) * cfg.samples * (2 if edited is not None else 1)
    tick = None if progress is None else (lambda d, _t: progress(d, total))
    # every side through the same loop: with a processor on one side, all run one reply at a time
    one_by_one = any(f is not None for f in processors.values())
    base = _sample(model, ptoks, chat, cfg, settings, processors.get("base"), tick, one_by_one)
    infos = reply_infos(prompts, base, chat)
    rates = {"base": _style(base, infos, chat, cfg.starters)}
    matcher = PhraseMatcher(phrases, TokenBytes(chat.table), cfg.capitalized)
    ed, ed_infos = None, ()
    if edited is not None:
        off = len(prompts) * cfg.samples
        tick2 = None if progress is None else (lambda d, _t: progress(off + d, total))
        ed = _sample(edited, ptoks, chat, cfg, settings, processors.get("edited"), tick2, one_by_one)
        ed_infos = reply_infos(prompts, ed, chat)
        rates["edited"] = _style(ed, ed_infos, chat, cfg.starters)
    pr = phrase_rates(matcher, _replies(base), None if ed is None else _replies(ed), capitalized=cfg.capitalized,
                      n_boot=cfg.n_boot, level=cfg.level, seed=cfg.sampling.seed)
    docs, contexts, first = [], [], 0
    for i, (p, row) in enumerate(zip(prompts, base)):
        for s in row:
            seq = s.sequence
            start = s.prompt.size - 1
            found = [(t, pi) for t, pi, _ in matcher.find(seq, np.append(seq[1:], -1), [Span(start, seq.size)])]
            if not found:
                continue
            name = reply_name(p, s.seed)
            char = cfg.character if cfg.character is not None else f"p-{short_hash(p)}"
            docs.append(labelled(chat, name, seq, source=cfg.source, character=char, tags=("slop", *cfg.tags),
                                 kind="chat"))
            contexts += [SlopContext(name, first + t, phrases[pi], int(seq[t + 1])) for t, pi in sorted(found)]
            first += seq.size
    dump = None
    if out is not None and docs:
        meta = {"mine": {"phrases": list(phrases), "prompts": [short_hash(p) for p in prompts],
                         "config": {**asdict(cfg), "starters": list(cfg.starters), "tags": list(cfg.tags)},
                         "contexts": [asdict(c) for c in contexts],
                         "truncated": sum(s.truncated for row in base for s in row)},
                "chat": chat.to_dict()}
        dump = str(capture_dump(model, docs, out, settings=settings, overwrite=overwrite, extra_meta=meta).path)
    return MineResult(dump, tuple(contexts), infos, rates, pr, chat.to_dict(), ed_infos)


def reply_record(side: str, x: ReplyInfo, prompts: Sequence[str] | None = None) -> dict:
    """One reply as a record: side, name, prompt (its text when `prompts` is given, else its index),
    seed, tokens, stop, text. The shape `exactedit discover` reads as model text."""
    return {"side": side, "name": x.name, "prompt": prompts[x.prompt] if prompts is not None else x.prompt,
            "seed": x.seed, "tokens": x.tokens, "stop": x.stop, "text": x.text}


def reply_records(r: MineResult, prompts: Sequence[str] | None = None) -> list[dict]:
    """Every reply of a mine run (base, then edited) as a `reply_record`."""
    return [reply_record(side, x, prompts) for side, xs in (("base", r.replies), ("edited", r.edited_replies))
            for x in xs]


def replies_json(records: Sequence[dict], path, shrink: str) -> str:
    """`records` (`reply_record`s) as the JSON text `exactedit discover` reads as model text; where
    discover would refuse to read it back (evals/discover/sources.py `over_limits`: its bytes, its
    records, its texts' characters, its longest record), EngineError naming `path`, the limit and
    `shrink` (the options that make it smaller), and nothing is written."""
    import json
    import re

    from exactedit.evals.discover.sources import over_limits

    text = json.dumps(list(records), indent=1, ensure_ascii=False) + "\n"
    # at indent 1 a record alone opens a line " {" and closes one " }" (strings escape their newlines);
    # discover measures a record from its "{" to its "}"
    opens = [m.end() - 2 for m in re.finditer("\n {\n", text)]
    closes = [m.end() for m in re.finditer("\n }(?=,?\n)", text)]
    longest = max((b - a for a, b in zip(opens, closes, strict=True)), default=0)
    why = over_limits(len(text.encode("utf-8")), len(records), sum(len(x.get("text") or "") for x in records),
                      longest)
    if why is not None:
        raise EngineError(path, "replies", f"{why}: `exactedit discover --model-text` would refuse to read it; "
                                           f"give {shrink}")
    return text


def write_replies(r: MineResult, prompts: Sequence[str] | None, path) -> None:
    """`reply_records` as JSON at `path`, written atomically; refused before writing where discover
    would not read it back (`replies_json`)."""
    from exactedit.files import atomic_write_text

    atomic_write_text(path, replies_json(reply_records(r, prompts), path, "a smaller --max-new or --samples, or "
                                                                          "fewer prompts"))


def render_mine(r: MineResult) -> str:
    """The text report: replies and contexts, the phrase rates table, the style rates."""
    from exactedit.evals.rates.report import render_phrase_rates

    cut = sum(x.stop == "max_new" for x in r.replies)
    out = [f"{len(r.replies)} replies ({cut} cut at --max-new, no turn end), {len(r.contexts)} slop contexts"
           + (f", dump {r.dump}" if r.dump else "")]
    out += [f"  {c.doc:24} row {c.row:6}  {c.phrase!r}" for c in r.contexts]
    out += ["", render_phrase_rates(r.phrase_rates), ""]
    out += [f"{name:7} kaomoji {s.kaomoji:.3f}  lowercase start {s.lowercase_start:.3f}  slop starter "
            f"{s.slop_starter:.3f}  empty step0 {s.empty_step0:.3f}  ({s.replies} replies)"
            for name, s in r.rates.items()]
    return "\n".join(out)
