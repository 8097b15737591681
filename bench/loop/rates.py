"""`exactedit bench loop`: the antislop loop's engine-bound work on a small fixed workload, each part
beside the engine's own ceiling measured in the same run on the same machine, as ratios.

- `generate` (the data and rates stages' replies): the one batched loop, `sample_replies` (native/
  llamacpp/sample.py), against llama.cpp's batched generation with the same slots, jobs and sampler
  chain (native/llamacpp/ceiling.py `plain_generate`). No stop token on either side: every reply
  runs to `max_new` tokens, so both generate the same number of tokens from the same prompts.
- `capture` (the data and corpus stages' dumps): `capture_dump` of the corpus windows (a fresh
  engine, the model hashed, one context for all windows, `LlamaEngine.sequences`, the tail's rows
  copied off the graph, the dump written), `evaluate` (the same windows through
  `LlamaEngine.evaluate` on an open engine with the capture: a fresh context per window, as
  capture_dump ran them before it opened one context for all), and `corpus` (the corpus stage end to
  end, `build_corpus`: the bundled English tokenized, the windows planned, captured and written) against llama.cpp
  prefilling the same windows in one context at the same n_batch (`plain_prefill`).
- `vocab pass` (the solve's exact full-vocabulary pass): `exactedit bench head` at the model's head
  shape (its width rounded up to a Q6_K block), the streaming pass against numpy sgemm.
Each rate is work per second (tokens generated, tokens prefilled, rows x vocabulary scored); each
ratio is ours over the ceiling's rate (1.0: the engine's speed). The corpus uses the bundled English
only (not the stdlib's docstrings, which take minutes to tokenize) and the bench's own phrases.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from exactedit.native.llamacpp.engine import EngineError, EngineSettings
from exactedit.native.llamacpp.sample import DEFAULT_SLOTS

Progress = Callable[[int, int], None]

# phrases whose final words are common in ordinary English: the corpus finds uses of each
PHRASES = ("it is important to note", "plays a crucial role", "a wide range of", "on the other hand",
           "at the end of the day", "as a result", "in today's world", "in order to")
STEPS = ("generate", "capture", "evaluate", "corpus", "vocab pass")


@dataclass(frozen=True)
class LoopBenchConfig:
    model: str                          # GGUF path (the CLI resolves public model names)
    phrases: int = 4                    # the first N of PHRASES: the corpus's words
    prompts: int = 4                    # of bench/generate.py's PROMPTS
    samples: int = 2                    # replies per prompt
    max_new: int = 48
    slots: int = DEFAULT_SLOTS
    temperature: float = 0.8
    top_k: int = 40
    corpus_tokens: int = 1024           # the corpus windows' prefill budget (dataset corpus --max-tokens)
    head_rows: int = 256                # rows of the vocab pass
    repeats: int = 1                    # alternating repeats of each pair; best kept
    settings: EngineSettings = EngineSettings()

    def __post_init__(self):
        from exactedit.bench.generate import PROMPTS

        for key in ("phrases", "prompts", "samples", "max_new", "slots", "top_k", "corpus_tokens", "head_rows",
                    "repeats"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise EngineError("bench loop", key, f"expected a positive integer, got {v!r}")
        if self.phrases > len(PHRASES):
            raise EngineError("bench loop", "phrases", f"expected 1..{len(PHRASES)} (the bench's own phrases)")
        if self.prompts > len(PROMPTS):
            raise EngineError("bench loop", "prompts", f"expected 1..{len(PROMPTS)} (the bench's own prompts)")
        if not self.temperature >= 0:
            raise EngineError("bench loop", "temperature", f"expected >= 0, got {self.temperature!r}")
        if not isinstance(self.settings, EngineSettings):
            raise EngineError("bench loop", "settings", "expected an EngineSettings")


@dataclass(frozen=True)
class StepRate:
    """One part of the loop beside its ceiling: `work` units in `seconds` (rate = work / seconds)
    against the ceiling's same work in `ceiling_seconds`; ratio = rate / ceiling_rate."""

    step: str
    stages: str             # the antislop stages it stands for
    work: int
    unit: str
    seconds: float
    rate: float
    ceiling: str            # what the baseline is
    ceiling_seconds: float
    ceiling_rate: float
    ratio: float


@dataclass(frozen=True)
class LoopBenchResult:
    config: LoopBenchConfig
    n_vocab: int
    n_embd: int
    replies: int
    windows: int
    steps: tuple[StepRate, ...]
    cpus: int
    gpu_offload: bool       # llama-cpp-python built with a GPU backend

    def to_dict(self) -> dict:
        d = asdict(self)
        d["config"]["settings"] = self.config.settings.as_meta()
        d["config"]["settings"]["n_gpu_layers"] = self.config.settings.n_gpu_layers
        return {"bench": "loop", **d, "ratios": {s.step: s.ratio for s in self.steps}}


def _best(fns: dict[str, Callable[[], object]], repeats: int, tick) -> tuple[dict[str, float], dict[str, object]]:
    """Each callable's best time over `repeats`, the order alternating; the last value of each."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    vals: dict[str, object] = {}
    names = list(fns)
    for rep in range(repeats):
        for k in (names if rep % 2 == 0 else names[::-1]):
            t = time.perf_counter()
            vals[k] = fns[k]()
            times[k].append(time.perf_counter() - t)
            tick()
    return {k: min(v) for k, v in times.items()}, vals


def _step(step, stages, work, unit, seconds, ceiling, ceiling_work, ceiling_seconds) -> StepRate:
    if work != ceiling_work:
        raise EngineError("bench loop", step, f"ours did {work} {unit}, the ceiling {ceiling_work}: not the same work")
    rate, top = work / seconds, ceiling_work / ceiling_seconds
    return StepRate(step, stages, int(work), unit, seconds, rate, ceiling, ceiling_seconds, top, rate / top)


def _prompt_tokens(engine, path, n: int):
    from exactedit.bench.generate import PROMPTS
    from exactedit.native.llamacpp.chat import model_chat

    chat = model_chat(path)
    if chat.template is not None:
        return [engine.tokenize(chat.prompt(p)) for p in PROMPTS[:n]]
    return [engine.tokenize(f"Question: {p}\nAnswer:") for p in PROMPTS[:n]]


def run_loop_bench(cfg: LoopBenchConfig, progress: Progress | None = None) -> LoopBenchResult:
    from exactedit.bench.head import BenchHeadConfig, run_bench_head
    from exactedit.dumps import read_dump
    from exactedit.native.llamacpp.capture import CaptureDoc, capture_dump, tail_names
    from exactedit.native.llamacpp.ceiling import plain_generate, plain_prefill
    from exactedit.native.llamacpp.engine import LlamaEngine, gpu_offload
    from exactedit.native.llamacpp.generate import Sampling
    from exactedit.native.llamacpp.sample import sample_replies
    from exactedit.runs.data.corpus import CorpusConfig, build_corpus

    from exactedit.quant import gguf
    from exactedit.quant.model import arch

    path, s = Path(cfg.model), cfg.settings
    total, done = 6 * cfg.repeats + 1, [0]      # per repeat: 2 generation runs, the corpus, 3 prefill runs

    def tick():
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    steps = []
    with tempfile.TemporaryDirectory(prefix="exactedit-bench-loop-") as tmp:
        tmp = Path(tmp)
        with LlamaEngine(path, s) as engine:
            n_vocab, n_embd = engine.n_vocab, engine.n_embd
            jobs = [(p, Sampling(cfg.max_new, cfg.temperature, cfg.top_k, seed))
                    for p in _prompt_tokens(engine, path, cfg.prompts) for seed in range(cfg.samples)]
            sample_replies(engine, [(jobs[0][0], Sampling(1, cfg.temperature, cfg.top_k, 0))])   # warm the pages
            best, vals = _best({
                "ours": lambda: sum(g.tokens.size for g in sample_replies(engine, jobs, stop_ids=(),
                                                                          slots=cfg.slots)),
                "ceiling": lambda: plain_generate(engine, jobs, cfg.slots)}, cfg.repeats, tick)
            steps.append(_step("generate", "data, rates", vals["ours"], "tokens generated", best["ours"],
                               f"llama.cpp batched generation, {min(cfg.slots, len(jobs))} slots, same chain",
                               vals["ceiling"], best["ceiling"]))

        # the corpus stage end to end, once per repeat (it writes its dumps), and its windows
        runs = []

        def corpus():
            out = tmp / f"corpus-{len(runs)}"
            res = build_corpus(path, PHRASES[:cfg.phrases], out, settings=s,
                               config=CorpusConfig(max_tokens=cfg.corpus_tokens, stdlib=False))
            runs.append(res)
            return sum(p.rows for p in res.parts)

        best_c, vals_c = _best({"corpus": corpus}, cfg.repeats, tick)
        with gguf.open(path) as g:
            layer = arch.detect_tail(g).layer
        with LlamaEngine(path, s) as engine:
            windows = []
            for part in runs[-1].parts:
                if part.dump:
                    d = read_dump(part.dump)
                    windows += [d.tokens[doc.first_row:doc.stop].copy() for doc in d.docs]
            if not windows:
                raise EngineError(path, "corpus", "no window: the bench's phrases have no use in the corpus")
            docs = [CaptureDoc(f"w{i}", w, tags=("corpus",)) for i, w in enumerate(windows)]

            def capture():
                out = tmp / f"capture-{time.perf_counter_ns()}"
                return capture_dump(path, docs, out, settings=s, keep_logits=False).rows

            def evaluate():
                return sum(engine.evaluate(w, capture=tail_names(layer)).tokens.size for w in windows)

            best_w, vals_w = _best({"capture": capture, "evaluate": evaluate,
                                    "ceiling": lambda: plain_prefill(engine, windows)}, cfg.repeats, tick)
        top = f"llama.cpp prefill of the same windows, one context, n_batch {s.n_batch}"
        steps.append(_step("capture", "data, corpus", vals_w["capture"], "tokens prefilled", best_w["capture"], top,
                           vals_w["ceiling"], best_w["ceiling"]))
        steps.append(_step("evaluate", "data, corpus", vals_w["evaluate"], "tokens prefilled", best_w["evaluate"],
                           top, vals_w["ceiling"], best_w["ceiling"]))
        steps.append(_step("corpus", "corpus", vals_c["corpus"], "tokens prefilled", best_c["corpus"], top,
                           vals_w["ceiling"], best_w["ceiling"]))

    block = 256                             # the Q6_K block: bench head's widths are whole blocks
    head = run_bench_head(BenchHeadConfig(rows=cfg.head_rows, vocab=n_vocab, n=-(-n_embd // block) * block,
                                          repeats=cfg.repeats))
    tick()
    work = cfg.head_rows * n_vocab
    steps.append(StepRate("vocab pass", "solve", work, "rows x vocab scored", min(head.stream_s),
                          work / min(head.stream_s), f"numpy sgemm of the same shape ({head.config.n} wide)",
                          min(head.sgemm_s), work / min(head.sgemm_s), head.ratio))
    return LoopBenchResult(cfg, n_vocab, n_embd, len(jobs), len(windows), tuple(steps),
                           len(os.sched_getaffinity(0)), gpu_offload())


def render_loop_bench(r: LoopBenchResult) -> str:
    c, s = r.config, r.config.settings
    lines = [f"bench loop: {Path(c.model).name} (vocab {r.n_vocab}, width {r.n_embd}); {r.replies} replies "
             f"({c.prompts} prompts x {c.samples}) x {c.max_new} tokens, {min(c.slots, r.replies)} slots; "
             f"{r.windows} corpus windows ({c.phrases} phrases, budget {c.corpus_tokens}); {r.cpus} cpus, "
             f"{s.n_threads} threads, gpu layers {s.n_gpu_layers}; best of {c.repeats}",
             f"  {'step':10} {'stages':12} {'work':>8} {'unit':20} {'ours/s':>10} {'ceiling/s':>10} {'ratio':>7}"]
    for x in r.steps:
        lines.append(f"  {x.step:10} {x.stages:12} {x.work:8} {x.unit:20} {x.rate:10.1f} {x.ceiling_rate:10.1f} "
                     f"{x.ratio:7.3f}")
    lines += [f"  ceiling of {x.step}: {x.ceiling}" for x in r.steps if x.step in ("generate", "capture", "vocab pass")]
    lines.append("  ratio: ours / the ceiling's rate, measured in this run (1.0: the engine's own speed)")
    return "\n".join(lines)
