"""`exactedit shape compile RULES --model M --out RULES.json`: a rules file resolved for one model.

The phrases are tokenized by the model's own tokenizer (llama.cpp's, the one that will run them);
specials, chat framing and token texts come from the GGUF (solvers/shaping/rules_file.py). The JSON is
written atomically and read back before returning, so what was written is what an engine loads.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from exactedit.native.llamacpp.engine import LlamaEngine


@dataclass(frozen=True)
class CompileResult:
    out: str
    out_sha256: str
    summary: dict
    skipped: tuple[tuple[str, str], ...] = ()   # (phrase, why) of a --phrases list that no penalty can ban

    def to_dict(self) -> dict:
        return {"out": self.out, "out_sha256": self.out_sha256, **self.summary,
                "skipped": [{"phrase": p, "why": w} for p, w in self.skipped]}


def compile_file(rules, model, out, *, phrases: Sequence[str] = (), bias: float = 6.0,
                 chat_template=None) -> CompileResult:
    """Compile the rules file `rules` (or None: no file) for `model`, with a prefix penalty of
    `bias` on `phrases` added (a list given outside the file, e.g. discover's; the phrases whose
    last word is several tokens are skipped and listed). `chat_template`: a Jinja2 file whose
    template the rules carry (a model whose GGUF has none), unless the rules file gives its own."""
    import dataclasses

    from exactedit.solvers.shaping.compiled import ShapingRulesError, read_compiled, write_compiled
    from exactedit.solvers.shaping.rules_file import RulesSpec, compile_rules, listed_penalty, load_rules
    from exactedit.quant import gguf
    from exactedit.files import file_sha256

    if phrases:         # refused before the model loads, naming the flag (a bias of 0 or -0 was a rule doing nothing)
        from exactedit.solvers.shaping.rules import parse_shape

        try:
            parse_shape(f"prefix-penalty={float(bias)!r}")
            if not bias > 0:
                raise ValueError
        except ValueError:
            raise ShapingRulesError("--bias", "bias", f"expected a finite number of nats > 0 that float32 holds "
                                    f"exactly (e.g. 6 or 6.5), got {bias!r}") from None
    spec = load_rules(rules) if rules is not None else RulesSpec("(no rules file)", "", ())
    if chat_template is not None and spec.chat.template is None:
        from exactedit.native.llamacpp.chat import given_template

        spec = dataclasses.replace(spec, chat=dataclasses.replace(spec.chat, template=given_template(chat_template).source))
    g = gguf.open(model)
    skipped = ()
    with LlamaEngine(model) as engine:
        tokenize = lambda text, special: engine.tokenize(text, parse_special=special)  # noqa: E731
        if phrases:
            penalty, skipped = listed_penalty(phrases, bias, g, tokenize, model_path=str(model))
            if penalty is None:
                raise ShapingRulesError("--phrases", "phrases", "no phrase whose last word is one token of "
                                        f"{Path(model).name}: " + "; ".join(f"{p!r}: {w}" for p, w in skipped))
            spec = dataclasses.replace(spec, rules=spec.rules + (penalty,))
        if not spec.rules:
            raise ShapingRulesError(spec.path, "rules", "no rules (give a rules file or --phrases)")
        compiled = compile_rules(spec, g, tokenize, model_path=str(model))
    write_compiled(compiled, out)
    back = read_compiled(out)
    return CompileResult(str(Path(out)), file_sha256(out), back.summary(), tuple(skipped))


def render_compile(r: CompileResult) -> str:
    s = r.summary
    chat = s["chat"]
    out = [f"wrote {r.out} (sha256 {r.out_sha256[:12]}) for {s['model']['path']} (sha256 {s['model']['sha256'][:12]}, "
           f"{s['model']['vocab']} tokens)",
           f"  chat framing from {chat['template_from']}: turn start {chat['turn_start']!r}, assistant role "
           f"{chat['assistant']!r}, header end {chat['header_end']!r}, turn end {chat['turn_end']!r}"]
    for rule in s["rules"]:
        if rule["kind"] == "prefix-penalty":
            out.append(f"  prefix-penalty -{rule['bias']:g}: " + ", ".join(
                f"{p['text']!r} (final {p['final']!r})" for p in rule["phrases"]) + f"; {rule['pieces']} token pieces")
        elif rule["kind"] == "step0-guard":
            out.append(f"  step0-guard -{rule['bias']:g} on " + ", ".join(repr(t) for t in rule["targets"]))
        else:
            out.append(f"  persona-case (drop {rule['drop']:g}): {rule['pairs']} case pairs, "
                       f"{'active' if rule['active'] else 'inactive'}")
    out += [f"  skipped {p!r}: {w}" for p, w in r.skipped]
    return "\n".join(out)
