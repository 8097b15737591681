"""The shaping rules live: compiled rules opened for one model (refused for another file), the
live `Shaper` and its offline twin, `mine`'s processors, what a reply starts from (`reply_setup`: the
rules and the chat template, shared with `exactedit serve`), the rules' mode (`rewind_for`: "penalty",
or "rewind": native/llamacpp/rewind.py), and `exactedit generate` (one reply with the rules in the
one-at-a-time generation loop, through native/llamacpp/sample.py's door)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exactedit.native.llamacpp.chat import given_template, prompt_tokens, render_prompt
from exactedit.native.llamacpp.engine import EngineError, LlamaEngine
from exactedit.native.llamacpp.generate import Sampling
from exactedit.native.llamacpp.rewind import RULES_MODES, RewindConfig, summarize_rewinds
from exactedit.native.llamacpp.sample import sample_replies


def open_rules(model, rules_path, g=None):
    """(compiled rules, the chat template they were compiled with) for `model`; refuses rules
    compiled for another file (by sha256), and rules whose ids are not what the model's token
    table gives (solvers.shaping.rules_file.check_compiled: edited by hand)."""
    from exactedit.solvers.shaping.compiled import ShapingRulesError, read_compiled
    from exactedit.solvers.shaping.rules_file import check_compiled
    from exactedit.quant.model import chat_template as ct
    from exactedit.quant import gguf

    g = g or gguf.open(model)
    compiled = read_compiled(rules_path, vocab=len(g.tokens()))
    sha = g.sha256()
    if sha != compiled.model.get("sha256"):
        raise ShapingRulesError(rules_path, "model.sha256", f"compiled for {compiled.model.get('sha256')}, but {model} "
                                f"is {sha}: recompile with exactedit shape compile")
    check_compiled(compiled, g, rules_path, model_path=str(model))
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
    from exactedit.solvers.shaping.rules import Shaper

    return Shaper(compiled.rules, compiled.vocab, persona=compiled.persona if persona is None else persona)


def rewind_for(compiled, mode: str = "penalty", where="--rules") -> RewindConfig | None:
    """The rewind of `--rules-mode`: None for "penalty" (the compiled rules alone); for "rewind",
    the compiled prefix penalty's phrases caught with their variants and rolled back (the rules stay
    live beside it). Rewind needs rules with a prefix penalty."""
    from exactedit.solvers.shaping.compiled import ShapingRulesError

    if mode not in RULES_MODES:
        raise ShapingRulesError(where, "rules_mode", f"expected one of {', '.join(RULES_MODES)}, got {mode!r}")
    if mode == "penalty":
        return None
    pen = compiled.rule("prefix-penalty") if compiled is not None else None
    if pen is None:
        raise ShapingRulesError(where, "rules_mode", "rewind rolls back the rules' banned phrases: give compiled "
                                "rules with a prefix penalty (exactedit shape compile --phrases)")
    return RewindConfig(tuple(p.text for p in pen.phrases))


def offline_rules(compiled, persona: bool):
    """The same rules for the trace pass (a one-document trace whose persona flag is `persona`)."""
    import dataclasses

    from exactedit.solvers.shaping.rules import PersonaCase

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


def reply_setup(model, rules_path=None, chat_template=None):
    """(compiled rules or None, the chat template replies are rendered with): the rules' own
    template with rules; without, `chat_template` (a Jinja2 file) or else the GGUF's. Where
    `exactedit generate` and `exactedit serve` both start, so their replies agree."""
    from exactedit.quant.model import chat_template as ct
    from exactedit.quant import gguf
    from exactedit.solvers.shaping.compiled import ShapingRulesError

    if rules_path is not None and chat_template is not None:
        raise ShapingRulesError(chat_template, "chat_template", "compiled rules render with the template they were "
                                "compiled with: put it in the rules file's [chat] table instead")
    g = gguf.open(model)
    if rules_path is not None:
        return open_rules(model, rules_path, g)
    return None, ct.template_of(g, given_template(chat_template))


@dataclass(frozen=True)
class TextGeneration:
    """`exactedit generate`: one reply, and where each rule fired."""

    prompt: str
    text: str
    tokens: int
    truncated: bool
    fired: dict
    kl: dict
    rules_mode: str = "penalty"
    rewinds: dict | None = None         # rewind mode: rewind.summarize_rewinds, and the events

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def generate_text(model, prompt: str, config: Sampling, rules_path=None, settings=None,
                  persona: bool | None = None, chat_template=None, rules_mode: str = "penalty") -> TextGeneration:
    """One reply to `prompt` (the model's chat template; the rules' when given; `chat_template`: a
    Jinja2 file used instead of the model's, without rules), rules live; `rules_mode` "rewind" rolls
    back the rules' phrases and their variants (`rewind_for`)."""
    compiled, tpl = reply_setup(model, rules_path, chat_template)
    rewind = rewind_for(compiled, rules_mode)
    shaper = shaper_for(compiled, persona=persona) if compiled is not None else None
    with LlamaEngine(model, settings) as engine:
        ptoks = prompt_tokens(engine, render_prompt(tpl, prompt), engine.bos_if_added())
        gen, = sample_replies(engine, [(ptoks, config)], processor=shaper, sequential=True,
                              stop_ids=compiled.vocab.turn_end if compiled is not None else None, rewind=rewind)
        text = b"".join(engine.piece(int(t)) for t in gen.tokens).decode("utf-8", "replace")
    names = [r.name for r in compiled.rules] if compiled is not None else []
    fired = {n: [int(i) for i in np.flatnonzero(gen.fired[:, j])] for j, n in enumerate(names)}
    kl = {"steps": int(gen.kl.size), "mean": float(gen.kl.mean()) if gen.kl.size else 0.0,
          "max": float(gen.kl.max()) if gen.kl.size else 0.0}
    rewinds = None if rewind is None else {**summarize_rewinds([gen.rewinds]),
                                           "events": [e._asdict() for e in gen.rewinds]}
    return TextGeneration(prompt, text, int(gen.tokens.size), gen.truncated, fired, kl, rules_mode, rewinds)


def render_generation(r: TextGeneration) -> str:
    out = [r.text, "", f"({r.tokens} tokens{', cut at --max-new' if r.truncated else ''})"]
    for name, steps in r.fired.items():
        out.append(f"  {name}: fired at steps {steps}")
    if r.fired:
        out.append(f"  KL(unshaped || shaped) per step: mean {r.kl['mean']:.4g}, max {r.kl['max']:.4g}")
    if r.rewinds is not None:
        out.append(f"  rewinds: {r.rewinds['rewinds']}"
                   + "".join(f", {p!r} x{n}" for p, n in r.rewinds["phrases"].items())
                   + (f"; kept past the bounds: {r.rewinds['kept']}" if r.rewinds["kept"] else ""))
    return "\n".join(out)
