"""A model's own chat template (`tokenizer.chat_template` in its GGUF), rendered in a sandbox.

The template is a Jinja2 program written by whoever made the file: untrusted code. It is only
ever rendered in Jinja2's `ImmutableSandboxedEnvironment` (no attribute or global outside the
sandbox's safe set, no mutation of the messages), and whatever the template does wrong (reaching
outside the sandbox, a syntax error, `raise_exception`, an undefined name used as an object)
comes back as one `ChatTemplateError` naming the model and what happened.

The environment follows the conventions chat templates are written for (as Hugging Face's
`apply_chat_template` renders them): `trim_blocks` and `lstrip_blocks`, the `loopcontrols`
extension, a `tojson` filter that keeps non-ASCII text, and the globals `raise_exception` and
`strftime_now`; `bos_token` and `eos_token` are the model's own token strings.

`probe_format` renders two tiny conversations with sentinel contents and reads off how the
template frames a turn (the special token that opens one, the header that names the role, the
token that closes it), so row roles can be derived from the model's template rather than
assumed (dumps/roles.py).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from exactedit.quant.errors import FieldError

ROLES = ("system", "user", "assistant", "tool")
_SENTINEL_USER = "xq7userzz"
_SENTINEL_REPLY = "xq7replyzz"


class ChatTemplateError(FieldError):
    """A chat template is missing, malformed, refused by the sandbox, or failed while rendering."""


@dataclass(frozen=True)
class ChatFormat:
    """How a template frames a turn: `turn_start` opens it, then the role's name and `header_end`
    (text such as "\\n", or a special token), the content, then `turn_end`. `assistant` is the
    role name the template writes for the model's own turns ("assistant", "model")."""

    turn_start: str = "<|im_start|>"
    turn_end: str = "<|im_end|>"
    header_end: str = "\n"
    assistant: str = "assistant"

    def to_dict(self) -> dict:
        return {"turn_start": self.turn_start, "turn_end": self.turn_end, "header_end": self.header_end,
                "assistant": self.assistant}


CHATML = ChatFormat()


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False, separators=None):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys,
                      separators=separators)


class ChatTemplate:
    """A compiled template; `render(messages)` gives the prompt text (special tokens as text)."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", where: str = "chat_template"):
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:  # a declared dependency; only a broken install lacks it
            raise ChatTemplateError(where, "jinja2", f"not importable ({exc})") from None
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError(where, "tokenizer.chat_template", "empty or not a string")
        self.source, self.where = source, where
        self.bos_token, self.eos_token = bos_token, eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = self._raise
        env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
        self._jinja = jinja2
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(where, "tokenizer.chat_template",
                                    f"not a valid Jinja2 template (line {exc.lineno}: {exc.message})") from None

    def _raise(self, message):
        raise ChatTemplateError(self.where, "tokenizer.chat_template", f"the template raised: {message}")

    def render(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = False,
               **extra) -> str:
        msgs = check_messages(messages, self.where)
        try:
            out = self._template.render(messages=msgs, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except ChatTemplateError:
            raise
        except self._jinja.exceptions.SecurityError as exc:
            raise ChatTemplateError(self.where, "tokenizer.chat_template",
                                    f"refused by the sandbox: the template reached outside it ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - untrusted code: any failure is the template's
            raise ChatTemplateError(self.where, "tokenizer.chat_template",
                                    f"failed while rendering ({type(exc).__name__}: {exc})") from None
        if not isinstance(out, str):
            raise ChatTemplateError(self.where, "tokenizer.chat_template", "did not render to text")
        return out


def check_messages(messages, where="messages") -> list[dict[str, str]]:
    """A conversation as the template sees it: a non-empty list of {"role", "content"} strings."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError(where, "messages", "expected a non-empty list of {\"role\", \"content\"} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ChatTemplateError(where, f"messages[{i}]", f"expected {{\"role\": str, \"content\": str}}, got {m!r}")
        if m["role"] not in ROLES:
            raise ChatTemplateError(where, f"messages[{i}].role", f"expected one of {ROLES}, got {m['role']!r}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def from_gguf(g) -> ChatTemplate:
    """The chat template of an open GGUF (quant.gguf.GGUFFile), with its bos / eos token strings."""
    source = g.get("tokenizer.chat_template")
    if source is None:
        raise ChatTemplateError(g.path, "tokenizer.chat_template",
                                "this GGUF carries no chat template, so chat text cannot be rendered "
                                "the model's way")
    tokens = g.tokens()

    def tok(key):
        i = g.get(key)
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else ""

    return ChatTemplate(source, bos_token=tok("tokenizer.ggml.bos_token_id"),
                        eos_token=tok("tokenizer.ggml.eos_token_id"), where=str(g.path))


def probe_format(template: ChatTemplate, special_texts: Sequence[str]) -> ChatFormat:
    """How `template` frames a turn, read off two renders with sentinel contents; `special_texts`
    are the model's special token strings (only they can be tags). Raises ChatTemplateError when
    the renders do not have the "START role HEADER_END content END" shape."""
    where = template.where
    user = [{"role": "user", "content": _SENTINEL_USER}]
    prompt = template.render(user, add_generation_prompt=True)
    full = template.render(user + [{"role": "assistant", "content": _SENTINEL_REPLY}])
    specials = sorted({s for s in special_texts if s}, key=len, reverse=True)

    def first_special(text: str) -> tuple[int, str] | None:
        hits = [(text.find(s), s) for s in specials if s in text]
        return min(hits, key=lambda h: (h[0], -len(h[1]))) if hits else None

    if _SENTINEL_USER not in prompt or _SENTINEL_REPLY not in full:
        raise ChatTemplateError(where, "tokenizer.chat_template", "does not write the message contents")
    after_reply = full[full.rindex(_SENTINEL_REPLY) + len(_SENTINEL_REPLY):]
    end = first_special(after_reply)
    if end is None or after_reply[:end[0]].strip():
        raise ChatTemplateError(where, "tokenizer.chat_template", "no special token closes an assistant turn")
    header = prompt[prompt.rindex(_SENTINEL_USER) + len(_SENTINEL_USER):]
    pos = header.find(end[1])
    rest = header[pos + len(end[1]):] if pos >= 0 else header
    start = first_special(rest)
    if start is None:
        raise ChatTemplateError(where, "tokenizer.chat_template", "no special token opens the assistant turn")
    role_part = rest[start[0] + len(start[1]):]
    inner = first_special(role_part)
    if inner is not None:
        role, header_end = role_part[:inner[0]], inner[1]
    elif "\n" in role_part:
        role, header_end = role_part.split("\n", 1)[0], "\n"
    else:
        raise ChatTemplateError(where, "tokenizer.chat_template", "cannot find where the turn header ends")
    if not role.strip():
        raise ChatTemplateError(where, "tokenizer.chat_template", "the assistant turn names no role")
    return ChatFormat(start[1], end[1], header_end, role.strip())
