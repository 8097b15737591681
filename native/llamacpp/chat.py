"""What a model's GGUF says about its own chat: template, turn framing, special tokens, roles.

`model_chat(path)` reads them once: the chat template (`tokenizer.chat_template`, rendered only in
Jinja2's immutable sandbox, quant/model/chat_template.py), the turn framing probed from it (ChatML when
the file has no template; a template that is refused or fails stops here unless the caller names
a fallback framing), the special tokens and the turn end (quant/model/specials.py) and the token
table. `model_chat(path, template=FILE)` takes the chat template from a Jinja2 file the user gives
instead (`--chat-template`; it wins over the GGUF's own, and is rendered in the same sandbox): the
framing, the specials and the turn end are then read off it (framing "user:FILE"), and a given
template that fails or has no turn shape always stops, naming the file. Dumps made from chat text get their row roles from these (dumps/roles.py), so nothing here
assumes one model family.

Document names are stable across runs: a hash of what the document is made of (the prompt, the
text, the conversation) and, for a sampled reply, the sample seed.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exactedit.dumps.roles import infer_roles
from exactedit.files import decode_utf8, lone_surrogate, read_regular
from exactedit.native.llamacpp.engine import EngineError
from exactedit.quant import gguf
from exactedit.quant.model.chat_template import (CHATML, ChatFormat, ChatTemplate, ChatTemplateError, GivenTemplate,
    check_messages, from_gguf, probe_format, read_template)
from exactedit.quant.model.specials import ModelSpecials, model_specials
from exactedit.solvers.tail.model import TokenTable, load_tokens


class _Strings:
    """token id -> decoded text, on demand (infer_roles reads only the ids it meets)."""

    def __init__(self, table: TokenTable):
        self.table, self._cache = table, {}

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int) -> str:
        s = self._cache.get(i)
        if s is None:
            s = self._cache[i] = self.table.decode([i])
        return s


# framings a user may name for a model whose template is refused or fails (`fallback=`)
FALLBACKS = {"chatml": CHATML}


@dataclass(frozen=True, eq=False)
class ModelChat:
    """A model's chat conventions. `template` is None when the GGUF carries none or it was
    refused (then `render` refuses). `framing` says where `fmt` came from: "gguf" (probed from the
    model's template), "user:FILE" (probed from the template the user gave; `given` holds it),
    "fallback:NAME" (the template was refused or failed and the caller named that fallback;
    `template_error` says why) or "default:chatml" (the GGUF has no template)."""

    path: Path
    template: ChatTemplate | None
    fmt: ChatFormat
    framing: str
    specials: ModelSpecials
    table: TokenTable
    template_error: str = ""
    given: GivenTemplate | None = None

    def render(self, messages, *, add_generation_prompt: bool = False) -> str:
        return self._template().render(messages, add_generation_prompt=add_generation_prompt)

    def render_many(self, conversations, *, add_generation_prompt: bool = False) -> list[str]:
        return self._template().render_many(conversations, add_generation_prompt=add_generation_prompt)

    def _template(self) -> ChatTemplate:
        if self.template is None:
            raise ChatTemplateError(self.path, "tokenizer.chat_template", self.template_error or
                                    "this GGUF carries no chat template, so chat text cannot be rendered the model's way")
        return self.template

    def prompt(self, user: str, system: str | None = None) -> str:
        """One user turn (after a system turn, when `system` is given), ready for the model's reply
        (the template's generation prompt)."""
        turns = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": user}]
        return self.render(turns, add_generation_prompt=True)

    def roles(self, tokens, next_token: int | None = None) -> np.ndarray:
        """uint8 row roles of one document (dumps/roles.py), with this model's turn framing."""
        return infer_roles(np.asarray(tokens), _Strings(self.table), self.specials.specials,
                           next_token=next_token, fmt=self.fmt)

    def is_chat(self, tokens) -> bool:
        """Whether a token stream holds a chat turn (the framing's turn-start special token)."""
        ids = [i for i in self.specials.specials if self.table.tokens[i] == self.fmt.turn_start]
        return bool(ids) and bool(np.isin(np.asarray(tokens), ids).any())

    def to_dict(self) -> dict:
        out = {"chat_template": self.template is not None, "format": self.fmt.to_dict(), "chat_framing": self.framing,
               "specials": self.specials.to_dict()}
        if self.given is not None:
            out["chat_template_file"] = {"path": self.given.path, "sha256": self.given.sha256}
        return {**out, "template_error": self.template_error} if self.template_error else out


def tag_texts(table: TokenTable, specials: ModelSpecials) -> list[str]:
    """The special tokens' strings that can be chat tags: not the whitespace ones (Gemma's
    user-defined runs of newlines are text, and a "\n" token must not read as a turn start)."""
    return [table.tokens[i] for i in specials.specials if table.tokens[i].strip()]


def given_template(template) -> GivenTemplate | None:
    """A chat template given by the user: None, a GivenTemplate, or a path to its Jinja2 file
    (read bounded, quant.model.chat_template.read_template)."""
    if template is None or isinstance(template, GivenTemplate):
        return template
    return read_template(template)


def model_chat(path, *, fallback: str | None = None, template=None) -> ModelChat:
    """The chat conventions of the GGUF at `path`. A template that is refused, fails or has no
    turn shape stops here with its ChatTemplateError unless `fallback` names a framing of
    FALLBACKS to use instead (recorded as `framing` "fallback:NAME"). `template`: a chat template
    the user gives (a Jinja2 file's path, or a GivenTemplate), used instead of the GGUF's own."""
    path = Path(path)
    if fallback is not None and fallback not in FALLBACKS:
        raise ChatTemplateError(path, "fallback", f"expected one of {sorted(FALLBACKS)}, got {fallback!r}")
    given = given_template(template)
    if given is not None:
        return _given_chat(path, given)
    with gguf.open(path) as g:
        specials = model_specials(g)
        table = load_tokens(g)
        has_template = g.get("tokenizer.chat_template") is not None
        error, template = None, None
        if has_template:
            try:
                template = from_gguf(g)
            except ChatTemplateError as exc:
                error = exc
    if not has_template:
        return ModelChat(path, None, CHATML, "default:chatml", specials, table)
    if template is not None:
        try:
            return ModelChat(path, template, probe_format(template, tag_texts(table, specials)), "gguf", specials, table)
        except ChatTemplateError as exc:
            error = exc
    if fallback is None:
        raise ChatTemplateError(error.path, error.field, f"{error.message}; so the model's turn framing (the roles "
                                "and the turn end) cannot be read off it: name a fallback framing "
                                f"({', '.join(sorted(FALLBACKS))}) to use one instead") from None
    return ModelChat(path, template, FALLBACKS[fallback], f"fallback:{fallback}", specials, table, error.message)


def _given_chat(path: Path, given: GivenTemplate) -> ModelChat:
    """model_chat with the user's template: its framing, specials and turn end, or its error."""
    with gguf.open(path) as g:
        specials = model_specials(g, given)
        table = load_tokens(g)
        template = given.compile(g)
    if specials.template_error:
        template.close()
        raise ChatTemplateError(given.path, "chat_template", f"{specials.template_error}; so the model's turn "
                                "framing (the roles and the turn end) cannot be read off it")
    fmt = probe_format(template, tag_texts(table, specials))
    return ModelChat(path, template, fmt, f"user:{given.path}", specials, table, given=given)


def short_hash(obj) -> str:
    """12 hex digits of the sha256 of a string, bytes or JSON-able object (canonical JSON)."""
    if isinstance(obj, str):
        data = obj.encode("utf-8")
    elif isinstance(obj, (bytes, bytearray)):
        data = bytes(obj)
    else:
        data = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(data).hexdigest()[:12]


def reply_name(prompt: str, seed: int, prefix: str = "chat") -> str:
    """The stable name of a sampled reply: the prompt's hash and the sample seed."""
    return f"{prefix}-{short_hash(prompt)}-s{int(seed)}"


def unique_names(names) -> list[str]:
    """The names, a repeat suffixed -2, -3, ... (a repeated input is still a distinct document)."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}-{seen[n]}")
    return out


MAX_CHAT_BYTES = 64 << 20     # an `engine dump --chat` file, read whole


def read_chat_jsonl(path, field: str = "chat") -> list[list[dict]]:
    """Conversations, one JSON list of {"role", "content"} per line (blank lines skipped): a regular
    file of at most MAX_CHAT_BYTES, UTF-8; a line nested too deeply or holding a lone surrogate
    (JSON's "\\ud800": no UTF-8 encodes it, for the template or the tokenizer) is refused naming it;
    `field` names the file in errors (the flag that gave it)."""
    path = Path(path)
    out = []
    lines = decode_utf8(read_regular(path, MAX_CHAT_BYTES, EngineError, field), path, EngineError, field).splitlines()
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            conv = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EngineError(path, f"line {no}", f"not JSON ({exc.msg})") from None
        except RecursionError:
            raise EngineError(path, f"line {no}", "not JSON (nested too deeply)") from None
        if not isinstance(conv, list) or not conv:
            raise EngineError(path, f"line {no}", "expected a non-empty list of {\"role\", \"content\"} objects")
        todo = [conv]
        while todo:                                       # every string, keys too (no recursion to exhaust)
            v = todo.pop()
            if isinstance(v, str) and lone_surrogate(v) is not None:
                raise EngineError(path, f"line {no}", f"a lone surrogate in {ascii(v)[:60]}: not valid Unicode text")
            todo += v if isinstance(v, list) else [*v.keys(), *v.values()] if isinstance(v, dict) else []
        try:        # as the template takes it: a bad role was refused naming the model, not this line
            check_messages(conv)
        except ChatTemplateError as exc:
            raise EngineError(path, f"line {no}: {exc.field}", exc.message[:300]) from None
        out.append(conv)
    if not out:
        raise EngineError(path, field, "no conversations (one JSON list per line)")
    return out


def render_prompt(template, user: str) -> str:
    """One user turn and the template's generation prompt (quant.model.chat_template.ChatTemplate)."""
    return template.render([{"role": "user", "content": user}], add_generation_prompt=True)


def prompt_tokens(engine, text: str, bos: int | None = None) -> np.ndarray:
    """A rendered prompt's tokens (specials parsed); `bos` is prepended when the vocabulary adds
    one and the template did not already write it."""
    toks = engine.tokenize(text, parse_special=True)
    if bos is not None and (toks.size == 0 or int(toks[0]) != bos):
        toks = np.concatenate([np.array([bos], np.int32), toks])
    return toks
