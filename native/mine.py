"""`exactedit mine`: slop contexts from the model's own text, and the style rates of a generation.

For each prompt (a ChatML user turn) the engine samples a reply (seeded). In each reply a
banned phrase ("rather than", "end to") is found *prefix-exact* in token space: the phrase is
tokenized as it appears mid-sentence (with a leading space); a position t is a slop context when
the tokens before it equal the phrase's prefix tokens and the token at t is its final token
(the rejected one). Replies with at least one slop context are written as one dump (prompt +
reply per document, re-evaluated with the dump's own recorded settings) for `solve wfld`; the
rows and phrase of every context are returned and stored in the dump's meta.

Style rates of the free generation, per model (base, and edited when given, same prompts and
seeds): replies containing a kaomoji, replies starting lowercase, replies starting with a slop
starter, and empty turns (end of turn as the very first token).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from exactedit.native.capture import CaptureDoc, capture_dump
from exactedit.native.llamacpp import EngineError, EngineSettings, LlamaEngine

Progress = Callable[[int, int], None]
KAOMOJI = re.compile(r"[(（][^()（）\n]{0,8}[\^＾ω・ᴗ◕‿°ᵕ•ﾟ▽´`ｰ][^()（）\n]{0,8}[)）]|[ヽ╯ツ٩۶]")
DEFAULT_STARTERS = ("Certainly", "Sure", "Absolutely", "Of course", "Great question", "Great")


@dataclass(frozen=True)
class MineConfig:
    max_new: int = 96
    temperature: float = 0.8
    top_k: int = 40
    seed: int = 0
    samples: int = 1                      # replies per prompt (seeds seed, seed + 1, ...)
    starters: tuple[str, ...] = DEFAULT_STARTERS

    def __post_init__(self):
        if self.max_new < 1 or self.samples < 1 or self.top_k < 1 or not self.temperature > 0:
            raise EngineError("MineConfig", "values", "max_new, samples, top_k >= 1 and temperature > 0")
        object.__setattr__(self, "starters", tuple(self.starters))


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
class MineResult:
    dump: str | None
    contexts: tuple[SlopContext, ...]
    replies: tuple[str, ...]
    rates: dict[str, StyleRates] = field(default_factory=dict)


def chatml(prompt: str) -> str:
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def phrase_tokens(engine: LlamaEngine, phrase: str) -> np.ndarray:
    toks = engine.tokenize(" " + phrase.strip(), parse_special=False)
    if toks.size < 2:
        raise EngineError(phrase, "phrase", "tokenizes to fewer than 2 tokens: no prefix to match")
    return toks


def find_contexts(seq: np.ndarray, phrase: np.ndarray, start: int) -> list[int]:
    """Positions t >= start (the rejected token's index in seq) where seq matches `phrase` ending at t."""
    k = phrase.size
    return [t for t in range(max(start, k - 1), seq.size)
            if np.array_equal(seq[t - k + 1:t + 1], phrase)]


def style_rates(texts: Sequence[str], first_tokens_eog: Sequence[bool], starters: Sequence[str]) -> StyleRates:
    n = len(texts)
    if n == 0:
        return StyleRates(0, 0.0, 0.0, 0.0, 0.0)
    letters = [next((c for c in t if c.isalpha()), "") for t in texts]
    return StyleRates(n, sum(bool(KAOMOJI.search(t)) for t in texts) / n,
                      sum(c.islower() for c in letters) / n,
                      sum(t.lstrip().startswith(tuple(starters)) for t in texts) / n,
                      sum(bool(e) for e in first_tokens_eog) / n)


def _generate_all(engine: LlamaEngine, prompts, cfg: MineConfig, progress):
    runs, total = [], len(prompts) * cfg.samples
    for i, prompt in enumerate(prompts):
        ptoks = engine.tokenize(chatml(prompt))
        for s in range(cfg.samples):
            reply = engine.generate(ptoks, max_new=cfg.max_new, temperature=cfg.temperature,
                                    top_k=cfg.top_k, seed=cfg.seed + s)
            runs.append((f"p{i}s{s}", ptoks, reply))
            if progress is not None:
                progress(len(runs), total)
    return runs


def _text(engine: LlamaEngine, toks) -> str:
    return b"".join(engine.piece(int(t)) for t in toks).decode("utf-8", "replace")


def mine(model, prompts: Sequence[str], phrases: Sequence[str], out=None, *, edited=None,
         config: MineConfig | None = None, settings: EngineSettings | None = None,
         overwrite: bool = False, progress: Progress | None = None) -> MineResult:
    cfg = config or MineConfig()
    settings = settings or EngineSettings()
    if not prompts:
        raise EngineError(model, "prompts", "no prompts")
    with LlamaEngine(model, settings) as engine:
        ptoks = {p: phrase_tokens(engine, p) for p in phrases}
        runs = _generate_all(engine, prompts, cfg, progress)
        texts = [_text(engine, r) for _, _, r in runs]
        eog = [bool(r.size) and bool(engine._lib.llama_vocab_is_eog(engine._vocab, int(r[0]))) for _, _, r in runs]
    rates = {"base": style_rates(texts, eog, cfg.starters)}
    if edited is not None:
        with LlamaEngine(edited, settings) as e2:
            runs2 = _generate_all(e2, prompts, cfg, None)
            texts2 = [_text(e2, r) for _, _, r in runs2]
            eog2 = [bool(r.size) and bool(e2._lib.llama_vocab_is_eog(e2._vocab, int(r[0]))) for _, _, r in runs2]
        rates["edited"] = style_rates(texts2, eog2, cfg.starters)
    docs, contexts, first = [], [], 0
    for name, p, r in runs:
        seq = np.concatenate([p, r])
        found = [(t, ph) for ph, toks in ptoks.items() for t in find_contexts(seq, toks, p.size)]
        if not found:
            continue
        docs.append(CaptureDoc(name, seq, source="mine", character=name, tags=("slop",)))
        contexts += [SlopContext(name, first + t - 1, ph, int(seq[t])) for t, ph in sorted(found)]
        first += seq.size
    dump = None
    if out is not None and docs:
        meta = {"mine": {"phrases": list(phrases), "config": {**cfg.__dict__, "starters": list(cfg.starters)},
                         "contexts": [c.__dict__ for c in contexts]}}
        res = capture_dump(model, docs, out, settings=settings, overwrite=overwrite, extra_meta=meta)
        dump = str(res.path)
    return MineResult(dump, tuple(contexts), tuple(texts), rates)
