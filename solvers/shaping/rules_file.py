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
chat framing (quant.model.specials, quant.model.chat_template: the template is rendered only in its
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
MAX_RULES_FILE = 64 << 20   # a rules file (TOML) is read whole
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
    from exactedit.files import read_regular

    path = Path(path)
    data = read_regular(path, MAX_RULES_FILE, ShapingRulesError, "file")    # a FIFO or device refused
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ShapingRulesError(path, "toml", f"not valid TOML ({exc})") from None
    except RecursionError:
        raise ShapingRulesError(path, "toml", "not valid TOML (nested too deeply)") from None
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
            _check_phrases(phrases, where, f("phrases"))
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


def matcher_bytes(raw: Sequence[bytes], types: Sequence[int]) -> list[bytes]:
    """Token bytes as the phrase matcher sees them: a control token (chat scaffolding) has no text, b""."""
    from exactedit.solvers.phrases import TOKEN_CONTROL

    return [b"" if ty == TOKEN_CONTROL else b for b, ty in zip(raw, types)]


@dataclass(frozen=True, eq=False)
class _ModelView:
    """What compiling reads of one GGUF: token bytes and texts, the matcher's view (control
    tokens as b""), the specials by name, and the name the errors give the model."""

    g: object
    name: str
    raw: list
    text_bytes: list
    texts: list
    sp: object
    by_name: dict

    @classmethod
    def of(cls, g, model_path: str = "") -> "_ModelView":
        from exactedit.quant.model.specials import model_specials
        from exactedit.solvers.tail.model import load_tokens

        table = load_tokens(g)
        raw = [table.token_bytes(i) for i in range(len(table))]
        types = table.types or (0,) * len(table)
        text_bytes = matcher_bytes(raw, types)
        sp = model_specials(g)
        texts = [b.decode("utf-8", errors="replace") for b in raw]  # = table.piece(i)
        by_name: dict[str, int] = {}
        for i in sp.specials:
            by_name.setdefault(texts[i], i)
        return cls(g, model_path or str(g.path), raw, text_bytes, texts, sp, by_name)

    def special(self, name: str, where: str, field: str) -> int:
        if name not in self.by_name:
            raise ShapingRulesError(where, field, f"{name!r} is not a special token of {self.name}")
        return self.by_name[name]

    def template(self, text: str | None, where: str):
        """(template, "rules" | "gguf"): the rules' own template, else the GGUF's."""
        from exactedit.quant.model import chat_template as ct

        sp, texts = self.sp, self.texts
        if text is not None:
            return ct.ChatTemplate(text, bos_token=texts[sp.ids["bos"]] if "bos" in sp.ids else "",
                                   eos_token=texts[sp.ids["eos"]] if "eos" in sp.ids else "",
                                   where=f"{where}: chat.template"), "rules"
        if self.g.get("tokenizer.chat_template") is not None:
            return ct.from_gguf(self.g), "gguf"
        raise ShapingRulesError(where, "chat.template", f"{self.name} carries no chat template; give one "
                                "in the rules file's [chat] table so the turn framing is known")

    def framing(self, tpl, where: str):
        """(format, turn_start, turn_end ids, header_end id | None) of the template for this model."""
        from exactedit.quant.model import chat_template as ct

        # control tokens only: a user-defined token can be plain text (Gemma's "\n"), never a chat tag
        fmt = ct.probe_format(tpl, [self.texts[i] for i in self.sp.control])
        turn_start = self.special(fmt.turn_start, where, "chat.template (turn start)")
        turn_end = tuple(dict.fromkeys([self.special(fmt.turn_end, where, "chat.template (turn end)"),
                                        *self.sp.end_of_generation]))
        header_end = (None if fmt.header_end == "\n"
                      else self.special(fmt.header_end, where, "chat.template (header end)"))
        return fmt, turn_start, turn_end, header_end

    def flags(self) -> tuple[np.ndarray, np.ndarray]:
        """(per-token flags uint8 [V], fence runs uint8 [V, 3]) as the triggers read them."""
        from exactedit.solvers.phrases import ends_at_boundary

        flags = [text_flags(t) for t in self.texts]
        fl = np.array([f for f, _ in flags], dtype=np.uint8)
        fences = np.array([c for _, c in flags], dtype=np.uint8).reshape(-1, 3)
        bound = np.array([ends_at_boundary(b) for b in self.text_bytes], dtype=bool)  # control: no text
        return np.where(bound, fl | BOUNDARY, fl & ~np.uint8(BOUNDARY)).astype(np.uint8), fences


def compile_rules(spec: RulesSpec, g, tokenize: Tokenize, *, model_path: str = "") -> CompiledRules:
    """Resolve `spec` against the open GGUF `g` (its token table, specials and chat template)
    with the model's own tokenizer `tokenize` (llama.cpp's, in native.shaping.compile)."""
    m = _ModelView.of(g, model_path)
    where = spec.path
    texts, text_bytes, sp, by_name = m.texts, m.text_bytes, m.sp, m.by_name
    tb = text_bytes.__getitem__

    def special(name: str, field: str) -> int:
        return m.special(name, where, field)

    tpl, template_from = m.template(spec.chat.template, where)
    fmt, turn_start, turn_end, header_end = m.framing(tpl, where)
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
    fl, fences = m.flags()
    try:
        vocab = ShapeVocab(fl, fences, (turn_start,), turn_end, role, header_end,
                           *(think or (None, None)), *(tool or (None, None)))
    except ValueError as exc:
        raise ShapingRulesError(where, "chat", f"the chat markup of {m.name} does not fit: {exc}") from None
    rules, persona, persona_tag = [], True, "style"
    for r in spec.rules:
        if isinstance(r, PenaltySpec):
            phrases = tuple(shaping.TextPhrase(p, _final(p, tb, tokenize, where)) for p in r.phrases)
            try:
                rules.append(shaping.PhrasePenalty(r.bias, phrases, phrase_pieces(r.phrases, text_bytes)))
            except ValueError as exc:
                raise ShapingRulesError(where, "prefix-penalty.phrases", str(exc)) from None
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
    model = {"path": m.name, "sha256": g.sha256(), "vocab": len(texts)}
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


def _check_phrases(phrases: Sequence[str], where: str, field: str) -> None:
    """Refuse a phrase no penalty should carry (solvers.phrases.phrase_problem: a control
    character, a lone surrogate, too long)."""
    from exactedit.solvers.phrases import phrase_problem

    for k, p in enumerate(phrases):
        problem = phrase_problem(p)
        if problem is not None:
            raise ShapingRulesError(where, f"{field}[{k}]", problem)


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


def listed_penalty(phrases: Sequence[str], bias: float, g, tokenize: Tokenize, *, model_path: str = ""
                   ) -> tuple[PenaltySpec | None, tuple[tuple[str, str], ...]]:
    """A prefix penalty on a phrase list given outside a rules file (e.g. `exactedit discover`'s
    JSON): the phrases whose last word is one token of the model, and (phrase, why) for the others,
    which a penalty on one token cannot ban."""
    m = _ModelView.of(g, model_path)
    keep, skipped = [], []
    phrases = tuple(dict.fromkeys(" ".join(x.split()) for x in phrases))
    _check_phrases(phrases, "--phrases", "phrases")
    for p in phrases:
        try:
            _final(p, m.text_bytes.__getitem__, tokenize, "phrases")
        except ShapingRulesError as exc:
            skipped.append((p, exc.message))
            continue
        keep.append(p)
    return (PenaltySpec(tuple(keep), float(bias)) if keep else None), tuple(skipped)


def check_compiled(compiled: CompiledRules, g, where, *, model_path: str = "") -> None:
    """Check compiled rules against the model they are used with, re-deriving from its token
    table what compiling derived: the vocabulary size, the chat markup from the template the
    rules name, each token's flags, each phrase's final token (its last word's bytes) and token
    pieces, the guard's targets (special tokens), the case pairs and the token names. Raises
    ShapingRulesError naming the field that differs (a file edited by hand, or for another model)."""
    from exactedit.solvers.phrases import split_last_word

    where = str(where)
    m = _ModelView.of(g, model_path)
    v = compiled.vocab

    def refuse(field: str, what: str):
        raise ShapingRulesError(where, field, f"{what}; the model {m.name} gives otherwise (edited by hand? "
                                "recompile with exactedit shape compile)")

    if v.size != len(m.texts):
        refuse("model.vocab", f"{v.size} tokens, the model has {len(m.texts)}")
    tpl, template_from = m.template(compiled.chat.get("template") if compiled.chat.get("template_from") == "rules"
                                    else None, where)
    fmt, turn_start, turn_end, header_end = m.framing(tpl, where)
    if v.turn_start != (turn_start,):
        refuse("markup.turn_start", f"{list(v.turn_start)}, expected [{turn_start}] ({fmt.turn_start!r})")
    if v.turn_end != turn_end:
        refuse("markup.turn_end", f"{list(v.turn_end)}, expected {list(turn_end)}")
    if v.header_end != header_end:
        refuse("markup.header_end", f"{v.header_end}, expected {header_end}")
    if not v.role or b"".join(m.raw[t] for t in v.role) != fmt.assistant.encode("utf-8"):
        refuse("markup.role", f"{list(v.role)} does not spell the assistant role {fmt.assistant!r}")
    for key, pair in (("think", (v.think_open, v.think_close)), ("tool", (v.tool_open, v.tool_close))):
        if pair[0] is not None and not set(pair) <= set(m.sp.specials):
            refuse(f"markup.{key}", f"{list(pair)} are not special tokens")
    fl, fences = m.flags()
    if not np.array_equal(v.flags, fl) or not np.array_equal(v.fences, fences):
        bad = int(np.flatnonzero((v.flags != fl) | (v.fences != fences).any(axis=1))[0])
        refuse("classes", f"token {bad} ({m.texts[bad]!r}) has other flags")
    for k, r in enumerate(compiled.rules):
        f = f"rules[{k}]"
        if isinstance(r, shaping.PhrasePenalty):
            for j, p in enumerate(r.phrases):
                word = split_last_word(p.text)[1].encode("utf-8")
                if m.text_bytes[p.final] != word:
                    refuse(f"{f}.phrases[{j}].final", f"token {p.final} is {m.raw[p.final]!r}, not the last word "
                           f"{word!r} of {p.text!r}")
            want = phrase_pieces([p.text for p in r.phrases], m.text_bytes)
            if r.pieces != want:
                bad = min(set(r.pieces.items()) ^ set(want.items()))
                refuse(f"{f}.pieces", f"token {bad[0]} as {r.pieces.get(bad[0])!r}, the model's piece is "
                       f"{want.get(bad[0])!r}")
        elif isinstance(r, shaping.Step0Guard):
            if not set(r.targets) <= set(m.sp.specials) | set(turn_end):
                refuse(f"{f}.targets", f"{sorted(set(r.targets) - set(m.sp.specials))} are not special tokens")
        else:
            allowed = set(shaping.case_pairs(m.texts, None, skip=m.sp.specials))
            extra = [p for p in r.pairs if tuple(p) not in allowed]
            if extra:
                refuse(f"{f}.pairs", f"{list(extra[0])} is not a (Capitalized, lowercase) token pair")
    for i, text in compiled.names.items():
        if not 0 <= i < len(m.texts) or m.texts[i] != text:
            refuse("markup.names", f"token {i} named {text!r}")
