"""Compiled shaping rules: token ids only, as JSON any engine can implement (docs/shaping.md).

`CompiledRules` is what `solvers.shaping.rules_file.compile_rules` returns and `read_compiled` reads
back (every field validated, ids in range, the model's sha256 kept). `vocab()` / `rules` are the
objects `solvers.shaping.rules` runs; `native/shaping/c/shaping.c` implements the same JSON in C.

Layout (format "exactedit.shaping", version 2):
    model        {path, sha256, vocab}
    rules_file   {path, sha256}
    chat         {template_from: "gguf" | "rules", template (rules' own, else null), turn_start,
                  turn_end, header_end, assistant}       the texts, for people
    markup       {turn_start: [id], turn_end: [id], role: [id], header_end: id | null,
                  think: [open, close] | null, tool: [open, close] | null, names: {id: text}}
    classes      {newline, nl_lead, sentence_end, blank, invisible, structured, boundary, ticks: [id],
                  fences: [[id, lead, inner, trail]]}    per-token flags and fence runs (solvers.shaping.triggers)
    rules        in order: {kind: "prefix-penalty", bias, phrases: [{text, final, prefixes: [hex]}],
                  pieces: [[id, hex]], merge_ok: [[id, k]]}
                  | {kind: "step0-guard", bias, targets: [id]}
                  | {kind: "persona-case", drop, active, persona_tag, pairs: [[up, low]]}
`prefixes` are the byte strings a phrase's prefix is matched as (as written, Capitalized);
`pieces` the bytes of every token a match can use; `merge_ok` the (piece, k) pairs where the
piece may start a match with the prefix's first k bytes (its other bytes end in a word
boundary). `fences` lists the tokens whose text_fence is not (0, 0, 0): backtick runs carry across
tokens, so a fence split over tokens counts once. Version 1 (a ``` count per token, blind to split
fences) is refused. Derived data is checked against a recomputation when read.

`read_compiled` bounds the file before it parses (a regular file of at most MAX_BYTES, JSON
nested at most MAX_DEPTH deep) and the vocabulary before it allocates (at most MAX_VOCAB, and the
model's when `vocab` is given), and refuses a key the format does not have (a rule another engine
might read while this one ignores it); `solvers.shaping.rules_file.check_compiled` checks the rest
against the model's token table.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exactedit.solvers.shaping import rules as shaping
from exactedit.solvers.shaping.triggers import FENCE_RUN, FLAG_NAMES, TICKS, VISIBLE, ShapeVocab
from exactedit.errors import FieldError
from exactedit.files import atomic_write_text

FORMAT, VERSION = "exactedit.shaping", 2
MAX_BYTES = 1 << 28       # 256 MiB: a 1e5-phrase rules file for a 262k vocabulary is far smaller
MAX_DEPTH = 16            # the format nests 5 deep
MAX_VOCAB = 1 << 26
_CLASSES = ("newline", "nl_lead", "sentence_end", "blank", "invisible", "structured", "boundary", "ticks")


class ShapingRulesError(FieldError):
    """A rules file or a compiled rules file is malformed or does not fit the model."""


@dataclass(frozen=True, eq=False)
class CompiledRules:
    vocab: ShapeVocab
    rules: tuple
    persona: bool
    persona_tag: str
    model: dict
    rules_file: dict
    chat: dict
    names: dict

    def rule(self, kind: str):
        return next((r for r in self.rules if r.name == kind), None)

    def summary(self) -> dict:
        out = []
        for r in self.rules:
            if isinstance(r, shaping.PhrasePenalty):
                out.append({"kind": r.name, "bias": r.bias, "pieces": len(r.pieces), "phrases": [
                    {"text": p.text, "final": self.names.get(p.final, str(p.final))} for p in r.phrases]})
            elif isinstance(r, shaping.Step0Guard):
                out.append({"kind": r.name, "bias": r.bias, "targets": [self.names.get(t, str(t)) for t in r.targets]})
            else:
                out.append({"kind": r.name, "drop": r.drop, "pairs": len(r.pairs), "active": self.persona})
        return {"model": self.model, "chat": {k: v for k, v in self.chat.items() if k != "template"}, "rules": out}

    def to_dict(self) -> dict:
        v = self.vocab
        fl = v.flags
        classes = {}
        for name in _CLASSES:
            bit = VISIBLE if name == "invisible" else FLAG_NAMES[name]
            on = (fl & bit) == 0 if name == "invisible" else (fl & bit) != 0
            classes[name] = [int(i) for i in np.flatnonzero(on)]
        classes["fences"] = [[int(i), *map(int, v.fences[i])] for i in np.flatnonzero(v.fences.any(axis=1))]
        markup = {"turn_start": list(v.turn_start), "turn_end": list(v.turn_end), "role": list(v.role),
                  "header_end": v.header_end,
                  "think": None if v.think_open is None else [v.think_open, v.think_close],
                  "tool": None if v.tool_open is None else [v.tool_open, v.tool_close],
                  "names": {str(k): t for k, t in sorted(self.names.items())}}
        rules = []
        for r in self.rules:
            if isinstance(r, shaping.PhrasePenalty):
                rules.append(_penalty_dict(r))
            elif isinstance(r, shaping.Step0Guard):
                rules.append({"kind": r.name, "bias": r.bias, "targets": list(r.targets)})
            else:
                rules.append({"kind": r.name, "drop": r.drop, "active": self.persona, "persona_tag": self.persona_tag,
                              "pairs": [list(p) for p in r.pairs]})
        return {"format": FORMAT, "version": VERSION, "model": self.model, "rules_file": self.rules_file,
                "chat": self.chat, "markup": markup, "classes": classes, "rules": rules}

    @classmethod
    def from_dict(cls, d, where="rules.json") -> "CompiledRules":
        return _parse(d, str(where))


def _penalty_dict(r) -> dict:
    from exactedit.solvers.phrases import ends_at_boundary

    forms = r._matcher.forms
    starts = {f.prefix[:k] for f in forms if f.prefix for k in range(1, len(f.prefix) + 1)}
    merge = [[i, k] for i, b in sorted(r.pieces.items()) for k in range(1, len(b))
             if b[-k:] in starts and ends_at_boundary(b[:-k])]
    prefixes: list[list[str]] = [[] for _ in r.phrases]     # per phrase, in one pass over the forms
    for f in forms:
        if f.prefix:
            prefixes[f.phrase].append(f.prefix.hex())
    return {"kind": r.name, "bias": r.bias,
            "phrases": [{"text": p.text, "final": p.final, "prefixes": prefixes[j]} for j, p in enumerate(r.phrases)],
            "pieces": [[i, b.hex()] for i, b in sorted(r.pieces.items())], "merge_ok": merge}


def write_compiled(compiled: CompiledRules, path) -> None:
    """Write `compiled` as JSON (atomically). What `read_compiled` would refuse is refused here,
    naming the file and the field, before anything is written: more than MAX_BYTES, or a
    vocabulary over MAX_VOCAB."""
    V = compiled.vocab.size
    if not 1 <= V <= MAX_VOCAB:
        raise ShapingRulesError(path, "model.vocab", f"expected 1..{MAX_VOCAB}, got {V}")
    text = json.dumps(compiled.to_dict(), separators=(",", ":")) + "\n"          # ASCII: len is bytes
    if len(text) > MAX_BYTES:
        raise ShapingRulesError(path, "file", f"{len(text)} bytes; compiled rules are at most {MAX_BYTES} (fewer "
                                "phrases, or a shorter chat template)")
    atomic_write_text(path, text)


def _depth(obj) -> int:
    """How deep arrays and objects nest in a parsed JSON value (iterative: no recursion to exhaust)."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, depth)
            todo.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v)
                        if isinstance(x, (list, dict)))
    return deepest


def read_compiled(path, vocab: int | None = None) -> CompiledRules:
    """Read and validate compiled rules; `vocab`: the model's vocabulary size, when known."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ShapingRulesError(path, "file", "not a regular file (a FIFO, device or directory)")
            if st.st_size > MAX_BYTES:
                raise ShapingRulesError(path, "file", f"{st.st_size} bytes; compiled rules are at most {MAX_BYTES}")
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ShapingRulesError(path, "file", f"cannot read ({exc.strerror or exc})") from None
    if len(data) > MAX_BYTES:
        raise ShapingRulesError(path, "file", f"more than {MAX_BYTES} bytes")
    try:
        d = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShapingRulesError(path, "json", f"not valid JSON ({exc})"[:300]) from None
    except RecursionError:   # the C decoder's own bound (about 1000 levels), hit before ours
        raise ShapingRulesError(path, "json", f"nested too deep; the format nests at most {MAX_DEPTH}") from None
    if _depth(d) > MAX_DEPTH:
        raise ShapingRulesError(path, "json", f"nested {_depth(d)} deep; the format nests at most {MAX_DEPTH}")
    return _parse(d, str(path), vocab)


# the keys each object of the format may hold (any other is refused: a key this reader does not
# know would be ignored here and perhaps read by another engine)
_KEYS = {"": ("format", "version", "model", "rules_file", "chat", "markup", "classes", "rules"),
         "model": ("path", "sha256", "vocab"), "rules_file": ("path", "sha256"),
         "chat": ("template_from", "template", "turn_start", "turn_end", "header_end", "assistant"),
         "markup": ("turn_start", "turn_end", "role", "header_end", "think", "tool", "names"),
         "classes": _CLASSES + ("fences",),
         "prefix-penalty": ("kind", "bias", "phrases", "pieces", "merge_ok"),
         "step0-guard": ("kind", "bias", "targets"),
         "persona-case": ("kind", "drop", "active", "persona_tag", "pairs")}


def _parse(d, where: str, vocab: int | None = None) -> CompiledRules:
    def known(obj, keys: str, field: str) -> None:
        extra = sorted(set(obj) - set(_KEYS[keys])) if isinstance(obj, dict) else ()
        if extra:
            raise ShapingRulesError(where, f"{field}.{extra[0]}" if field else str(extra[0]),
                                    f"unknown key; expected one of {list(_KEYS[keys])}"[:300])

    def need(obj, key, kind, field):
        if not isinstance(obj, dict) or key not in obj:
            raise ShapingRulesError(where, field, "missing")
        v = obj[key]
        if not isinstance(v, kind) or (isinstance(v, bool) and kind in (int, float, (int, float))):
            raise ShapingRulesError(where, field, f"expected {getattr(kind, '__name__', 'a number')}, got {v!r}"[:200])
        return v

    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ShapingRulesError(where, "format", f"expected {FORMAT!r}")
    if d.get("version") == 1:
        raise ShapingRulesError(where, "version", "1: its per-token ``` counts miss a code fence split over tokens "
                                "(Qwen2.5's \"``\" + \"`\\n\"), leaving the rules off after a code block; "
                                f"recompile with `exactedit shape compile` (version {VERSION})")
    if d.get("version") != VERSION:
        raise ShapingRulesError(where, "version", f"expected {VERSION}, got {d.get('version')!r}")
    known(d, "", "")
    for key in ("model", "rules_file", "chat", "markup", "classes"):
        known(d.get(key), key, key)
    model = need(d, "model", dict, "model")
    V = need(model, "vocab", int, "model.vocab")
    need(model, "sha256", str, "model.sha256")
    if not 1 <= V <= MAX_VOCAB:
        raise ShapingRulesError(where, "model.vocab", f"expected 1..{MAX_VOCAB}, got {V}")
    if vocab is not None and V != vocab:
        raise ShapingRulesError(where, "model.vocab", f"{V}, but the model has {vocab} tokens")
    for key in ("chat", "rules_file"):
        if not isinstance(d.get(key, {}), dict):
            raise ShapingRulesError(where, key, f"expected an object, got {type(d[key]).__name__}")
    chat = d.get("chat") or {}
    for key in ("template_from", "turn_start", "turn_end", "header_end", "assistant"):
        if key in chat and not isinstance(chat[key], str):
            raise ShapingRulesError(where, f"chat.{key}", f"expected a string, got {chat[key]!r}"[:200])
    template = chat.get("template")
    if chat.get("template_from", "gguf") not in ("gguf", "rules") or not isinstance(template, (str, type(None))) \
            or (chat.get("template_from") == "rules" and template is None):
        raise ShapingRulesError(where, "chat.template_from", "expected \"gguf\", or \"rules\" with the template")

    def ids(v, field, n=None):
        if not isinstance(v, list) or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < V for t in v):
            raise ShapingRulesError(where, field, f"expected a list of token ids in [0, {V})")
        if n is not None and len(v) != n:
            raise ShapingRulesError(where, field, f"expected {n} ids, got {len(v)}")
        return [int(t) for t in v]

    def opt_pair(v, field):
        return None if v is None else ids(v, field, 2)

    m = need(d, "markup", dict, "markup")
    header_end = m.get("header_end")
    if header_end is not None:
        header_end = ids([header_end], "markup.header_end")[0]
    think, tool = opt_pair(m.get("think"), "markup.think"), opt_pair(m.get("tool"), "markup.tool")
    c = need(d, "classes", dict, "classes")
    flags = np.zeros(V, np.uint8)
    for name in _CLASSES:
        sel = ids(need(c, name, list, f"classes.{name}"), f"classes.{name}")
        bit = VISIBLE if name == "invisible" else FLAG_NAMES[name]
        flags[sel] |= bit
    flags ^= VISIBLE  # "invisible" lists the complement
    fences = np.zeros((V, 3), np.uint8)
    for k, row in enumerate(need(c, "fences", list, "classes.fences")):
        run = row[1:] if isinstance(row, list) and len(row) == 4 else None
        if run is None or any(isinstance(x, bool) or not isinstance(x, int) for x in run) \
                or not (0 <= run[0] <= FENCE_RUN and 0 <= run[1] < 256 and 0 <= run[2] <= FENCE_RUN and any(run)):
            raise ShapingRulesError(where, f"classes.fences[{k}]", f"expected [id, lead 0..{FENCE_RUN}, inner "
                                    f"0..255, trail 0..{FENCE_RUN}], not all 0")
        tok = ids(row[:1], f"classes.fences[{k}]")[0]
        if flags[tok] & TICKS and (run[0] != run[2] or run[1]):
            raise ShapingRulesError(where, f"classes.fences[{k}]", "a ticks token's run is one: lead = trail, inner 0")
        fences[tok] = run
    turn_start = ids(need(m, "turn_start", list, "markup.turn_start"), "markup.turn_start", 1)
    role = ids(need(m, "role", list, "markup.role"), "markup.role")
    if not role:
        raise ShapingRulesError(where, "markup.role", "expected the assistant role's tokens, got none")
    try:
        vocab = ShapeVocab(flags, fences, turn_start,
                           ids(need(m, "turn_end", list, "markup.turn_end"), "markup.turn_end"),
                           role, header_end,
                           *(think or (None, None)), *(tool or (None, None)))
    except ValueError as exc:
        raise ShapingRulesError(where, "markup", str(exc)) from None
    rules, persona, tag = [], True, "style"
    for k, r in enumerate(need(d, "rules", list, "rules")):
        f = f"rules[{k}]"
        kind = need(r, "kind", str, f"{f}.kind")
        if kind in ("prefix-penalty", "step0-guard", "persona-case"):
            known(r, kind, f)
        try:
            if kind == "prefix-penalty":
                phrases = [shaping.TextPhrase(need(p, "text", str, f"{f}.phrases[{j}].text"),
                                              ids([need(p, "final", int, f"{f}.phrases[{j}].final")], f"{f}.phrases")[0])
                           for j, p in enumerate(need(r, "phrases", list, f"{f}.phrases"))]
                pieces = {}
                for j, pc in enumerate(need(r, "pieces", list, f"{f}.pieces")):
                    if not isinstance(pc, list) or len(pc) != 2 or not isinstance(pc[1], str):
                        raise ShapingRulesError(where, f"{f}.pieces[{j}]", "expected [id, hex bytes]")
                    pieces[ids(pc[:1], f"{f}.pieces[{j}]")[0]] = bytes.fromhex(pc[1])
                rule = shaping.PhrasePenalty(need(r, "bias", (int, float), f"{f}.bias"), tuple(phrases), pieces)
                want = _penalty_dict(rule)
                for key in ("phrases", "merge_ok"):
                    if r.get(key) != want[key]:
                        raise ShapingRulesError(where, f"{f}.{key}", "does not match what the phrases and pieces give "
                                                "(edited by hand? recompile with exactedit shape compile)")
                rules.append(rule)
            elif kind == "step0-guard":
                rules.append(shaping.Step0Guard(need(r, "bias", (int, float), f"{f}.bias"),
                                                tuple(ids(need(r, "targets", list, f"{f}.targets"), f"{f}.targets"))))
            elif kind == "persona-case":
                pairs = need(r, "pairs", list, f"{f}.pairs")
                flat = ids([t for p in pairs for t in (p if isinstance(p, list) and len(p) == 2 else [-1])], f"{f}.pairs")
                rules.append(shaping.PersonaCase(tuple(zip(flat[0::2], flat[1::2])), (),
                                                 need(r, "drop", (int, float), f"{f}.drop")))
                persona, tag = need(r, "active", bool, f"{f}.active"), need(r, "persona_tag", str, f"{f}.persona_tag")
            else:
                raise ShapingRulesError(where, f"{f}.kind", f"unknown rule {kind!r}")
        except ValueError as exc:
            raise ShapingRulesError(where, f, str(exc)) from None
    raw_names = m.get("names") or {}
    if not isinstance(raw_names, dict) or any(not k.isdigit() or not isinstance(t, str) for k, t in raw_names.items()):
        raise ShapingRulesError(where, "markup.names", "expected an object of token id -> token text")
    names = {int(k): t for k, t in raw_names.items()}
    if any(k >= V for k in names):
        raise ShapingRulesError(where, "markup.names", f"a token id lies outside [0, {V})")
    return CompiledRules(vocab, tuple(rules), persona, tag, dict(model), dict(d.get("rules_file") or {}),
                         dict(chat), names)
