"""The texts `discover` compares, read from files and tagged by source.

    model_texts(paths, *, sides=None, limits=LIMITS) -> list[Text]
    human_texts(paths, *, limits=LIMITS) -> list[Text]
    input_files(paths) -> list[Path]          directories walked for .txt .md .jsonl .json

A path is a file or a directory (walked recursively, sorted, hidden entries skipped). Files:
- .txt / .md: one text, the file's author's (model text given as --model-text, the user's given as
  --human);
- .jsonl: one record per line; .json: a list of records, or one record. A record is
  - a reply `{"text", "side"?, "name"?, "prompt"?, "model"?}` (exactedit's replies.json): its
    author's text; `sides` keeps only records of those sides (records without a side always pass);
  - a conversation `{"messages": [{"role", "content"}, ...]}` (OpenAI style), or one message
    `{"role", "content"}` per line; content a string or a list of parts, of which the text parts
    (`{"type": "text" | "input_text" | "output_text", "text"}`) count;
  - a ShareGPT conversation `{"conversations": [{"from", "value"}, ...]}`;
  - a Claude Code session line `{"type": "assistant" | "user", "message": {"content", "model"?}}`: text
    parts count, tool_use / tool_result / thinking parts do not; lines of other types ("summary",
    "system", ...), meta lines (`isMeta`) and synthetic replies (model "<synthetic>") are skipped;
    the harness's tags in user text (<system-reminder>, <command-name>, <local-command-stdout>, ...)
    are removed.
  Model text is the assistant's turns (roles assistant, model, gpt, bot, ai) and reply records; human
  text is the user's turns (roles user, human) and reply records given on the human side.

Each model text is tagged by its record's `model` (a Claude Code message's, a record's) or
`provider` field where present, else by the file's name, and ":SIDE" is added for a reply with a
side. Human texts are tagged by file name.

Inputs are untrusted and bounded (`Limits`): a file's size, a JSONL line's length, the characters of
one side in all. A malformed line is a DiscoverError naming the file and the line; a file that yields
no usable text is an error naming the file and what it held (never a silent zero).
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from exactedit.errors import FieldError


class DiscoverError(FieldError):
    """An input of `discover` cannot be used (names the file, the field or line, and why)."""


@dataclass(frozen=True)
class Text:
    """One text to count: a reply, a turn, or a whole plain file."""

    text: str
    source: str      # its tag: model / provider, else the file name (":side" for a reply's side)
    where: str       # file, with its line (JSONL) or index (JSON list)
    prompt: str | None = None   # the user turn it answered, where the file says (a reply's "prompt", the
                                # user turn before it in a transcript): `discover --model` frames it in chat


@dataclass(frozen=True)
class Limits:
    """Bounds on what is read: a file's bytes, a JSONL line's bytes, one side's characters in all."""

    file_bytes: int = 256 << 20
    line_bytes: int = 16 << 20
    chars: int = 200_000_000


LIMITS = Limits()
SUFFIXES = (".txt", ".md", ".jsonl", ".json")
ASSISTANT_ROLES = frozenset({"assistant", "model", "gpt", "bot", "ai"})
USER_ROLES = frozenset({"user", "human"})
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_HARNESS = re.compile(r"<(system-reminder|command-name|command-message|command-args|local-command-stdout|"
                      r"local-command-stderr|local-command-caveat|bash-input|bash-stdout|bash-stderr|"
                      r"user-prompt-submit-hook)>.*?</\1>|^\[Request interrupted by user[^\]\n]*\]$",
                      re.DOTALL | re.MULTILINE)


def model_texts(paths, *, sides: Iterable[str] | None = None, limits: Limits = LIMITS) -> list[Text]:
    """The model's texts in `paths` (assistant turns, replies, plain files)."""
    return _read(paths, "model", None if sides is None else frozenset(sides), limits)


def human_texts(paths, *, limits: Limits = LIMITS) -> list[Text]:
    """The user's own texts in `paths` (user turns, plain files, reply records)."""
    return _read(paths, "human", None, limits)


def input_files(paths) -> list[Path]:
    """Files named, and the .txt / .md / .jsonl / .json files under directories named (sorted, hidden
    entries skipped), each once."""
    out: dict[Path, Path] = {}
    for p in map(Path, [paths] if isinstance(paths, (str, os.PathLike)) else paths):
        if p.is_dir():
            found = _walk(p)
            if not found:
                raise DiscoverError(p, "directory", f"holds no {', '.join(SUFFIXES)} files")
        elif p.is_file():
            if not p.name.lower().endswith(SUFFIXES):
                raise DiscoverError(p, "file", f"unsupported file type (expected {', '.join(SUFFIXES)})")
            found = [p]
        else:
            raise DiscoverError(p, "path", "not a file or directory")
        for f in found:
            out.setdefault(f.resolve(), f)
    return list(out.values())


def _walk(directory: Path) -> list[Path]:
    """The files with a known suffix under `directory`, hidden files and directories skipped."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(root, f) for f in files if not f.startswith(".") and f.lower().endswith(SUFFIXES)]
    return sorted(found)


def _read(paths, side: str, sides, limits: Limits) -> list[Text]:
    out: list[Text] = []
    chars = 0
    for path in input_files(paths):
        texts = _read_file(path, side, sides, limits)
        chars += sum(len(t.text) for t in texts)
        if chars > limits.chars:
            raise DiscoverError(path, "size", f"the {side} texts pass {limits.chars} characters in all here "
                                              "(the limit); pass fewer files")
        out += texts
    return out


def _read_file(path: Path, side: str, sides, limits: Limits) -> list[Text]:
    size = path.stat().st_size
    if size > limits.file_bytes:
        raise DiscoverError(path, "size", f"{size} bytes, over the limit of {limits.file_bytes}")
    suffix = path.suffix.lower()
    if suffix in (".txt", ".md"):
        text = _decode(path, path.read_bytes(), "text")
        if not text.strip():
            raise DiscoverError(path, "text", "empty: no text to count")
        return [Text(text, path.name, str(path))]
    records = _jsonl(path, limits) if suffix == ".jsonl" else _json(path)
    kinds: Counter = Counter()
    out = []
    last_user = None
    for where, rec in records:
        kind, turns = _turns(rec)
        kinds[kind] += 1
        for speaker, text, tag, rec_side in turns:
            if speaker == "user" and text.strip():
                last_user = text
            if not _wanted(speaker, side) or not text.strip():
                continue
            if sides is not None and rec_side is not None and rec_side not in sides:
                kinds[f"side {rec_side!r} (not asked)"] += 1
                continue
            source = path.name if side == "human" else (tag or path.name) + (f":{rec_side}" if rec_side else "")
            prompt = _str(rec.get("prompt")) if speaker == "author" else last_user if speaker == "assistant" else None
            out.append(Text(text, source, f"{path}{where}", prompt))
    if not out:
        held = ", ".join(f"{n} {k}" for k, n in kinds.most_common(6)) or "no records"
        want = "assistant turns or reply texts" if side == "model" else "user turns or reply texts"
        raise DiscoverError(path, "turns", f"0 usable {side} texts ({want}); read {held}")
    return out


def _wanted(speaker: str, side: str) -> bool:
    return speaker == "author" or speaker == ("assistant" if side == "model" else "user")


def _decode(path: Path, data: bytes, field: str) -> str:
    try:
        return data.decode("utf-8-sig")            # a leading byte-order mark is no text
    except UnicodeDecodeError as exc:
        raise DiscoverError(path, field, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _loads(path: Path, text: str, field: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DiscoverError(path, field, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise DiscoverError(path, field, "JSON nested too deeply") from None


def _jsonl(path: Path, limits: Limits) -> Iterator[tuple[str, dict]]:
    with open(path, "rb") as fh:
        no = 0
        while line := fh.readline(limits.line_bytes + 1):
            no += 1
            if len(line) > limits.line_bytes:
                raise DiscoverError(path, f"line {no}", f"longer than {limits.line_bytes} bytes (the limit)")
            text = _decode(path, line, f"line {no}").strip()
            if not text:
                continue
            rec = _loads(path, text, f"line {no}")
            if not isinstance(rec, dict):
                raise DiscoverError(path, f"line {no}", f"expected a JSON object, got {type(rec).__name__}")
            yield f":{no}", rec


def _json(path: Path) -> list[tuple[str, dict]]:
    data = _loads(path, _decode(path, path.read_bytes(), "text"), "json")
    if isinstance(data, dict):
        return [("", data)]
    if not isinstance(data, list):
        raise DiscoverError(path, "json", f"expected a list of records or one record, got {type(data).__name__}")
    for i, rec in enumerate(data):
        if not isinstance(rec, dict):
            raise DiscoverError(path, f"[{i}]", f"expected a JSON object, got {type(rec).__name__}")
    return [(f"[{i}]", rec) for i, rec in enumerate(data)]


def _str(x) -> str | None:
    return x if isinstance(x, str) and x else None


def content_text(content) -> str:
    """A message's text: a string, or the text parts of a list of parts (others skipped)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = [p if isinstance(p, str) else p.get("text") for p in content
             if isinstance(p, str) or (isinstance(p, dict) and p.get("type") in TEXT_PARTS)]
    return "\n\n".join(p for p in parts if isinstance(p, str))


def _speaker(role) -> str | None:
    role = role.lower() if isinstance(role, str) else None
    return "assistant" if role in ASSISTANT_ROLES else "user" if role in USER_ROLES else None


def _turns(rec: dict) -> tuple[str, list[tuple[str, str, str | None, str | None]]]:
    """(kind of record, [(speaker, text, model tag, side)]) for one record; speaker is "assistant",
    "user" or "author" (a reply record's or plain text's: whichever side it is given on)."""
    tag = _str(rec.get("model")) or _str(rec.get("provider"))
    typ = rec.get("type")
    if isinstance(typ, str) and isinstance(rec.get("message"), dict):             # Claude Code
        msg = rec["message"]
        model = _str(msg.get("model"))
        if typ not in ("assistant", "user"):
            return f"{typ!r} lines", []
        if rec.get("isMeta") or model == "<synthetic>":
            return "meta or synthetic lines", []
        text = content_text(msg.get("content"))
        if typ == "user":
            text = _HARNESS.sub("", text)
        return f"{typ} lines", [(typ, text, model or tag, None)]
    if isinstance(rec.get("messages"), list):
        turns = [(sp, content_text(m.get("content")), _str(m.get("model")) or tag, None)
                 for m in rec["messages"] if isinstance(m, dict) and (sp := _speaker(m.get("role")))]
        return "conversations", turns
    if isinstance(rec.get("conversations"), list):
        turns = [(sp, m["value"], tag, None) for m in rec["conversations"]
                 if isinstance(m, dict) and (sp := _speaker(m.get("from"))) and isinstance(m.get("value"), str)]
        return "conversations", turns
    if "role" in rec and "content" in rec:
        sp = _speaker(rec["role"])
        return f"{rec['role']!s:.20} messages", [(sp, content_text(rec["content"]), tag, None)] if sp else []
    if isinstance(rec.get("text"), str):
        return "reply records", [("author", rec["text"], tag, _str(rec.get("side")))]
    return (f"{typ!r} lines" if isinstance(typ, str) else "records of no known shape"), []
