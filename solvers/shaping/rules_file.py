"""A shaping rules file (TOML, phrases as text) and its compilation against one model.

`load_rules(path)` reads the file (docs/shaping.md): one table per rule, applied in file order.

```toml
[prefix-penalty]
bias = 6.0                       # float32-exact
phrases = ["end to end", "rather than"]   # two or more words; the last one a single token

[step0-guard]
bias = 6.0
targets = []                     # extra special tokens by name; always: the turn end(s), <think>

[persona-case]
drop = 8.0
active = true                    # live: the persona is on; offline: documents tagged persona_tag
persona_tag = "style"
words = []                       # restrict the case pairs to these words (empty: all)

[chat]                           # optional
template = "..."                 # a Jinja2 chat template for a GGUF that carries none
think = ["<think>", "</think>"]  # the think / tool-call tags (default: these, if the model has them)
tool = ["<tool_call>", "</tool_call>"]
```

`compile_rules(spec, g, tokenize)` resolves the text against the model: each phrase's last word
as one token of the model's own tokenizer (the token penalized), and the bytes of every token a
match of its prefix can use (the shared matcher, solvers.phrases: the prefix as written or
Capitalized, starting at a word boundary, in any tokenization); the model's own specials and
chat framing (quant.specials, quant.chat_template: the template is rendered only in its
sandbox); the case pairs. The result (solvers.shaping.compiled) holds token ids and token bytes only,
with the model's sha256.
"""
from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from exactedit.solvers.shaping import rules as shaping
from exactedit.solvers.shaping.compiled import CompiledRules, ShapingRulesError
from exactedit.solvers.shaping.triggers import BOUNDARY, ShapeVocab, text_flags

Tokenize = Callable[[str, bool], Sequence[int]]   # (text, parse_special) -> token ids
_TABLES = {"prefix-penalty": {"bias", "phrases"},
           "step0-guard": {"bias", "targets"},
           "persona-case": {"drop", "active", "persona_tag", "words"},
           "chat": {"template", "think", "tool"}}


@dataclass(frozen=True)
class PenaltySpec:
    phrases: tuple[str, ...]
    bias: float = 6.0
    kind = "prefix-penalty"


@dataclass(frozen=True)
class GuardSpec:
    bias: float = 6.0
    targets: tuple[str, ...] = ()
    kind = "step0-guard"


@dataclass(frozen=True)
class CaseSpec:
    drop: float = shaping.CASE_DROP
    active: bool = True
    persona_tag: str = "style"
    words: tuple[str, ...] = ()
    kind = "persona-case"


@dataclass(frozen=True)
class ChatSpec:
    """`think` / `tool`: None (not given: SPEC.md's tag names, used when the model has them as
    special tokens), () (the model has none), or (open, close) names that must be its specials."""

    template: str | None = None
    think: tuple[str, ...] | None = None
    tool: tuple[str, ...] | None = None


DEFAULT_TAGS = {"think": ("<think>", "</think>"), "tool": ("<tool_call>", "</tool_call>")}


@dataclass(frozen=True)
class RulesSpec:
    path: str
    sha256: str
    rules: tuple[PenaltySpec | GuardSpec | CaseSpec, ...]
    chat: ChatSpec = ChatSpec()


def _get(table: dict, key: str, kind, where: str, field: str, default):
    if key not in table:
        return default
    v = table[key]
    ok = isinstance(v, kind) and not (isinstance(v, bool) and kind in (int, float, (int, float)))
    if not ok:
        raise ShapingRulesError(where, field, f"expected {getattr(kind, '__name__', 'a number')}, got {v!r}")
    return v


def _strings(table: dict, key: str, where: str, field: str, default=()) -> tuple[str, ...]:
    v = table.get(key, list(default))
    if not isinstance(v, list) or any(not isinstance(s, str) or not s.strip() for s in v):
        raise ShapingRulesError(where, field, f"expected a list of non-empty strings, got {v!r}")
    return tuple(v)


def _f32(table, key, where, field, default) -> float:
    v = float(_get(table, key, (int, float), where, field, default))
    try:
        return shaping._f32_exact(v, key)
    except ValueError as exc:
        raise ShapingRulesError(where, field, str(exc)) from None


def load_rules(path) -> RulesSpec:
    """Read and validate a rules file; every error names the file and the field."""
    path = Path(path)
    try:
        data = path.read_bytes()
        doc = tomllib.loads(data.decode("utf-8"))
    except OSError as exc:
        raise ShapingRulesError(path, "file", f"cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ShapingRulesError(path, "toml", f"not valid TOML ({exc})") from None
    where = str(path)
    rules, chat = [], ChatSpec()
    for name, table in doc.items():
        if name not in _TABLES or not isinstance(table, dict):
            raise ShapingRulesError(where, name, f"unknown table; expected one of {sorted(_TABLES)}")
        unknown = sorted(set(table) - _TABLES[name])
        if unknown:
            raise ShapingRulesError(where, f"{name}.{unknown[0]}", f"unknown key; expected {sorted(_TABLES[name])}")
        f = lambda k: f"{name}.{k}"  # noqa: E731
        if name == "prefix-penalty":
            phrases = _strings(table, "phrases", where, f("phrases"))
            if not phrases:
                raise ShapingRulesError(where, f("phrases"), "needs at least one phrase")
            phrases = tuple(" ".join(p.split()) for p in phrases)
            if len(set(phrases)) != len(phrases):
                raise ShapingRulesError(where, f("phrases"), "a phrase is listed twice")
            rules.append(PenaltySpec(phrases, _f32(table, "bias", where, f("bias"), 6.0)))
        elif name == "step0-guard":
            rules.append(GuardSpec(_f32(table, "bias", where, f("bias"), 6.0),
                                   _strings(table, "targets", where, f("targets"))))
        elif name == "persona-case":
            rules.append(CaseSpec(_f32(table, "drop", where, f("drop"), shaping.CASE_DROP),
                                  _get(table, "active", bool, where, f("active"), True),
                                  _get(table, "persona_tag", str, where, f("persona_tag"), "style"),
                                  _strings(table, "words", where, f("words"))))
        else:
            pairs = {}
            for key in ("think", "tool"):
                if key in table:
                    v = _strings(table, key, where, f(key))
                    if v and len(v) != 2:
                        raise ShapingRulesError(where, f(key), f"expected [] or [open, close], got {list(v)}")
                    pairs[key] = v
            chat = ChatSpec(_get(table, "template", str, where, f("template"), None), **pairs)
    if not rules:
        raise ShapingRulesError(where, "rules", "no rule tables (prefix-penalty, step0-guard, persona-case)")
    return RulesSpec(where, hashlib.sha256(data).hexdigest(), tuple(rules), chat)


def compile_rules(spec: RulesSpec, g, tokenize: Tokenize, *, model_path: str = "") -> CompiledRules:
    """Resolve `spec` against the open GGUF `g` (its token table, specials and chat template)
    with the model's own tokenizer `tokenize` (llama.cpp's, in native.shaping.compile)."""
    from exactedit.quant import chat_template as ct
    from exactedit.quant.specials import model_specials
    from exactedit.solvers.phrases import TOKEN_CONTROL, ends_at_boundary
    from exactedit.solvers.tail.model import load_tokens

    table = load_tokens(g)
    raw = [table.token_bytes(i) for i in range(len(table))]
    types = table.types or (0,) * len(table)
    text_bytes = [b"" if ty == TOKEN_CONTROL else b for b, ty in zip(raw, types)]  # the matcher's view
    tb = text_bytes.__getitem__
    sp = model_specials(g)
    texts = [b.decode("utf-8", errors="replace") for b in raw]  # = table.piece(i)
    where = spec.path
    by_name: dict[str, int] = {}
    for i in sp.specials:
        by_name.setdefault(texts[i], i)

    def special(name: str, field: str) -> int:
        if name not in by_name:
            raise ShapingRulesError(where, field, f"{name!r} is not a special token of {model_path or g.path}")
        return by_name[name]

    if spec.chat.template is not None:
        tpl = ct.ChatTemplate(spec.chat.template, bos_token=texts[sp.ids["bos"]] if "bos" in sp.ids else "",
                              eos_token=texts[sp.ids["eos"]] if "eos" in sp.ids else "", where=f"{where}: chat.template")
        template_from = "rules"
    elif g.get("tokenizer.chat_template") is not None:
        tpl, template_from = ct.from_gguf(g), "gguf"
    else:
        raise ShapingRulesError(where, "chat.template", f"{model_path or g.path} carries no chat template; give one "
                                "in the rules file's [chat] table so the turn framing is known")
    # control tokens only: a user-defined token can be plain text (Gemma's "\n"), never a chat tag
    fmt = ct.probe_format(tpl, [texts[i] for i in sp.control])
    turn_start = special(fmt.turn_start, "chat.template (turn start)")
    turn_end = tuple(dict.fromkeys([special(fmt.turn_end, "chat.template (turn end)"), *sp.end_of_generation]))
    header_end = None if fmt.header_end == "\n" else special(fmt.header_end, "chat.template (header end)")
    gen = tpl.render([{"role": "user", "content": "x"}], add_generation_prompt=True)
    head = gen[gen.rindex(fmt.turn_start):]
    role = tuple(int(t) for t in tokenize(fmt.assistant, False))
    head_ids = [int(t) for t in tokenize(head, True)]
    if head_ids[:1 + len(role)] != [turn_start, *role]:
        raise ShapingRulesError(where, "chat.template", f"the assistant header {head!r} tokenizes as {head_ids}, "
                                f"not the turn start {turn_start} then the role's tokens {list(role)}")

    def tags(key):
        given = getattr(spec.chat, key)
        if given is None:
            pair = DEFAULT_TAGS[key]
            return (by_name[pair[0]], by_name[pair[1]]) if all(n in by_name for n in pair) else None
        return (special(given[0], f"chat.{key}"), special(given[1], f"chat.{key}")) if given else None

    think, tool = tags("think"), tags("tool")
    flags = [text_flags(t) for t in texts]
    fl = np.array([f for f, _ in flags], dtype=np.uint8)
    bound = np.array([ends_at_boundary(b) for b in text_bytes], dtype=bool)  # control: no text
    fl = np.where(bound, fl | BOUNDARY, fl & ~np.uint8(BOUNDARY)).astype(np.uint8)
    vocab = ShapeVocab(fl, [c for _, c in flags], (turn_start,), turn_end, role, header_end,
                       *(think or (None, None)), *(tool or (None, None)))
    rules, persona, persona_tag = [], True, "style"
    for r in spec.rules:
        if isinstance(r, PenaltySpec):
            phrases = tuple(shaping.TextPhrase(p, _final(p, tb, tokenize, where)) for p in r.phrases)
            rules.append(shaping.PhrasePenalty(r.bias, phrases, phrase_pieces(r.phrases, text_bytes)))
        elif isinstance(r, GuardSpec):
            targets = ((think[0],) if think else ()) + turn_end + tuple(special(n, "step0-guard.targets")
                                                                        for n in r.targets)
            rules.append(shaping.Step0Guard(r.bias, targets))
        else:
            pairs = shaping.case_pairs(texts, r.words or None, skip=sp.specials)
            if not pairs:
                raise ShapingRulesError(where, "persona-case.words", "no (Capitalized, lowercase) token pairs found")
            rules.append(shaping.PersonaCase(pairs, (), r.drop))
            persona, persona_tag = r.active, r.persona_tag
    chat = {"template_from": template_from, "template": spec.chat.template, **fmt.to_dict()}
    named = {turn_start, *turn_end, *role, *(think or ()), *(tool or ()), *([header_end] if header_end is not None else [])}
    for r in rules:
        named |= set(getattr(r, "targets", ())) | {p.final for p in getattr(r, "phrases", ())}
    names = {i: texts[i] for i in sorted(named)}
    model = {"path": model_path or str(g.path), "sha256": g.sha256(), "vocab": len(table)}
    return CompiledRules(vocab, tuple(rules), persona, persona_tag, model,
                         {"path": spec.path, "sha256": spec.sha256}, chat, names)


def phrase_pieces(phrases: Sequence[str], text_bytes: Sequence[bytes]) -> dict[int, bytes]:
    """token id -> bytes for every token a match of a phrase's prefix can use: its bytes lie
    inside a prefix form, or it ends with a form's first k bytes after a word boundary (a merged
    start: " you", "(you", "\\nHere"). `text_bytes[i]`: token i's bytes, b"" for control tokens."""
    from exactedit.solvers.phrases import ends_at_boundary, forms

    prefixes = [f.prefix for f in forms(phrases, True) if f.prefix]
    starts = {p[:k] for p in prefixes for k in range(1, len(p) + 1)}
    longest = max(len(p) for p in prefixes)
    # every substring of a prefix no longer than a token: `b in inside` is `any(b in p for p in
    # prefixes)` in one set lookup (a scan over the prefixes per token was O(vocab x phrases))
    widest = max((len(b) for b in text_bytes), default=0)
    inside = {p[a:z] for p in prefixes for a in range(len(p)) for z in range(a + 1, min(len(p), a + widest) + 1)}
    out = {}
    for i, b in enumerate(text_bytes):
        if not b:
            continue
        if b in inside or any(
                b[-k:] in starts and ends_at_boundary(b[:-k]) for k in range(1, min(len(b) - 1, longest) + 1)):
            out[i] = b
    return out


def _final(text: str, tb, tokenize: Tokenize, where: str) -> int:
    from exactedit.solvers.phrases import split_last_word

    split = split_last_word(text)
    if split is None:
        raise ShapingRulesError(where, "prefix-penalty.phrases", f"{text!r} is one word; a phrase needs a prefix")
    canon = [int(t) for t in tokenize(" " + text, False)]
    if not canon or tb(canon[-1]) != split[1].encode("utf-8"):
        raise ShapingRulesError(where, "prefix-penalty.phrases", f"{text!r}: its last word {split[1]!r} is not one "
                                f"token of this model (it tokenizes as {[tb(t) for t in canon]}); the penalty lowers "
                                "one token, so ban a phrase whose last word is one token")
    return canon[-1]
