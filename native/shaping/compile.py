"""`exactedit shape compile RULES --model M --out RULES.json`: a rules file resolved for one model.

The phrases are tokenized by the model's own tokenizer (llama.cpp's, the one that will run them);
specials, chat framing and token texts come from the GGUF (solvers/shaping/rules_file.py). The JSON is
written atomically and read back before returning, so what was written is what an engine loads.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exactedit.native.llamacpp.engine import LlamaEngine


@dataclass(frozen=True)
class CompileResult:
    out: str
    out_sha256: str
    summary: dict

    def to_dict(self) -> dict:
        return {"out": self.out, "out_sha256": self.out_sha256, **self.summary}


def compile_file(rules, model, out) -> CompileResult:
    from exactedit.solvers.shaping.compiled import read_compiled, write_compiled
    from exactedit.solvers.shaping.rules_file import compile_rules, load_rules
    from exactedit.quant import gguf
    from exactedit.quant.files import file_sha256

    spec = load_rules(rules)
    g = gguf.open(model)
    with LlamaEngine(model) as engine:
        compiled = compile_rules(spec, g, lambda text, special: engine.tokenize(text, parse_special=special),
                                 model_path=str(model))
    write_compiled(compiled, out)
    back = read_compiled(out)
    return CompileResult(str(Path(out)), file_sha256(out), back.summary())


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
    return "\n".join(out)
