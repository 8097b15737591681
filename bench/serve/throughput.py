"""`exactedit bench serve`: what the shaping rules cost behind `exactedit serve`, end to end over HTTP.

Two servers run in this process on the same GGUF, engine settings and bounds (runs/serve: FastAPI on
uvicorn, each on its own thread and port): one without rules (the baseline), one with them live
(`rules`, or `phrases` banned phrases of the model's own words drawn and compiled in the run, as
`bench generate --against plain` draws them). Both answer the same requests (the bench's own
prompts as one user turn each, `seeds` seeds per prompt, `max_new` tokens, temperature and top-k),
sent one after the other, streamed by default, as any client sends them; the sides alternate
over `repeats`. Tokens are the responses' own `usage.completion_tokens`; the result is tokens/s
with the rules over tokens/s without them (best of the repeats; target >= 0.95), the median of
that ratio within each repeat (robust to a shared machine's drift), every repeat's time, how often
the rules fired, and how many replies came out the same text on both sides.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit.bench.generate import PROMPTS
from exactedit.errors import ExacteditError

Progress = Callable[[int, int], None]
TARGET_RATIO = 0.95          # serve's tokens/s with the rules, at least this share of without


@dataclass(frozen=True)
class ServeBenchConfig:
    model: str                  # GGUF path (the CLI resolves public model names)
    rules: str | None = None    # compiled shaping rules (JSON) ...
    phrases: int = 0            # ... or this many drawn phrases, compiled in the run
    phrase_seed: int = 0
    prompts: int = 8
    seeds: int = 1
    max_new: int = 64
    temperature: float = 0.8
    top_k: int = 40
    stream: bool = True
    repeats: int = 3

    def __post_init__(self):
        for key in ("prompts", "seeds", "max_new", "top_k", "repeats"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ExacteditError(f"bench serve: {key}: expected a positive integer, got {v!r}")
        if not 1 <= self.prompts <= len(PROMPTS):
            raise ExacteditError(f"bench serve: prompts: expected 1..{len(PROMPTS)} (the bench's own prompts)")
        if isinstance(self.phrases, bool) or not isinstance(self.phrases, int) or self.phrases < 0:
            raise ExacteditError(f"bench serve: phrases: expected an integer >= 0, got {self.phrases!r}")
        if (self.rules is None) == (self.phrases == 0):
            raise ExacteditError("bench serve: give compiled rules (--rules) or a number of phrases (--phrases), "
                                 "one of them")
        if not 0 <= self.temperature <= 2:
            raise ExacteditError(f"bench serve: temperature: expected 0..2, got {self.temperature!r}")


@dataclass(frozen=True)
class ServeBenchResult:
    config: ServeBenchConfig
    requests: int
    rules: tuple[str, ...]      # the rules' names, in order
    compile_s: float            # shape compile of the drawn phrases (0 with a rules file)
    tokens_plain: int
    tokens_rules: int
    plain_s: float              # best of the repeats
    rules_s: float
    plain_tps: float
    rules_tps: float
    ratio: float                # rules tokens/s over plain tokens/s
    target_ratio: float
    meets_target: bool
    paired_ratio: float         # the median over repeats of the ratio within each repeat
    plain_runs_s: tuple[float, ...]
    rules_runs_s: tuple[float, ...]
    fired_steps: int            # steps where a rule fired, over the rules side's replies (one repeat)
    identical_replies: int      # replies with the same text on both sides
    cpus: int

    def to_dict(self) -> dict:
        return {"bench": "serve", **asdict(self)}


def _drawn_rules(cfg: ServeBenchConfig, workdir: Path) -> tuple[str, float]:
    from exactedit.bench.shape_compile import draw_phrases
    from exactedit.native.shaping import compile_file
    from exactedit.quant import gguf
    from exactedit.solvers.shaping.rules_file import matcher_bytes
    from exactedit.solvers.tail.model import load_tokens

    table = load_tokens(gguf.open(cfg.model))
    text_bytes = matcher_bytes([table.token_bytes(i) for i in range(len(table))], table.types or (0,) * len(table))
    out = workdir / "rules.json"
    t = time.perf_counter()
    compile_file(None, cfg.model, out, phrases=draw_phrases(text_bytes, cfg.phrases, cfg.phrase_seed))
    return str(out), time.perf_counter() - t


def _ask(url: str, body: dict) -> tuple[str, int, int]:
    """One chat request: (the reply's text, its completion tokens, its rules' fired steps)."""
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as res:
        if not body.get("stream"):
            obj = json.loads(res.read())
            return (obj["choices"][0]["message"]["content"], obj["usage"]["completion_tokens"],
                    sum(obj["exactedit"]["rules_fired"].values()))
        text, tokens, fired = [], 0, 0
        for line in res:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                raise ExacteditError(f"bench serve: the server failed a request: {ev['error']['message']}")
            if ev["choices"]:
                text.append(ev["choices"][0]["delta"].get("content") or "")
            fired += sum(ev.get("exactedit", {}).get("rules_fired", {}).values())
            tokens = ev["usage"]["completion_tokens"] if ev.get("usage") else tokens
        return "".join(text), tokens, fired


def run_serve_bench(cfg: ServeBenchConfig, progress: Progress | None = None) -> ServeBenchResult:
    with tempfile.TemporaryDirectory(prefix="exactedit-bench-") as d:
        rules, compile_s = (cfg.rules, 0.0) if cfg.rules is not None else _drawn_rules(cfg, Path(d))
        return _run(cfg, rules, compile_s, progress)


def _run(cfg: ServeBenchConfig, rules: str, compile_s: float, progress: Progress | None) -> ServeBenchResult:
    from exactedit.runs.serve import Backend, ServeConfig, build_app, running

    configs = {"plain": ServeConfig(model=cfg.model, max_tokens=cfg.max_new, port=0),
               "rules": ServeConfig(model=cfg.model, rules=rules, max_tokens=cfg.max_new, port=0)}
    bodies = [{"model": "bench", "messages": [{"role": "user", "content": p}], "max_tokens": cfg.max_new,
               "temperature": cfg.temperature, "top_k": cfg.top_k, "seed": seed, "stream": cfg.stream,
               **({"stream_options": {"include_usage": True}} if cfg.stream else {})}
              for p in PROMPTS[:cfg.prompts] for seed in range(cfg.seeds)]
    runs: dict[str, list[float]] = {"plain": [], "rules": []}
    tokens: dict[str, list[int]] = {"plain": [], "rules": []}
    last: dict[str, list] = {}
    total, done = 2 * cfg.repeats, 0
    with Backend(configs["plain"]) as plain, Backend(configs["rules"]) as shaped:
        names = shaped.rule_names
        apps = {"plain": build_app(plain, configs["plain"]), "rules": build_app(shaped, configs["rules"])}
        with running(apps["plain"], configs["plain"]) as plain_url, \
                running(apps["rules"], configs["rules"]) as rules_url:
            urls = {"plain": plain_url, "rules": rules_url}
            for side in urls:                                   # warm: the weights' pages, the template's process
                _ask(urls[side], {**bodies[0], "max_tokens": 1})
            for rep in range(cfg.repeats):
                for side in (("plain", "rules") if rep % 2 == 0 else ("rules", "plain")):
                    t = time.perf_counter()
                    answers = [_ask(urls[side], b) for b in bodies]
                    runs[side].append(time.perf_counter() - t)
                    tokens[side].append(sum(a[1] for a in answers))
                    last[side] = answers
                    done += 1
                    if progress is not None:
                        progress(done, total)
    tps = {side: [n / s for n, s in zip(tokens[side], runs[side])] for side in runs}
    best = {side: int(np.argmax(tps[side])) for side in runs}
    plain_tps, rules_tps = tps["plain"][best["plain"]], tps["rules"][best["rules"]]
    ratio = rules_tps / plain_tps
    return ServeBenchResult(
        cfg, len(bodies), tuple(names), compile_s, tokens["plain"][best["plain"]], tokens["rules"][best["rules"]],
        runs["plain"][best["plain"]], runs["rules"][best["rules"]], plain_tps, rules_tps, ratio, TARGET_RATIO,
        ratio >= TARGET_RATIO, float(np.median([r / p for p, r in zip(tps["plain"], tps["rules"])])),
        tuple(runs["plain"]), tuple(runs["rules"]), int(sum(a[2] for a in last["rules"])),
        int(sum(a[0] == b[0] for a, b in zip(last["plain"], last["rules"]))), len(os.sched_getaffinity(0)))


def render_serve_bench(r: ServeBenchResult) -> str:
    c = r.config
    source = (f"{c.phrases} drawn phrases compiled in {r.compile_s:.1f} s" if c.phrases else Path(c.rules).name)
    mark = "ok" if r.meets_target else "BELOW"

    def runs(ts) -> str:
        return f"  (runs {min(ts):.2f}..{max(ts):.2f} s)" if len(ts) > 1 else ""

    return "\n".join([
        f"bench serve: {Path(c.model).name}, {r.requests} chat requests ({c.prompts} prompts x {c.seeds} seeds), "
        f"max_tokens {c.max_new}, T {c.temperature}, top-k {c.top_k}, {'streamed' if c.stream else 'not streamed'}, "
        f"one at a time over HTTP; {r.cpus} cpus, best of {c.repeats}",
        f"  rules: {', '.join(r.rules)} ({source})",
        f"  serve, no rules (baseline)  {r.tokens_plain:6} tokens  {r.plain_s:8.2f} s  {r.plain_tps:7.2f} tok/s"
        f"{runs(r.plain_runs_s)}",
        f"  serve, rules live           {r.tokens_rules:6} tokens  {r.rules_s:8.2f} s  {r.rules_tps:7.2f} tok/s"
        f"{runs(r.rules_runs_s)}",
        f"  ratio (rules / no rules, tokens/s): {r.ratio:.3f} (target >= {r.target_ratio:g}: {mark}); within each "
        f"repeat (median of {len(r.plain_runs_s)}): {r.paired_ratio:.3f}",
        f"  the rules fired at {r.fired_steps} steps; replies with the same text on both sides: "
        f"{r.identical_replies}/{r.requests}",
    ])
