"""A GBNF grammar (`exactedit shape export --format gbnf`) live on llama.cpp, through
llama-cpp-python's `Llama` class and its grammar sampler: replies to chat prompts with and without
the grammar (`GrammarModel`), and what the grammar costs (`grammar_cost`, `exactedit bench gbnf`).

The cost: three arms answer the same prompts with the same sampling: no grammar (the baseline), a
grammar that accepts any text (`root ::= [^\\x00]*`: the price of checking the vocabulary against a
grammar at every step, whatever the grammar), and the phrase grammar. The arms run in turn, their
order rotating over the repeats, after one untimed reply per prompt; each arm's best run (seconds
per token) is kept, by wall time and by this process's CPU time (steadier where other work shares
the machine). The grammar changes the replies and their lengths, so the ratio is of tokens per
second.

Two samplers: "chain", llama-cpp-python's own, which puts the grammar in its sampler chain ahead of
top-k, so every step checks the whole vocabulary against the grammar; and "check-first", greedy
decoding as llama.cpp's common sampler (behind llama-server and llama-cli) does it: the token drawn
without the grammar is checked alone, and the grammar runs over the vocabulary only when it is
refused (`GrammarModel.greedy_check_first`; the same tokens as the chain, greedy).
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from exactedit.native.llamacpp.engine import EngineError


@dataclass(frozen=True)
class GrammarReplies:
    """Replies to `prompts` (one per prompt, in order) under one sampling setting."""

    texts: tuple[str, ...]
    tokens: int                  # completion tokens, all replies
    seconds: float               # wall time of the generation calls
    cpu_seconds: float           # this process's CPU time in them (all its threads)


def grammar_parses(model, grammar: str) -> bool:
    """Whether llama.cpp's GBNF parser takes `grammar` (llama_sampler_init_grammar returns a sampler)
    for `model`'s vocabulary; the model is loaded for its vocabulary only."""
    llama_cpp = _llama_cpp()
    llm = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    try:
        smpl = llama_cpp.llama_sampler_init_grammar(llm._model.vocab, grammar.encode("utf-8"), b"root")
        if not smpl:
            return False
        llama_cpp.llama_sampler_free(smpl)
        return True
    finally:
        llm.close()


class GrammarModel:
    """A GGUF loaded once in llama-cpp-python's `Llama` (its own chat template) for grammar runs."""

    def __init__(self, model, *, n_ctx: int = 2048, n_threads: int = 2):
        llama_cpp = _llama_cpp()
        self._grammar_cls = llama_cpp.LlamaGrammar
        self._chat = None                # the GGUF's chat conventions, read on first use
        self.llm = llama_cpp.Llama(str(model), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                                   verbose=False)

    def __enter__(self) -> "GrammarModel":
        return self

    def __exit__(self, *exc) -> None:
        self.llm.close()

    def replies(self, prompts: Sequence[str], grammar: str | None, *, temperature: float = 0.0, seed: int = 0,
                max_new: int = 96, top_k: int = 40) -> GrammarReplies:
        """One reply per prompt (a user turn, the model's chat template), the grammar (GBNF text, or
        None) in the sampler chain; temperature 0 is greedy."""
        parsed = None if grammar is None else self._grammar_cls.from_string(grammar, verbose=False)
        texts, tokens, spent, cpu = [], 0, 0.0, 0.0
        for p in prompts:
            t0, c0 = time.perf_counter(), time.process_time()
            r = self.llm.create_chat_completion([{"role": "user", "content": p}], max_tokens=max_new,
                                                temperature=temperature, top_k=top_k, seed=seed, grammar=parsed)
            spent += time.perf_counter() - t0
            cpu += time.process_time() - c0
            texts.append(r["choices"][0]["message"]["content"] or "")
            tokens += int(r["usage"]["completion_tokens"])
        return GrammarReplies(tuple(texts), tokens, spent, cpu)

    def greedy_check_first(self, prompts: Sequence[str], grammar: str | None, *, max_new: int = 96) -> GrammarReplies:
        """Greedy replies drawn as llama.cpp's common sampler draws them (llama-server, llama-cli):
        the best token is picked without the grammar and checked alone; only when the grammar
        refuses it does the grammar run over the whole vocabulary, and the best token it allows is
        taken. The same tokens as the grammar in the chain (`replies` at temperature 0), at the
        price of one check per step where no phrase is being completed. Timed from the prompt's
        end: the prompt is evaluated afresh for each reply, whatever the grammar."""
        import ctypes

        import numpy as np

        from exactedit.native.llamacpp.chat import model_chat

        lib = _llama_cpp()
        llm, vocab, n = self.llm, self.llm._model.vocab, self.llm.n_vocab()
        chat = self._chat or model_chat(llm.model_path)
        self._chat = chat
        full = (lib.llama_token_data * n)()
        rows = np.ctypeslib.as_array(full)
        one = (lib.llama_token_data * 1)()
        ids = np.arange(n, dtype=np.int32)

        def apply(smpl, data, size) -> None:
            arr = lib.llama_token_data_array(ctypes.cast(data, lib.llama_token_data_p), size, -1, False)
            lib.llama_sampler_apply(smpl, ctypes.byref(arr))

        texts, tokens, spent, cpu = [], 0, 0.0, 0.0
        for p in prompts:
            llm.reset()
            llm.eval(llm.tokenize(chat.prompt(p).encode("utf-8"), add_bos=True, special=True))
            t0, c0 = time.perf_counter(), time.process_time()      # the replies' steps, not the prompt
            smpl = None if grammar is None else lib.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
            if grammar is not None and not smpl:
                raise EngineError("grammar", "gbnf", "llama.cpp's parser refused the grammar")
            out: list[int] = []
            try:
                for _ in range(max_new):
                    logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n,))
                    tok = int(np.argmax(logits))
                    if smpl is not None:
                        one[0].id, one[0].logit, one[0].p = tok, float(logits[tok]), 0.0
                        apply(smpl, one, 1)
                        if not np.isfinite(one[0].logit):           # refused: the grammar over the vocabulary
                            rows["id"], rows["logit"], rows["p"] = ids, logits, 0.0
                            apply(smpl, full, n)
                            tok = int(rows["id"][int(np.argmax(rows["logit"]))])
                        lib.llama_sampler_accept(smpl, tok)
                    if lib.llama_vocab_is_eog(vocab, tok):
                        break
                    out.append(tok)
                    llm.eval([tok])
            finally:
                if smpl:
                    lib.llama_sampler_free(smpl)
            spent += time.perf_counter() - t0
            cpu += time.process_time() - c0
            texts.append(llm.detokenize(out).decode("utf-8", errors="replace"))
            tokens += len(out)
        return GrammarReplies(tuple(texts), tokens, spent, cpu)


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError as exc:
        raise EngineError("llama_cpp", "import", f"llama-cpp-python is not installed ({exc}); pip install "
                          "-e '.[live]'") from None
    return llama_cpp


# ---- cost ----------------------------------------------------------------------------------------

PROMPTS = ("How do I read a CSV file in Python?", "Explain what a hash map is in two sentences.",
           "Give me an example of a Python list comprehension.", "How can I reverse a string in JavaScript?",
           "What is the difference between a list and a tuple?", "Give me three tips for writing clear emails.",
           "How do I find the largest file in a directory on Linux?", "What does a compiler do?")
ANY_TEXT = "root ::= [^\\x00]*\n"
ARMS = ("none", "any", "phrases")
SAMPLERS = ("chain", "check-first")


@dataclass(frozen=True)
class GrammarCostConfig:
    """The phrase grammar of compiled rules (`rules`) or of a phrase list (`phrases`: one per line,
    or discover's JSON, its first `top`)."""

    model: str                          # GGUF path (the CLI resolves public model names)
    rules: str | None = None
    phrases: str | None = None
    top: int | None = None
    case: str = "rules"
    sampler: str = "chain"              # "chain": llama-cpp-python's; "check-first": llama.cpp's (greedy)
    prompts: int = 4
    max_new: int = 64
    temperature: float = 0.0
    seed: int = 0
    repeats: int = 2
    threads: int = 2

    def __post_init__(self):
        for key in ("model", "rules", "phrases"):           # paths as text (the result is JSON)
            if getattr(self, key) is not None:
                object.__setattr__(self, key, str(getattr(self, key)))
        for key in ("prompts", "max_new", "repeats", "threads"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise EngineError("bench gbnf", key, f"expected a positive integer, got {v!r}")
        if self.prompts > len(PROMPTS):
            raise EngineError("bench gbnf", "prompts", f"expected 1..{len(PROMPTS)} (the bench's own prompts)")
        if (self.rules is None) == (self.phrases is None):
            raise EngineError("bench gbnf", "rules", "give compiled rules or a phrase list (one of them)")
        if self.sampler not in SAMPLERS:
            raise EngineError("bench gbnf", "sampler", f"expected one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if self.sampler == "check-first" and self.temperature != 0:
            raise EngineError("bench gbnf", "temperature", "the check-first sampler here is greedy: give temperature 0")


def phrase_grammar(cfg: GrammarCostConfig) -> tuple[str, int, int]:
    """(GBNF text, phrases, states) of the config's phrases."""
    from exactedit.solvers.phrases import load_phrases
    from exactedit.solvers.shaping import gbnf

    if cfg.rules is not None:
        from exactedit.solvers.shaping.compiled import read_compiled
        from exactedit.solvers.shaping.export import penalty_phrases

        phrases = [p.text for p in penalty_phrases(read_compiled(cfg.rules))[0]]
    else:
        phrases = list(load_phrases(cfg.phrases, cfg.top))
    dfa = gbnf.exclusion(gbnf.patterns(phrases, cfg.case), where=str(cfg.rules or cfg.phrases))
    return gbnf.render_gbnf(dfa), len(phrases), dfa.states


@dataclass(frozen=True)
class GrammarCost:
    config: GrammarCostConfig
    phrases: int
    states: int
    grammar_bytes: int
    build_s: float                      # automaton + GBNF text
    tokens: dict                        # arm -> completion tokens of its best run
    seconds: dict                       # arm -> its best run's wall time
    cpu_seconds: dict                   # arm -> its best run's CPU time (this process, all threads)
    runs: dict                          # arm -> [wall s, CPU s, tokens] of every run
    cpus: int

    def tps(self, arm: str) -> float:
        return self.tokens[arm] / self.seconds[arm]

    def cpu_tps(self, arm: str) -> float:
        return self.tokens[arm] / self.cpu_seconds[arm]

    @property
    def ratio(self) -> float:
        """Tokens/s with the phrase grammar over tokens/s without a grammar (wall time)."""
        return self.tps("phrases") / self.tps("none")

    @property
    def cpu_ratio(self) -> float:
        """The same in CPU time: steadier than wall time on a machine other work shares."""
        return self.cpu_tps("phrases") / self.cpu_tps("none")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tps={a: self.tps(a) for a in ARMS}, cpu_tps={a: self.cpu_tps(a) for a in ARMS}, ratio=self.ratio,
                 cpu_ratio=self.cpu_ratio, ratio_any=self.tps("any") / self.tps("none"),
                 cpu_ratio_any=self.cpu_tps("any") / self.cpu_tps("none"))
        return d


def grammar_cost(cfg: GrammarCostConfig, progress: Callable[[int, int], None] | None = None) -> GrammarCost:
    """The three arms on the bench's prompts, after one untimed reply per prompt (the model's pages
    and llama-cpp-python's prompt cache warm for every arm alike)."""
    t0 = time.perf_counter()
    text, n_phrases, states = phrase_grammar(cfg)
    build_s = time.perf_counter() - t0
    grammars = {"none": None, "any": ANY_TEXT, "phrases": text}
    prompts = PROMPTS[:cfg.prompts]
    runs: dict[str, list] = {a: [] for a in ARMS}
    total = cfg.repeats * len(ARMS)
    with GrammarModel(cfg.model, n_threads=cfg.threads) as m:
        m.replies(prompts, None, max_new=1)
        for rep in range(cfg.repeats):
            for k in range(len(ARMS)):
                arm = ARMS[(k + rep) % len(ARMS)]
                if cfg.sampler == "chain":
                    r = m.replies(prompts, grammars[arm], temperature=cfg.temperature, seed=cfg.seed,
                                  max_new=cfg.max_new)
                else:
                    r = m.greedy_check_first(prompts, grammars[arm], max_new=cfg.max_new)
                runs[arm].append([r.seconds, r.cpu_seconds, r.tokens])
                if progress is not None:
                    progress(rep * len(ARMS) + k + 1, total)
    wall = {a: min(runs[a], key=lambda x: x[0] / max(x[2], 1)) for a in ARMS}
    cpu = {a: min(runs[a], key=lambda x: x[1] / max(x[2], 1)) for a in ARMS}
    # tokens of the run kept: the same run for both times where it is best in both; else the
    # CPU-best run's tokens, its wall time scaled to them (the runs differ in tokens only by seed)
    tokens = {a: cpu[a][2] for a in ARMS}
    seconds = {a: wall[a][0] * tokens[a] / max(wall[a][2], 1) for a in ARMS}
    return GrammarCost(cfg, n_phrases, states, len(text.encode("utf-8")), build_s, tokens, seconds,
                       {a: cpu[a][1] for a in ARMS}, runs, os.cpu_count() or 0)


def render_grammar_cost(r: GrammarCost) -> str:
    c = r.config
    rows = [f"bench gbnf: {Path(c.model).name}, {c.sampler} sampler, {c.prompts} prompts, max_new {c.max_new}, "
            f"T {c.temperature}, {c.threads} threads, {r.cpus} cpus, best of {c.repeats}",
            f"  grammar: {Path(c.rules or c.phrases).name}: {r.phrases} phrases ({c.case} case), {r.states} states, "
            f"{r.grammar_bytes} bytes, built in {r.build_s:.2f} s"]
    names = {"none": "no grammar (baseline)", "any": "any-text grammar", "phrases": "phrase grammar"}
    for a in ARMS:
        rows.append(f"  {names[a]:24} {r.tokens[a]:5} tokens  {r.tps(a):7.2f} tok/s wall  {r.cpu_tps(a):7.2f} tok/s CPU"
                    f"  (runs, ms/token wall: {', '.join(f'{1000 * w / max(n, 1):.0f}' for w, _, n in r.runs[a])})")
    rows.append(f"  ratio (tokens/s against no grammar): phrase grammar {r.ratio:.3f} wall, {r.cpu_ratio:.3f} CPU; "
                f"any-text grammar {r.tps('any') / r.tps('none'):.3f} wall, "
                f"{r.cpu_tps('any') / r.cpu_tps('none'):.3f} CPU")
    return "\n".join(rows)
