"""A model's own chat template (`tokenizer.chat_template` in its GGUF), rendered in a sandbox.

The template is a Jinja2 program written by whoever made the file: untrusted code. It is only
ever compiled and rendered in Jinja2's `ImmutableSandboxedEnvironment` (no attribute or global
outside the sandbox's safe set, no mutation of the messages), inside a child process
(quant/model/template_sandbox.py) under a `TemplateBudget`: wall-clock seconds per compile and per
render (past them the process is killed), an address-space limit, and caps on the source and the
rendered text; `**` and `*` are bounded and never folded at compile time. Whatever the template
does wrong (reaching outside the sandbox, a syntax error or a nesting too deep to compile,
`raise_exception`, an undefined name used as an object, a hang, a blow-up) comes back as one
`ChatTemplateError` naming the model and what happened.

The environment follows the conventions chat templates are written for (as Hugging Face's
`apply_chat_template` renders them): `trim_blocks` and `lstrip_blocks`, the `loopcontrols`
extension, a `tojson` filter that keeps non-ASCII text, and the globals `raise_exception` and
`strftime_now`; `bos_token` and `eos_token` are the model's own token strings. Starting the
process costs ~70 ms per template; a render costs a pipe round trip (~50 us over an in-process
render), and `render_many` renders a batch per round trip at in-process speed.

`probe_format` renders two tiny conversations with sentinel contents and reads off how the
template frames a turn (the special token that opens one, the header that names the role, the
token that closes it), so row roles can be derived from the model's template rather than
assumed (dumps/roles.py).
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from exactedit.errors import FieldError

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


@dataclass(frozen=True)
class TemplateBudget:
    """What one template may use: `seconds` of wall clock per compile and per render (past it the
    sandbox process is killed), the sandbox process's address space (`memory_bytes`), the length
    of its source and of one rendered text. Real templates are a few kB, render in well under a
    millisecond and use a few MB."""

    seconds: float = 10.0
    memory_bytes: int = 1 << 29
    source_chars: int = 1 << 18
    output_chars: int = 1 << 24

    def __post_init__(self):
        for name in ("seconds", "memory_bytes", "source_chars", "output_chars"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ChatTemplateError("TemplateBudget", name, f"expected a positive number, got {v!r}")


_FIELD = "tokenizer.chat_template"
_STARTUP_SECONDS = 60.0        # our own process starting (not the template's time)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            f.close()


class _Sandbox:
    """One child process (quant/model/template_sandbox.py) holding one compiled template."""

    def __init__(self, owner: "ChatTemplate"):
        self.owner = owner
        code = Path(__file__).with_name("template_sandbox.py").read_text(encoding="utf-8")
        try:
            self.proc = subprocess.Popen([sys.executable, "-P", "-c", code], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        except OSError as exc:
            raise ChatTemplateError(owner.where, owner.field, f"cannot start its sandbox process ({exc})") from None
        self.close = weakref.finalize(self, _kill, self.proc)
        b = owner.budget
        try:
            self.exchange(None, _STARTUP_SECONDS, "starting")
            self.exchange({"source": owner.source, "bos_token": owner.bos_token, "eos_token": owner.eos_token,
                           "memory_bytes": b.memory_bytes, "output_chars": b.output_chars}, b.seconds, "compiling")
        except ChatTemplateError:
            self.close()
            raise

    def exchange(self, request: dict | None, seconds: float, doing: str, first: int | None = None) -> dict:
        """Send one request line (none: read the greeting) and wait up to `seconds` for the answer;
        `first`: the index of a batch's first conversation, named in its errors."""
        owner, proc = self.owner, self.proc
        try:
            if request is not None:
                data = memoryview(json.dumps(request).encode("ascii") + b"\n")
                while data:
                    data = data[proc.stdin.write(data):]
            fd, buf, deadline = proc.stdout.fileno(), bytearray(), time.monotonic() + seconds
            while not buf.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    self.close()
                    raise ChatTemplateError(owner.where, owner.field, f"over its time budget ({seconds:g} s) while "
                                            f"{doing}: stopped")
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise OSError("end of output")
                buf += chunk
        except OSError:
            self.close()
            raise ChatTemplateError(owner.where, owner.field, f"its sandbox process ended while {doing} (exit status "
                                    f"{proc.returncode}): jinja2 not importable, or killed") from None
        reply = json.loads(buf)
        if "error" in reply:
            index = first + reply["index"] if first is not None and reply.get("index") is not None else None
            raise owner._error(reply, doing, index)
        return reply


class ChatTemplate:
    """A compiled template; `render(messages)` gives the prompt text (special tokens as text).
    Its errors name `where` (the model, or the template's file) and `field` (the GGUF key, or
    "chat_template" for a template given as a file).

    The template is compiled and rendered in its own child process (quant/model/template_sandbox.py),
    under `budget` (TemplateBudget): a template past its time is stopped, one past its memory or
    output limit fails, and each of these is a ChatTemplateError naming `where`. The process lives
    as long as this object (or until `close()`); one render costs a pipe round trip, and
    `render_many` renders BATCH conversations per round trip."""

    BATCH = 256

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", where: str = "chat_template",
                 budget: TemplateBudget = TemplateBudget(), field: str = _FIELD):
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError(where, field, "empty or not a string")
        if len(source) > budget.source_chars:
            raise ChatTemplateError(where, field, f"{len(source)} chars, over the source limit "
                                    f"({budget.source_chars} chars)")
        self.source, self.where, self.budget, self.field = source, where, budget, field
        self.bos_token, self.eos_token = bos_token, eos_token
        self._lock = threading.Lock()
        self._sandbox: _Sandbox | None = _Sandbox(self)

    def close(self) -> None:
        """End the sandbox process (a later render starts a new one)."""
        with self._lock:
            if self._sandbox is not None:
                self._sandbox.close()
                self._sandbox = None

    def __enter__(self) -> "ChatTemplate":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _error(self, reply: dict, doing: str, conversation: int | None) -> ChatTemplateError:
        kind, msg, typ = reply.get("error"), reply.get("message", ""), reply.get("type", "")
        text = {"syntax": f"not a valid Jinja2 template (line {reply.get('line')}: {msg})",
                "compile": f"cannot be compiled ({typ}: {msg})",
                "raised": f"the template raised: {msg}",
                "security": f"refused by the sandbox: the template reached outside it ({msg})",
                "budget": f"over its budget while {doing}: {msg}",
                "memory": f"over its memory budget ({self.budget.memory_bytes / 2**20:g} MiB) while {doing}",
                }.get(kind, f"failed while rendering ({typ}: {msg})")
        return ChatTemplateError(self.where, self.field, text if conversation is None else f"{text} (conversation "
                                 f"{conversation} of the batch)")

    def render(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = False,
               **extra) -> str:
        return self.render_many([messages], add_generation_prompt=add_generation_prompt, **extra)[0]

    def render_many(self, conversations: Sequence[Sequence[Mapping[str, str]]], *,
                    add_generation_prompt: bool = False, **extra) -> list[str]:
        """`render` of each conversation, BATCH at a time per round trip (each batch under the
        time budget); a failure names the conversation's index."""
        convs = [check_messages(m, self.where) for m in conversations]
        try:
            json.dumps(extra, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ChatTemplateError(self.where, "render", f"extra variables must be JSON values ({exc})") from None
        out: list[str] = []
        for a in range(0, len(convs), self.BATCH):
            request = {"batch": convs[a:a + self.BATCH], "add_generation_prompt": bool(add_generation_prompt),
                       "extra": extra}
            out += self._exchange(request, None if len(convs) == 1 else a)["texts"]
        return out

    def _exchange(self, request: dict, first: int | None) -> dict:
        with self._lock:
            try:
                if self._sandbox is None:
                    self._sandbox = _Sandbox(self)
                return self._sandbox.exchange(request, self.budget.seconds, "rendering", first)
            except ChatTemplateError:
                if self._sandbox is not None and not self._sandbox.close.alive:
                    self._sandbox = None
                raise


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


def _bos_eos(g) -> dict:
    """bos_token / eos_token: the open GGUF's own token strings ("" where it names none)."""
    tokens = g.tokens()

    def tok(key):
        i = g.get(key)
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else ""

    return {"bos_token": tok("tokenizer.ggml.bos_token_id"), "eos_token": tok("tokenizer.ggml.eos_token_id")}


def from_gguf(g) -> ChatTemplate:
    """The chat template of an open GGUF (quant.gguf.GGUFFile), with its bos / eos token strings."""
    source = g.get("tokenizer.chat_template")
    if source is None:
        raise ChatTemplateError(g.path, "tokenizer.chat_template",
                                "this GGUF carries no chat template, so chat text cannot be rendered "
                                "the model's way")
    return ChatTemplate(source, where=str(g.path), **_bos_eos(g))


GIVEN_FIELD = "chat_template"      # the field a given template's errors name (the file is the place)


@dataclass(frozen=True)
class GivenTemplate:
    """A chat template given by the user as a Jinja2 file (`--chat-template FILE`): its source and
    where it came from. It stands in for the model's own (`tokenizer.chat_template`), which it
    overrides when the GGUF has one; it is compiled and rendered in the same sandbox."""

    source: str = field(repr=False)
    path: str = ""

    @property
    def sha256(self) -> str:
        import hashlib

        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    def compile(self, g, budget: TemplateBudget = TemplateBudget()) -> ChatTemplate:
        """The template for the open GGUF `g` (its bos / eos token strings), errors naming the file."""
        return ChatTemplate(self.source, where=self.path, budget=budget, field=GIVEN_FIELD, **_bos_eos(g))


def read_template(path, budget: TemplateBudget = TemplateBudget()) -> GivenTemplate:
    """A chat template file, read bounded: at most `budget.source_chars` characters of UTF-8 text
    (no more than 4 bytes a character is read), not empty. Errors name the file and `chat_template`."""
    from exactedit.files import open_regular

    path = Path(path)
    limit = budget.source_chars
    with open_regular(path, None, ChatTemplateError, GIVEN_FIELD) as fh:      # a FIFO or device refused, not read
        try:
            data = fh.read(4 * limit + 1)
        except OSError as exc:
            raise ChatTemplateError(path, GIVEN_FIELD,
                                    f"cannot read the template file ({exc.strerror or exc})") from None
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(data) > 4 * limit:
            raise ChatTemplateError(path, GIVEN_FIELD, f"over the source limit ({limit} chars)") from None
        raise ChatTemplateError(path, GIVEN_FIELD, f"not UTF-8 text (byte {exc.start})") from None
    if len(data) > 4 * limit or len(source) > limit:
        raise ChatTemplateError(path, GIVEN_FIELD, f"over the source limit ({limit} chars)")
    if not source.strip():
        raise ChatTemplateError(path, GIVEN_FIELD, "empty")
    return GivenTemplate(source, str(path))


def template_of(g, given: GivenTemplate | None = None) -> ChatTemplate:
    """The template chat text is rendered with: `given` when there is one (it wins over the GGUF's
    own), else the GGUF's (`from_gguf`)."""
    return given.compile(g) if given is not None else from_gguf(g)


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
        raise ChatTemplateError(where, template.field, "does not write the message contents")
    after_reply = full[full.rindex(_SENTINEL_REPLY) + len(_SENTINEL_REPLY):]
    end = first_special(after_reply)
    if end is None or after_reply[:end[0]].strip():
        raise ChatTemplateError(where, template.field, "no special token closes an assistant turn")
    header = prompt[prompt.rindex(_SENTINEL_USER) + len(_SENTINEL_USER):]
    pos = header.find(end[1])
    rest = header[pos + len(end[1]):] if pos >= 0 else header
    start = first_special(rest)
    if start is None:
        raise ChatTemplateError(where, template.field, "no special token opens the assistant turn")
    role_part = rest[start[0] + len(start[1]):]
    inner = first_special(role_part)
    if inner is not None:
        role, header_end = role_part[:inner[0]], inner[1]
    elif "\n" in role_part:
        role, header_end = role_part.split("\n", 1)[0], "\n"
    else:
        raise ChatTemplateError(where, template.field, "cannot find where the turn header ends")
    if not role.strip():
        raise ChatTemplateError(where, template.field, "the assistant turn names no role")
    return ChatFormat(start[1], end[1], header_end, role.strip())
