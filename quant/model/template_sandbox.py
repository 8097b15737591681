"""The process a chat template is compiled and rendered in (quant/model/chat_template.py starts it).

A chat template is an untrusted Jinja2 program. Jinja2's sandbox keeps it away from Python's
internals but not from the machine's time and memory: `{{ 9**(9**10) }}` is folded while the
template compiles, nested loops over `range(100000)` or a recursive macro run for ever,
`'a' * 10**9` asks for gigabytes. So the template runs here, in a child process with an address
space limit (`resource.RLIMIT_AS`), while the parent waits for each answer only as long as its
time budget allows and kills this process when it does not come.

Inside, the environment is the one chat templates are written for (Hugging Face's
`apply_chat_template`): Jinja2's `ImmutableSandboxedEnvironment` with `trim_blocks`,
`lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter keeping non-ASCII text, and the
globals `raise_exception` and `strftime_now`. `**` and `*` go through the sandbox's binop hook
(`intercepted_binops`), so they are never folded at compile time and stop cleanly when an integer
result would pass MAX_INT_BITS or a repeated string or list would pass the output budget.

This file imports only the standard library and jinja2: the parent runs its text with
`python -P -c` (no script directory or working directory on sys.path).

Protocol: one JSON object per line each way. The first request compiles:
    {"source", "bos_token", "eos_token", "memory_bytes", "output_chars"} -> {"ok": true}
then each request renders one or more conversations:
    {"batch": [messages, ...], "add_generation_prompt", "extra"} -> {"texts": ["...", ...]}
Any failure answers {"error": KIND, "message": ..., "type": ..., "line": ..., "index": ...}
(index: the conversation of a batch that failed); KIND is one of
"syntax", "compile", "raised", "security", "budget", "memory", "render".
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

MAX_INT_BITS = 1 << 16        # integers up to 65,536 bits (~19,700 digits)
MESSAGE_CHARS = 500           # an error's message, as reported back


class BudgetError(Exception):
    """An operation would pass the template's budget."""


class TemplateRaised(Exception):
    """The template called raise_exception(message)."""


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False, separators=None):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys,
                      separators=separators)


def _raise(message):
    raise TemplateRaised(str(message))


def _is_int(x) -> bool:
    return isinstance(x, int)


def _bounded_binop(operator: str, left, right, max_len: int):
    if operator == "**":
        if _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1 \
                and right * (abs(left).bit_length() - 1) > MAX_INT_BITS:
            raise BudgetError(f"{left!r:.40} ** {right!r:.40} passes the {MAX_INT_BITS}-bit integer limit")
        return left ** right
    if operator == "*":
        if _is_int(left) and _is_int(right):
            if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS + 1:
                raise BudgetError(f"a product passes the {MAX_INT_BITS}-bit integer limit")
        else:
            seq, n = (left, right) if _is_int(right) else (right, left)
            if isinstance(seq, (str, list, tuple)) and _is_int(n) and len(seq) * n > max_len:
                raise BudgetError(f"repeating a {type(seq).__name__} of {len(seq)} {n} times passes "
                                  f"the output limit ({max_len} chars)")
        return left * right
    raise BudgetError(f"operator {operator!r} is not bounded")


def make_environment(output_chars: int):
    """The sandboxed Jinja2 environment chat templates are rendered in."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BudgetEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"**", "*"})

        def call_binop(self, context, operator, left, right):
            return _bounded_binop(operator, left, right, output_chars)

    env = BudgetEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
    return env


def _failure(kind: str, exc: BaseException) -> dict:
    return {"error": kind, "type": type(exc).__name__, "message": str(exc)[:MESSAGE_CHARS],
            "line": getattr(exc, "lineno", None)}


def _compile(request: dict):
    import jinja2

    env = make_environment(int(request["output_chars"]))
    try:
        return env.from_string(request["source"]), None
    except jinja2.TemplateSyntaxError as exc:
        return None, {**_failure("syntax", exc), "message": str(exc.message)[:MESSAGE_CHARS]}
    except MemoryError as exc:
        return None, _failure("memory", exc)
    except BudgetError as exc:
        return None, _failure("budget", exc)
    except Exception as exc:  # noqa: BLE001 - RecursionError, IndentationError, OverflowError...
        return None, _failure("compile", exc)


def _render(template, tokens: dict, limit: int, request: dict) -> dict:
    from jinja2.exceptions import SecurityError

    try:
        out = template.render(messages=request["messages"], add_generation_prompt=request["add_generation_prompt"],
                              **{**request.get("extra", {}), **tokens})
    except TemplateRaised as exc:
        return _failure("raised", exc)
    except SecurityError as exc:
        return _failure("security", exc)
    except BudgetError as exc:
        return _failure("budget", exc)
    except MemoryError as exc:
        return _failure("memory", exc)
    except Exception as exc:  # noqa: BLE001 - untrusted code: any failure is the template's
        return _failure("render", exc)
    if not isinstance(out, str):
        return {"error": "render", "type": "TypeError", "message": "did not render to text", "line": None}
    if len(out) > limit:
        return {"error": "budget", "type": "BudgetError", "line": None,
                "message": f"rendered {len(out)} chars, over the output limit ({limit} chars)"}
    return {"text": out}


def _watch_parent() -> None:
    parent = os.getppid()
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(0)


def main() -> None:
    import resource

    threading.Thread(target=_watch_parent, daemon=True).start()
    inp, out = sys.stdin.buffer, sys.stdout.buffer

    def answer(obj: dict) -> None:
        try:
            data = json.dumps(obj).encode("ascii") + b"\n"     # ASCII: lone surrogates travel as escapes
        except MemoryError as exc:
            data = json.dumps(_failure("memory", exc)).encode("ascii") + b"\n"
        out.write(data)
        out.flush()

    import importlib

    importlib.import_module("jinja2.sandbox")      # loaded before the limit; the template runs inside it

    answer({"ready": True})
    line = inp.readline()
    if not line:
        return
    request = json.loads(line)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    mem = int(request["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))

    template, failure = _compile(request)
    answer(failure or {"ok": True})
    if failure:
        return
    tokens = {"bos_token": request["bos_token"], "eos_token": request["eos_token"]}
    limit = int(request["output_chars"])
    for line in inp:
        try:
            req = json.loads(line)
            texts = []
            for i, messages in enumerate(req["batch"]):
                reply = _render(template, tokens, limit, {**req, "messages": messages})
                if "error" in reply:
                    texts = {**reply, "index": i}
                    break
                texts.append(reply["text"])
            reply = texts if isinstance(texts, dict) else {"texts": texts}
        except MemoryError as exc:
            reply = _failure("memory", exc)
        answer(reply)


if __name__ == "__main__":
    main()
