"""The live generation loop: llama.cpp's sampler chain with the shaping rules in front of it.

The sampler chain is llama.cpp's own (`llama_sampler_chain`: top-k, temperature, seeded `dist`,
as `LlamaEngine.generate` uses), with two samplers of ours in front of it, written against
llama.cpp's `llama_sampler_i` interface:
- `shape`: reads the candidate array llama.cpp built from the raw logits (`cur_p`, one entry
  per token in id order), keeps a copy, and writes `evals.shaping.Shaper`'s shaped logits back;
- `probe`: reads the array again, after `shape`, as the rest of the chain receives it.
The shaper is pushed every token of the history (the rendered prompt, then each sampled token),
so its trigger state is the one `evals.triggers` computes offline for the same tokens.

`generate(engine, prompt_tokens, config, shaper)` (any object with `rules`, `reset()`,
`push(token)` and `shape(logits) -> (logits, fired)`; native/generate.py adapts a plain logits
processor to it) returns a `Generation`: the new tokens, which
rules fired at each step, the KL(unshaped || shaped) of each step's distribution (temperature 1,
full vocabulary, float64), and with `record=True` the raw logits, the logits the chain received,
and the engine's own `llama_get_logits_ith` row, per step (float32 [steps, V]). Without a shaper
the same loop and chain run (the base arms of a comparison), so arms differ only by the rules.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from exactedit.native.llamacpp import EngineError, LlamaEngine, sampler_chain

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


@dataclass(frozen=True)
class GenerateConfig:
    max_new: int = 64
    temperature: float = 0.8
    top_k: int = 40
    seed: int = 0

    def __post_init__(self):
        if self.max_new < 1 or self.top_k < 1 or not self.temperature > 0:
            raise EngineError("GenerateConfig", "values", "max_new, top_k >= 1 and temperature > 0")


@dataclass(frozen=True, eq=False)
class Generation:
    prompt: np.ndarray            # int32 [P] the rendered prompt's tokens
    tokens: np.ndarray            # int32 [steps] sampled tokens (the stop token included when one came)
    fired: np.ndarray             # bool [steps, rules]
    kl: np.ndarray                # float64 [steps] KL(unshaped || shaped) at T = 1 (0 without rules)
    truncated: bool               # cut at max_new, no stop token
    raw: np.ndarray | None = None        # float32 [steps, V] what llama.cpp handed the chain
    received: np.ndarray | None = None   # float32 [steps, V] what the chain after the rules received
    engine_rows: np.ndarray | None = None  # float32 [steps, V] llama_get_logits_ith(ctx, -1)
    kl_rules: np.ndarray | None = None     # float64 [steps, rules] KL of each fired rule applied alone

    @property
    def sequence(self) -> np.ndarray:
        return np.concatenate([self.prompt, self.tokens]).astype(np.int32)


def step_kl(raw: np.ndarray, shaped: np.ndarray) -> float:
    """KL(softmax(raw) || softmax(shaped)) in float64 (temperature 1, full vocabulary)."""
    a, b = raw.astype(np.float64), shaped.astype(np.float64)
    la = a - np.logaddexp.reduce(a)
    lb = b - np.logaddexp.reduce(b)
    p = np.exp(la)
    keep = p > 0
    return float(np.sum(p[keep] * (la[keep] - lb[keep])))


def _alone_kl(rule, hits, raw: np.ndarray) -> float:
    one = raw.copy()
    rule.apply_row(one, hits)
    return step_kl(raw, one)


class _Sampler:
    """A llama_sampler whose `apply` calls `fn(cur_p)`; exceptions are kept (never cross into C)."""

    def __init__(self, lib, fn):
        self.error: BaseException | None = None

        def apply(_smpl, cur_p):
            try:
                fn(cur_p.contents)
            except BaseException as exc:  # noqa: BLE001 - reported after llama_sampler_sample returns
                self.error = exc

        self._apply = lib.llama_sampler_i_apply(apply)
        iface = lib.llama_sampler_i()
        iface.apply = self._apply
        iface.name = lib.llama_sampler_i_name(0)
        iface.accept = lib.llama_sampler_i_accept(0)
        iface.reset = lib.llama_sampler_i_reset(0)
        iface.clone = lib.llama_sampler_i_clone(0)
        iface.free = lib.llama_sampler_i_free(0)  # the chain must not free our memory
        self._iface = iface
        self.sampler = lib.llama_sampler_init(ctypes.pointer(iface), None)


def _cur(arr, n_vocab: int) -> np.ndarray:
    """The candidate array as a structured numpy view (no copy)."""
    if arr.size != n_vocab or arr.sorted:
        raise EngineError("llama_sampler", "cur_p", f"expected {n_vocab} unsorted candidates, got {arr.size}")
    buf = (ctypes.c_char * (arr.size * _TOKEN_DATA.itemsize)).from_address(ctypes.addressof(arr.data.contents))
    return np.frombuffer(buf, dtype=_TOKEN_DATA)


class StepShaping:
    """One reply's `shape` and `probe` samplers (module doc) and what they saw at each step:
    which rules fired, KL(unshaped || shaped), each fired rule's KL alone, and with `record`
    the raw and received rows. `start(prompt)` pushes the prompt into the shaper, `accept(tok)`
    each sampled token; `samplers` go first in the reply's chain (`sampler_chain(first=...)`)
    and come out of it with `detach(chain)` before the chain is freed (their memory is Python's)."""

    def __init__(self, lib, n_vocab: int, shaper=None, *, record: bool = False):
        self.lib, self.V, self.shaper, self.record = lib, n_vocab, shaper, record
        self.n_rules = len(shaper.rules) if shaper is not None else 0
        self.alone = hasattr(shaper, "hits")  # evals.shaping.Shaper: each rule's own effect is measured too
        self.ids = np.arange(n_vocab, dtype=np.int32)
        self.steps = {"raw": [], "received": [], "engine": [], "fired": [], "kl": [], "kl_rules": []}
        self.samplers = [_Sampler(lib, self._shape), _Sampler(lib, self._probe)]

    def start(self, prompt) -> None:
        if self.shaper is not None:
            self.shaper.reset()
            for t in prompt:
                self.shaper.push(int(t))

    def _shape(self, arr) -> None:
        cur = _cur(arr, self.V)
        if not np.array_equal(cur["id"], self.ids):
            raise EngineError("llama_sampler", "cur_p", "candidates are not in token-id order")
        raw = cur["logit"].copy()
        if self.shaper is None:
            shaped, fired = raw, ()
        else:
            shaped, fired = self.shaper.shape(raw)
            cur["logit"] = shaped
        self.steps["fired"].append(fired)
        self.steps["kl"].append(step_kl(raw, shaped) if any(fired) else 0.0)
        if self.alone:
            self.steps["kl_rules"].append([_alone_kl(rule, h, raw) if h else 0.0
                                           for rule, h in zip(self.shaper.rules, self.shaper.hits())])
        if self.record:
            self.steps["raw"].append(raw)

    def _probe(self, arr) -> None:
        if self.record:
            self.steps["received"].append(_cur(arr, self.V)["logit"].copy())

    def accept(self, tok: int) -> None:
        """After `llama_sampler_sample`: re-raise what a sampler caught, push the token."""
        for smp in self.samplers:
            if smp.error is not None:
                raise smp.error
        if self.shaper is not None:
            self.shaper.push(tok)

    def detach(self, chain) -> None:
        for _ in self.samplers:
            self.lib.llama_sampler_chain_remove(chain, 0)

    def generation(self, prompt: np.ndarray, out: list, stopped: bool) -> Generation:
        st, V, n = self.steps, self.V, len(out)
        fired = np.array(st["fired"], dtype=bool).reshape(n, self.n_rules)
        stack = (lambda k: np.stack(st[k]) if st[k] else np.zeros((0, V), np.float32)) if self.record \
            else (lambda k: None)
        kl_rules = np.array(st["kl_rules"], dtype=np.float64).reshape(n, self.n_rules) if self.alone else None
        return Generation(prompt, np.array(out, dtype=np.int32), fired, np.array(st["kl"], dtype=np.float64),
                          not stopped, stack("raw"), stack("received"), stack("engine"), kl_rules)


def generate(engine: LlamaEngine, prompt, config: GenerateConfig, shaper=None, *, record: bool = False,
             stop_ids=None) -> Generation:
    """Sample up to `config.max_new` tokens after `prompt`, `shaper` (evals.shaping.Shaper, or
    None) applied at every step; stops after a token of `stop_ids` (default: the vocabulary's
    end-of-generation tokens), which is kept."""
    lib, s, V = engine._lib, engine.settings, engine.n_vocab
    toks = np.asarray(prompt, dtype=np.int32)
    if toks.ndim != 1 or toks.size == 0 or toks.size + config.max_new > s.n_ctx:
        raise EngineError(engine.path, "prompt", f"needs 1..{s.n_ctx - config.max_new} tokens, got {toks.size}")
    stop_ids = None if stop_ids is None else frozenset(int(t) for t in stop_ids)
    steps = StepShaping(lib, V, shaper, record=record)
    steps.start(toks)
    ctx = engine._context(None)
    chain = sampler_chain(lib, config.top_k, config.temperature, config.seed, [smp.sampler for smp in steps.samplers])
    batch = lib.llama_batch_init(max(s.n_batch, 1), 0, 1)
    out: list[int] = []
    stopped = False
    try:
        pending, pos = list(toks), 0
        while True:
            for start in range(0, len(pending), s.n_batch):
                piece = pending[start:start + s.n_batch]
                for i, t in enumerate(piece):
                    batch.token[i], batch.pos[i] = int(t), pos + i
                    batch.n_seq_id[i], batch.seq_id[i][0] = 1, 0
                    batch.logits[i] = int(start + i == len(pending) - 1)
                batch.n_tokens = len(piece)
                if lib.llama_decode(ctx, batch) != 0:
                    raise EngineError(engine.path, "llama_decode", f"failed at position {pos}")
                pos += len(piece)
            if len(out) >= config.max_new:
                break
            if record:
                row = lib.llama_get_logits_ith(ctx, -1)
                steps.steps["engine"].append(np.ctypeslib.as_array(row, shape=(V,)).copy())
            tok = int(lib.llama_sampler_sample(chain, ctx, -1))
            steps.accept(tok)
            out.append(tok)
            if (tok in stop_ids) if stop_ids is not None else lib.llama_vocab_is_eog(engine._vocab, tok):
                stopped = True
                break
            pending = [tok]
    finally:
        steps.detach(chain)
        lib.llama_batch_free(batch)
        lib.llama_sampler_free(chain)
        lib.llama_free(ctx)
    return steps.generation(toks, out, stopped)


def render_prompt(template, user: str) -> str:
    """One user turn and the template's generation prompt (quant.chat_template.ChatTemplate)."""
    return template.render([{"role": "user", "content": user}], add_generation_prompt=True)


def prompt_tokens(engine: LlamaEngine, text: str, bos: int | None = None) -> np.ndarray:
    """A rendered prompt's tokens (specials parsed); `bos` is prepended when the vocabulary adds
    one and the template did not already write it."""
    toks = engine.tokenize(text, parse_special=True)
    if bos is not None and (toks.size == 0 or int(toks[0]) != bos):
        toks = np.concatenate([np.array([bos], np.int32), toks])
    return toks


def open_rules(model, rules_path, g=None):
    """(compiled rules, the chat template they were compiled with) for `model`; refuses rules
    compiled for another file (by sha256)."""
    from exactedit.evals.shaping_json import ShapingRulesError, read_compiled
    from exactedit.quant import chat_template as ct
    from exactedit.quant import gguf

    compiled = read_compiled(rules_path)
    g = g or gguf.open(model)
    sha = g.sha256()
    if sha != compiled.model.get("sha256"):
        raise ShapingRulesError(rules_path, "model.sha256", f"compiled for {compiled.model.get('sha256')}, but {model} "
                                f"is {sha}: recompile with exactedit shape compile")
    if compiled.chat.get("template_from") == "rules":
        tokens = g.tokens()
        ids = {k: g.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos")}
        tpl = ct.ChatTemplate(compiled.chat.get("template") or "", where=f"{rules_path}: chat.template",
                              **{f"{k}_token": tokens[int(v)] if v is not None else "" for k, v in ids.items()})
    else:
        tpl = ct.from_gguf(g)
    return compiled, tpl


def shaper_for(compiled, *, persona: bool | None = None):
    """The live `Shaper` of compiled rules (`persona` overrides the rules file's `active`)."""
    from exactedit.evals.shaping import Shaper

    return Shaper(compiled.rules, compiled.vocab, persona=compiled.persona if persona is None else persona)


def offline_rules(compiled, persona: bool):
    """The same rules for the trace pass (a one-document trace whose persona flag is `persona`)."""
    import dataclasses

    from exactedit.evals.shaping import PersonaCase

    return tuple(dataclasses.replace(r, persona_docs=(persona,)) if isinstance(r, PersonaCase) else r
                 for r in compiled.rules)


def shape_processors(model, rules_path, edited=None) -> dict:
    """`mine`'s logits processors for compiled rules run live on every side (base, and edited:
    the rules' ids hold for an edited copy with the same tokenizer); {} without rules."""
    if rules_path is None:
        return {}
    from exactedit.quant import gguf

    compiled, _ = open_rules(model, rules_path)
    if edited is not None:
        same_tokenizer(gguf.open(model), gguf.open(edited), edited)
    return {side: shaper_for(compiled) for side in ("base", "edited")[:2 if edited is not None else 1]}


def same_tokenizer(g, e, where) -> None:
    """An edited model must share the base's token table and chat template (the rules' ids)."""
    for key in ("tokenizer.ggml.model", "tokenizer.chat_template", "tokenizer.ggml.eos_token_id"):
        if g.get(key) != e.get(key):
            raise EngineError(where, key, "differs from the base model's: the compiled rules do not apply to it")
    if g.tokens() != e.tokens() or not np.array_equal(g.token_types(), e.token_types()):
        raise EngineError(where, "tokenizer.ggml.tokens", "differs from the base model's token table")


@dataclass(frozen=True)
class TextGeneration:
    """`exactedit generate`: one reply, and where each rule fired."""

    prompt: str
    text: str
    tokens: int
    truncated: bool
    fired: dict
    kl: dict

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def generate_text(model, prompt: str, config: GenerateConfig, rules_path=None, settings=None,
                  persona: bool | None = None) -> TextGeneration:
    """One reply to `prompt` (the model's chat template; the rules' when given), rules live."""
    from exactedit.quant import chat_template as ct
    from exactedit.quant import gguf

    g = gguf.open(model)
    compiled, tpl = open_rules(model, rules_path, g) if rules_path is not None else (None, ct.from_gguf(g))
    shaper = shaper_for(compiled, persona=persona) if compiled is not None else None
    with LlamaEngine(model, settings) as engine:
        gen = generate(engine, prompt_tokens(engine, render_prompt(tpl, prompt)), config, shaper,
                       stop_ids=compiled.vocab.turn_end if compiled is not None else None)
        text = b"".join(engine.piece(int(t)) for t in gen.tokens).decode("utf-8", "replace")
    names = [r.name for r in compiled.rules] if compiled is not None else []
    fired = {n: [int(i) for i in np.flatnonzero(gen.fired[:, j])] for j, n in enumerate(names)}
    kl = {"steps": int(gen.kl.size), "mean": float(gen.kl.mean()) if gen.kl.size else 0.0,
          "max": float(gen.kl.max()) if gen.kl.size else 0.0}
    return TextGeneration(prompt, text, int(gen.tokens.size), gen.truncated, fired, kl)


def render_generation(r: TextGeneration) -> str:
    out = [r.text, "", f"({r.tokens} tokens{', cut at --max-new' if r.truncated else ''})"]
    for name, steps in r.fired.items():
        out.append(f"  {name}: fired at steps {steps}")
    if r.fired:
        out.append(f"  KL(unshaped || shaped) per step: mean {r.kl['mean']:.4g}, max {r.kl['max']:.4g}")
    return "\n".join(out)
