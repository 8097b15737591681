"""The texts `discover` compares, read from files and tagged by source.

    model_texts(paths, *, sides=None, limits=LIMITS) -> Texts     a list of Text, and the files skipped
    human_texts(paths, *, limits=LIMITS) -> Texts
    input_files(paths) -> list[Path]          directories walked for .txt .md .jsonl .json
    strip_harness(text) -> str                Claude Code's harness tags removed (linear time)

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

Inputs are untrusted and bounded in memory and time (`Limits`): a file's bytes, a JSONL line's bytes
and a JSON record's characters, the records and the characters of one side in all (discover counts
about a million characters a second: the character bound keeps a run near a minute). Only regular
files are read (a FIFO, a device, a symlink loop is refused by name, never waited on); a .json list is
parsed one record at a time, each from a bounded window, so a list of a million empty objects never
stands in memory as objects. A malformed line or record is a DiscoverError naming the file and the
line (record); so is a lone surrogate (valid JSON "\\ud800", which no writer can encode); a file that
yields no usable text is an error naming the file and what it held (never a silent zero) when the
file was named; one found by a directory walk (a session of summaries alone, an empty note) is
skipped and listed in the result's `skipped` (`Texts`), and only a walk that finds no usable file at
all is an error.
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
from exactedit.files import check_regular, decode_utf8, lone_surrogate, open_regular, read_regular


class DiscoverError(FieldError):
    """An input of `discover` cannot be used (names the file, the field or line, and why)."""


class NoTextError(DiscoverError):
    """A file that yields no usable text: an error when named, skipped (and reported) when found by a
    directory walk."""


class Texts(list):
    """The texts read (a list of Text), and `skipped`: the files of walked directories that held no
    usable text, each {"file", "why"}."""

    def __init__(self, texts=(), skipped=()):
        super().__init__(texts)
        self.skipped = tuple(skipped)


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
    """Bounds on what is read: a file's bytes, a JSONL line's bytes (and a JSON record's characters),
    and on one side in all: its records (JSONL lines, JSON records) and its characters."""

    file_bytes: int = 256 << 20
    line_bytes: int = 16 << 20
    chars: int = 20_000_000
    records: int = 1_000_000


LIMITS = Limits()
SUFFIXES = (".txt", ".md", ".jsonl", ".json")
ASSISTANT_ROLES = frozenset({"assistant", "model", "gpt", "bot", "ai"})
USER_ROLES = frozenset({"user", "human"})
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
HARNESS_TAGS = ("system-reminder", "command-name", "command-message", "command-args", "local-command-stdout",
                "local-command-stderr", "local-command-caveat", "bash-input", "bash-stdout", "bash-stderr",
                "user-prompt-submit-hook")
_HARNESS_OPEN = re.compile(rf"<({'|'.join(HARNESS_TAGS)})>|^\[Request interrupted by user[^\]\n]*\]$", re.MULTILINE)
_WS = re.compile(r"[ \t\n\r]*")


def over_limits(size: int, records: int, chars: int, longest: int, limits: Limits | None = None) -> str | None:
    """Why discover would refuse one JSON file of reply records written for it (`dataset build`'s
    and `mine --replies`'s replies.json), named by the limit it passes: its bytes (`size`), its
    records, its texts' characters in all (`chars`: one side's limit, and every record here is
    read), its longest record's characters (`longest`); None where discover reads it (with `limits`,
    default LIMITS, the limits discover reads with)."""
    limits = limits or LIMITS
    for n, cap, what in ((size, limits.file_bytes, "bytes, over the limit of one file"),
                         (records, limits.records, "records, over the limit of one side"),
                         (chars, limits.chars, "characters of reply text, over the limit of one side"),
                         (longest, limits.line_bytes, "characters in its longest record, over the limit of one "
                                                      "record")):
        if n > cap:
            return f"{n} {what.split(',')[0]}, over discover's {cap} ({what.split('over the ')[1]})"
    return None


def model_texts(paths, *, sides: Iterable[str] | None = None, limits: Limits = LIMITS) -> Texts:
    """The model's texts in `paths` (assistant turns, replies, plain files)."""
    return _read(paths, "model", None if sides is None else frozenset(sides), limits)


def human_texts(paths, *, limits: Limits = LIMITS) -> Texts:
    """The user's own texts in `paths` (user turns, plain files, reply records)."""
    return _read(paths, "human", None, limits)


def input_files(paths) -> list[Path]:
    """Files named, and the .txt / .md / .jsonl / .json files under directories named (sorted, hidden
    entries skipped), each once. Each must be a regular file (symlinks followed): a FIFO, a device,
    a socket or a symlink loop is refused by name."""
    return list(_inputs(paths))


def _inputs(paths) -> dict[Path, bool]:
    """`input_files` as file -> whether a directory walk found it (else it was named)."""
    out: dict[Path, bool] = {}
    seen: dict[Path, Path] = {}
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
            check_regular(p, None, DiscoverError, "path")     # names what it is (a FIFO, a loop, missing)
            raise DiscoverError(p, "path", "not a file or directory")
        for f in found:
            check_regular(f, None, DiscoverError, "file")
            first = seen.setdefault(f.resolve(), f)
            out[first] = out.get(first, True) and p.is_dir()
    return out


def _walk(directory: Path) -> list[Path]:
    """The files with a known suffix under `directory`, hidden files and directories skipped."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(root, f) for f in files if not f.startswith(".") and f.lower().endswith(SUFFIXES)]
    return sorted(found)


@dataclass
class _Tally:
    """What one side has read so far, against its limits."""

    side: str
    limits: Limits
    records: int = 0
    chars: int = 0

    def record(self, path: Path, field: str) -> None:
        self.records += 1
        if self.records > self.limits.records:
            raise DiscoverError(path, field, f"the {self.side} texts pass {self.limits.records} records in all here "
                                             "(the limit); pass fewer files")

    def text(self, path: Path, n: int) -> None:
        self.chars += n
        if self.chars > self.limits.chars:
            raise DiscoverError(path, "size", f"the {self.side} texts pass {self.limits.chars} characters in all here "
                                              "(the limit); pass fewer files")


def _read(paths, side: str, sides, limits: Limits) -> Texts:
    """Every file's texts; a file found by a directory walk that yields none is skipped and listed."""
    out: list[Text] = []
    skipped = []
    tally = _Tally(side, limits)
    for path, walked in _inputs(paths).items():
        try:
            out += _read_file(path, side, sides, limits, tally)
        except NoTextError as exc:
            if not walked:
                raise
            skipped.append({"file": str(path), "why": exc.message})
    if not out and skipped:
        raise DiscoverError(skipped[0]["file"], "turns", f"no file holds usable {side} text ({len(skipped)} skipped; "
                                                         f"the first: {skipped[0]['why']})")
    return Texts(out, skipped)


def _read_file(path: Path, side: str, sides, limits: Limits, tally: _Tally) -> list[Text]:
    size = check_regular(path, None, DiscoverError, "file")
    if size > limits.file_bytes:
        raise DiscoverError(path, "size", f"{size} bytes, over the limit of {limits.file_bytes}")
    suffix = path.suffix.lower()
    if suffix in (".txt", ".md"):
        text = _decode(path, read_regular(path, limits.file_bytes, DiscoverError, "file"), "text")
        if not text.strip():
            raise NoTextError(path, "text", "empty: no text to count")
        tally.text(path, len(text))                  # (decoded UTF-8 holds no lone surrogate)
        return [Text(text, path.name, str(path))]
    records = _jsonl(path, limits) if suffix == ".jsonl" else _json(path, limits)
    kinds: Counter = Counter()
    out = []
    last_user = None
    for where, field, rec in records:
        tally.record(path, field)
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
            for what, value in (("text", text), ("source", source), ("prompt", prompt)):
                _unicode(path, field, what, value)
            tally.text(path, len(text))
            out.append(Text(text, source, f"{path}{where}", prompt))
    if not out:
        held = ", ".join(f"{n} {k}" for k, n in kinds.most_common(6)) or "no records"
        want = "assistant turns or reply texts" if side == "model" else "user turns or reply texts"
        raise NoTextError(path, "turns", f"0 usable {side} texts ({want}); read {held}")
    return out


def _unicode(path: Path, field: str, what: str, value: str | None) -> None:
    """Refuse a lone surrogate (JSON's "\\ud800"): no UTF-8 writer of the report could encode it."""
    at = None if value is None else lone_surrogate(value)
    if at is not None:
        raise DiscoverError(path, field, f"the {what} holds a lone surrogate ({value[at]!r} at character {at}): "
                                         "not valid Unicode text")


def _wanted(speaker: str, side: str) -> bool:
    return speaker == "author" or speaker == ("assistant" if side == "model" else "user")


def _decode(path: Path, data: bytes, field: str) -> str:
    return decode_utf8(data, path, DiscoverError, field)


def _loads(path: Path, text: str, field: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DiscoverError(path, field, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise DiscoverError(path, field, "JSON nested too deeply") from None


def _jsonl(path: Path, limits: Limits) -> Iterator[tuple[str, str, dict]]:
    with open_regular(path, limits.file_bytes, DiscoverError, "file") as fh:
        no = read = 0
        while line := fh.readline(limits.line_bytes + 1):
            no += 1
            read += len(line)
            if read > limits.file_bytes:
                raise DiscoverError(path, "size", f"more than {limits.file_bytes} bytes (it grew while read)")
            if len(line) > limits.line_bytes:
                raise DiscoverError(path, f"line {no}", f"longer than {limits.line_bytes} bytes (the limit)")
            text = _decode(path, line, f"line {no}").strip()
            if not text:
                continue
            rec = _loads(path, text, f"line {no}")
            if not isinstance(rec, dict):
                raise DiscoverError(path, f"line {no}", f"expected a JSON object, got {type(rec).__name__}")
            yield f":{no}", f"line {no}", rec


class _Values:
    """JSON values decoded from `text` one at a time, each from a window of at most 2 * `limit`
    characters (copied once per `limit` characters read), so that a value longer than `limit` is
    refused before it is built whole."""

    def __init__(self, path: Path, text: str, limit: int):
        self.path, self.text, self.limit = path, text, limit
        self.start, self.window = 0, None
        self.decoder = json.JSONDecoder()

    def at(self, i: int, what: str):
        """(the value starting at text[i], the index after it); `what` names it in errors."""
        n = len(self.text)
        if self.window is None or i < self.start or (self.start + len(self.window) < n
                                                    and i + self.limit > self.start + len(self.window)):
            self.start, self.window = i, self.text[i:i + 2 * self.limit]
        whole = self.start + len(self.window) == n
        try:
            value, end = self.decoder.raw_decode(self.window, i - self.start)
        except json.JSONDecodeError as exc:
            why = (f"not valid JSON: {exc.msg} ({what}, at character {self.start + exc.pos})" if whole else
                   f"not valid JSON within {self.limit} characters of {what} (the limit of one record): {exc.msg}")
            raise DiscoverError(self.path, "json", why) from None
        except RecursionError:
            raise DiscoverError(self.path, "json", f"JSON nested too deeply ({what})") from None
        if end - (i - self.start) > self.limit:
            raise DiscoverError(self.path, what, f"longer than {self.limit} characters (the limit of one record)")
        return value, self.start + end


def _json(path: Path, limits: Limits) -> Iterator[tuple[str, str, dict]]:
    """The records of a .json file: one record, or a list of them read one record at a time."""
    text = _decode(path, read_regular(path, limits.file_bytes, DiscoverError, "file"), "text")
    values = _Values(path, text, limits.line_bytes)
    at = _WS.match(text).end()
    if not text.startswith(("[", "{"), at):
        value, _ = values.at(at, "the file")
        raise DiscoverError(path, "json", f"expected a list of records or one record, got {type(value).__name__}")
    if text.startswith("{", at):
        rec, at = values.at(at, "the record")
        _json_end(path, text, at)
        yield "", "json", rec
        return
    at, k = _WS.match(text, at + 1).end(), 0
    while not text.startswith("]", at):
        rec, at = values.at(at, f"record [{k}]")
        if not isinstance(rec, dict):
            raise DiscoverError(path, f"[{k}]", f"expected a JSON object, got {type(rec).__name__}")
        yield f"[{k}]", f"[{k}]", rec
        at = _WS.match(text, at).end()
        if text.startswith(",", at):
            at = _WS.match(text, at + 1).end()
            if text.startswith("]", at):
                raise DiscoverError(path, "json", f"not valid JSON: a comma before ']' (at character {at})")
        elif not text.startswith("]", at):
            raise DiscoverError(path, "json", f"not valid JSON: expected ',' or ']' after record [{k}] "
                                              f"(at character {at})")
        k += 1
    _json_end(path, text, at + 1)


def _json_end(path: Path, text: str, at: int) -> None:
    if _WS.match(text, at).end() != len(text):
        raise DiscoverError(path, "json", f"not valid JSON: extra data after the value (at character {at})")


def _str(x) -> str | None:
    return x if isinstance(x, str) and x else None


def content_text(content) -> str:
    """A message's text: a string, or the text parts of a list of parts (others skipped)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = [p if isinstance(p, str) else p.get("text") for p in content
             if isinstance(p, str) or (isinstance(p, dict) and isinstance(p.get("type"), str)
                                       and p["type"] in TEXT_PARTS)]
    return "\n\n".join(p for p in parts if isinstance(p, str))


def strip_harness(text: str) -> str:
    """`text` without the Claude Code harness's blocks (<system-reminder>...</system-reminder> and the
    other HARNESS_TAGS, each to the nearest close of the same tag) and "[Request interrupted by
    user...]" lines. Linear time: an opening is matched to its close by one forward search, and a tag
    found unclosed is never searched for again (a regex `<(tag)>.*?</\\1>` rescans to the end at every
    opening: quadratic on a line of openings)."""
    out, at, pos, unclosed = [], 0, 0, set()
    while m := _HARNESS_OPEN.search(text, pos):
        tag = m.group(1)
        end = m.end()
        if tag is not None:
            close = -1 if tag in unclosed else text.find(f"</{tag}>", end)
            if close < 0:
                unclosed.add(tag)
                pos = end
                continue
            end = close + len(tag) + 3
        out.append(text[at:m.start()])
        at = pos = end
    out.append(text[at:])
    return "".join(out)


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
            text = strip_harness(text)
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
        return f"{rec['role']!r:.20} messages", [(sp, content_text(rec["content"]), tag, None)] if sp else []
    if isinstance(rec.get("text"), str):
        return "reply records", [("author", rec["text"], tag, _str(rec.get("side")))]
    return (f"{typ!r} lines" if isinstance(typ, str) else "records of no known shape"), []
