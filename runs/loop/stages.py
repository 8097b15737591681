"""A run's stages, resumable: each stage keyed by the sha256 of its inputs, its outputs recorded
by sha256, the record in one state file written atomically, one run per directory at a time.

DIR/<run>.json (`exactedit antislop`: antislop.json, `exactedit persona`: persona.json) holds, per finished stage, its key (the sha256 of the stage's name and inputs:
settings, the sha256 of input files, the records of the stages it reads), the sha256 of every
file it wrote (its declared outputs, and any other file that appeared in DIR while it ran), its
record (what later stages and the report read), its time, and the sha256 of all of these
(`entry_sha256`). The state is verified when it is read: an entry that does not match its sha256
(a record edited by hand), lacks a field, or names a file outside DIR is refused (StageError
naming the stage), never half-trusted. Running a stage:
- its key matches the recorded one and every recorded output is there with its sha256: the
  record is returned, nothing is redone;
- otherwise every file its old entry recorded and its declared outputs are removed (they are the
  stage's own, under DIR), then its entry is dropped from the state (written first: a crash from
  here on leaves no entry, so the next run redoes the stage), it runs, its outputs are hashed and
  its entry written.
A stage whose inputs changed is redone, and so is every stage whose key holds its record. A stage
a run skips (`skip`: no edit shipped, or its setting turned off) loses the entry and the files an
earlier run of it left, as a redo would.
The run's closing files (`finals`: report.md, report.json, the report's PNGs), written after the
last stage from every stage's records and recorded by none, are removed when a stage is redone,
before anything else changes: a run that then fails before writing them again leaves no report
describing the old state.
A directory that holds files but no state file is not a run's: it is refused, never cleared.
A run holds DIR/<run>.json.lock (flock) while it runs (`Stages(..., lock=True)`, as StagedRun
opens it): a second run of the same DIR is refused with the holder's pid, command and start time;
the kernel drops the lock of a killed run, so a stale lock file never blocks.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Sequence

from exactedit.errors import ExacteditError
from exactedit.files import OutputBusyError, atomic_write_text, file_sha256, output_lock

VERSION = 2                      # 2: every entry carries its sha256 (version 1 states are refused)
MAX_STATE_BYTES = 64 << 20       # the state file is read back before anything else: bounded
MAX_LOCK_BYTES = 4096            # what a lock file says about its holder
FIELDS = frozenset({"key", "inputs", "outputs", "record", "seconds", "sha256"})
_SHA256 = re.compile(r"[0-9a-f]{64}")

Progress = Callable[[str, int, int], None]


class StageError(ExacteditError):
    """The output directory cannot hold a resumable run (not a run's, its state unreadable or not
    verifying, or another run holds it)."""


def key_of(name: str, inputs: dict) -> str:
    """sha256 of the stage's name and inputs as canonical JSON (sorted keys; non-JSON values as str)."""
    text = json.dumps({"stage": name, "inputs": inputs}, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def entry_sha256(name: str, entry: dict) -> str:
    """sha256 of a stage's name and entry (every field but its own `sha256`) as canonical JSON."""
    body = {k: v for k, v in entry.items() if k != "sha256"}
    text = json.dumps({"stage": name, "entry": body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return [path] if path.is_file() else []


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _relative(rel, own: set[str]) -> bool:
    """`rel` names a file inside a run's directory: relative, normalized, no `..`, not the ledger's own."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        return False
    p = PurePosixPath(rel)
    return not p.is_absolute() and str(p) == rel and ".." not in p.parts and p.parts[0] not in own


def _entry_problem(name: str, entry, own: set[str]) -> str | None:
    """What is wrong with a stage's entry as read back from the state file (None: it verifies)."""
    if not isinstance(entry, dict):
        return f"expected an object, got {type(entry).__name__}"
    if set(entry) != FIELDS:
        missing, extra = sorted(FIELDS - set(entry)), sorted(set(entry) - FIELDS)
        return "; ".join(([f"no {', '.join(missing)}"] if missing else [])
                         + ([f"unknown {', '.join(map(repr, extra))}"] if extra else []))
    if not isinstance(entry["key"], str):
        return "key: expected a string"
    if not isinstance(entry["outputs"], dict):
        return "outputs: expected an object of path -> sha256"
    for rel, sha in entry["outputs"].items():
        if not _relative(rel, own):
            return f"outputs: {rel!r} is not a file inside the run's directory"
        if not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
            return f"outputs: {rel!r}: expected a sha256, got {sha!r:.80}"
    s = entry["seconds"]
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
        return f"seconds: expected a duration, got {s!r:.80}"
    try:
        if entry["sha256"] != entry_sha256(name, entry):
            return "its entry does not match its sha256 (edited by hand, or damaged)"
    except RecursionError:
        return "nested too deep"
    return None


def read_state(path: Path, own: set[str]) -> dict:
    """The state file at `path` (bounded), verified entry by entry (`_entry_problem`): its version
    and its stages; anything else raises StageError (naming the stage where one does not verify)."""
    with open(path, "rb") as fh:
        data = fh.read(MAX_STATE_BYTES + 1)
    if len(data) > MAX_STATE_BYTES:
        raise StageError(f"{path}: more than {MAX_STATE_BYTES} bytes, more than a run's state holds; "
                         "not a state file")
    try:
        state = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = "nested too deep" if isinstance(exc, RecursionError) else exc
        raise StageError(f"{path}: unreadable ({why}); move the directory aside to start again") from None
    version = state.get("version") if isinstance(state, dict) else None
    if type(version) is not int or version != VERSION or not isinstance(state.get("stages"), dict):
        old = " (written by an earlier exactedit: move the directory aside to start again)" \
            if type(version) is int and 0 < version < VERSION else ""
        raise StageError(f"{path}: version: expected a version {VERSION} run state{old}")
    for name, entry in state["stages"].items():
        problem = _entry_problem(name, entry, own)
        if problem is not None:
            raise StageError(f"{path}: stage {name!r}: {problem}: the state does not verify; move "
                             f"{path.parent} aside to start again")
    return {"version": VERSION, "stages": state["stages"]}


def _holder(lock: Path) -> str:
    """Who holds `lock`, as its holder wrote it (pid, command, start time), read bounded."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NONBLOCK)
        try:
            data = os.read(fd, MAX_LOCK_BYTES)
        finally:
            os.close(fd)
        who = json.loads(data.decode("utf-8", "replace"))
        return f"pid {int(who['pid'])}, started {str(who['started'])[:40]}, running {str(who['command'])[:300]!r}"
    except (OSError, ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return "a process that has not yet said who it is"


@contextlib.contextmanager
def hold_run(out: Path, state_file: str, command: str):
    """Hold DIR/<state_file>.lock (files.output_lock: an flock, the file removed when the block
    ends; a killed run's lock file holds no lock and is reused) with this run's pid, command and
    start time written in it; another live run holding it is refused (StageError naming it)."""
    lock = out / (state_file + ".lock")
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(output_lock(out / state_file))
        except OutputBusyError:
            raise StageError(f"{out}: another run is using this directory ({_holder(lock)}; {lock} is locked): "
                             "wait for it to end, or give another --out") from None
        lock.write_text(json.dumps({"pid": os.getpid(), "command": command,
                                    "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}) + "\n", encoding="utf-8")
        yield lock


class Stages:
    """The stages of one run in `out` (see the module doc). `progress(label, done, total)` gets
    ("stages", k, n) as each of the `total` stages starts or is resumed. With `lock`, the run holds
    the directory (`hold_run`) until `close()` (or the end of a `with` block). `finals`: the run's
    closing files (relative to `out`), removed when a stage is redone."""

    def __init__(self, out, total: int, progress: Progress | None = None, command: str = "", *, state_file: str,
                 lock: bool = False, finals: Sequence[str] = ()):
        self.out = Path(out)
        self.state_file = state_file
        self.finals = tuple(finals)
        self.own = {state_file, state_file + ".tmp", state_file + ".lock"}     # the ledger's files, no stage's
        self.total, self.progress, self.done = total, progress, 0
        self.resumed: list[str] = []
        self.ran: list[str] = []
        state = self.out / state_file
        if not state.is_file():
            if self.out.exists() and not self.out.is_dir():
                raise StageError(f"{self.out}: not a directory")
            if self.out.exists() and any(p.name not in self.own for p in self.out.iterdir()):
                raise StageError(f"{self.out}: exists, holds files and no {state_file}: not a run's directory "
                                 "(give a new --out, or the --out of an earlier run to continue it)")
            self.out.mkdir(parents=True, exist_ok=True)
        self._held = contextlib.ExitStack()
        try:
            if lock:
                self._held.enter_context(hold_run(self.out, state_file, command))
            fresh = not state.is_file()
            self.state = {"version": VERSION, "stages": {}} if fresh else read_state(state, self.own)
            self.state["command"] = command
            if fresh:
                self._save()         # a run killed before its first stage is still a run's directory
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the directory (the lock, if held); the state stays as last written."""
        self._held.close()

    def __enter__(self) -> "Stages":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _save(self, stage: str | None = None) -> None:
        """Write the state (atomically); one larger than `read_state` reads back (MAX_STATE_BYTES)
        is refused (StageError naming the stage whose entry made it so) and nothing is written."""
        text = json.dumps(self.state, indent=1, sort_keys=True, default=str) + "\n"     # ASCII: len is bytes
        if len(text) > MAX_STATE_BYTES:
            raise StageError(f"{self.out / self.state_file}: {len(text)} bytes with stage {stage!r}'s entry, over the "
                             f"{MAX_STATE_BYTES} a run's state may hold (read back, it would be refused): its record "
                             "is too large")
        atomic_write_text(self.out / self.state_file, text)

    def _hashes(self, outputs: Sequence[str]) -> dict[str, str]:
        return {str(p.relative_to(self.out)): file_sha256(p) for o in outputs for p in _files(self.out / o)}

    def _listing(self) -> set[str]:
        """Every regular file under the run's directory (relative paths) but the ledger's own."""
        return {rel for p in _files(self.out) if (rel := str(p.relative_to(self.out))).split("/")[0] not in self.own}

    def _intact(self, entry: dict, outputs: Sequence[str]) -> bool:
        recorded = entry["outputs"]
        present = {str(p.relative_to(self.out)) for o in outputs for p in _files(self.out / o)}
        present |= {rel for rel in recorded if _regular(self.out / rel)}
        if present != set(recorded):
            return False
        return all(file_sha256(self.out / rel) == sha for rel, sha in recorded.items())

    def _clear(self, entry: dict | None, outputs: Sequence[str]) -> None:
        """Remove the run's closing files (they describe the state this redo changes), a stage's
        declared outputs and every file its old entry recorded (inside DIR only)."""
        for o in (*self.finals, *outputs):
            path = self.out / o
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        root = self.out.resolve()
        for rel in (entry or {}).get("outputs", {}):
            path = self.out / rel
            parent = path.parent.resolve()
            if (parent == root or root in parent.parents) and (path.is_symlink() or path.is_file()):
                path.unlink()

    def skip(self, name: str) -> None:
        """A stage this run has no use for (its settings turn it off, or no edit shipped): counted in
        the progress, no entry. An entry an earlier run left (the stage ran then) is dropped and
        its files removed as a redo removes them, with the run's closing files and the folders
        its files leave empty: an edited.gguf, verify.json or corpus/ of an edit or setting this run
        no longer has would stand beside a report that says there is none."""
        self.done += 1
        if self.progress is not None:
            self.progress("stages", self.done, self.total)
        entry = self.state["stages"].get(name)
        if entry is None:
            return
        self._clear(entry, ())
        root = self.out.resolve()
        for rel in sorted(entry["outputs"], key=lambda r: -r.count("/")):
            for parent in PurePosixPath(rel).parents[:-1]:          # its folders under DIR, deepest first
                folder = self.out / parent
                if folder.is_symlink() or not folder.is_dir() or root not in folder.resolve().parents:
                    break
                try:
                    folder.rmdir()
                except OSError:                 # not empty: kept, and so are the folders above it
                    break
        del self.state["stages"][name]
        self._save()

    def run(self, name: str, inputs: dict, outputs: Sequence[str], fn: Callable[[], dict]) -> dict:
        """The stage's record: the recorded one when its key and outputs still hold, else fn()'s
        (fn writes `outputs`, paths relative to the run's directory, and returns a JSON-able record;
        any other file it writes in the directory is recorded as its output too). The record is
        returned as read back from JSON, a copy, the same form a resumed run gets."""
        self.done += 1
        if self.progress is not None:
            self.progress("stages", self.done, self.total)
        key = key_of(name, inputs)
        stages = self.state["stages"]
        entry = stages.get(name)
        if entry is not None and entry["key"] == key and self._intact(entry, outputs):
            self.resumed.append(name)
            return json.loads(json.dumps(entry["record"]))
        self._clear(entry, outputs)
        if stages.pop(name, None) is not None:
            self._save()
        before = self._listing()
        t0 = time.perf_counter()
        record = fn()
        json.dumps(record, default=str)           # a record that cannot be stored fails here, not at the next run
        written = self._hashes(outputs)
        written.update({rel: file_sha256(self.out / rel) for rel in sorted(self._listing() - before - set(written))})
        entry = json.loads(json.dumps({"key": key, "inputs": inputs, "outputs": written, "record": record,
                                       "seconds": round(time.perf_counter() - t0, 2)}, default=str))
        entry["sha256"] = entry_sha256(name, entry)
        stages[name] = entry
        try:
            self._save(name)
        except StageError:
            del stages[name]            # the state on disk has no entry: the next run redoes the stage
            raise
        self.ran.append(name)
        return json.loads(json.dumps(entry["record"]))

    def seconds(self) -> dict[str, float]:
        """Each finished stage's time when it ran (a resumed stage keeps its first run's)."""
        return {k: v["seconds"] for k, v in self.state["stages"].items()}

    def outputs(self, name: str) -> dict[str, str]:
        """The files a finished stage wrote, relative path -> sha256."""
        return dict(self.state["stages"].get(name, {}).get("outputs") or {})


@dataclass(frozen=True, eq=False)
class RunResult:
    """What a run left in `out`: each stage's record (the same whether it ran now or was resumed),
    the report, its files, and which stages ran now and which were resumed."""

    out: Path
    model: str
    records: dict
    report: dict
    text: str
    files: dict = field(default_factory=dict)
    ran: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()


def _utf8_path(flag: str, path) -> None:
    """Refuse (StageError naming the flag) a path that no UTF-8 text holds (a name of bytes that are
    not UTF-8, as the shell hands it over: a lone surrogate): the run writes its paths into its
    protocol and reports, and such a path was a UnicodeEncodeError at the solve stage, after the
    generation, or at the report, at the very end."""
    from exactedit.files import lone_surrogate

    at = lone_surrogate(str(path))
    if at is not None:
        raise StageError(f"{ascii(str(path))}: {flag}: the path is not UTF-8 (a byte no UTF-8 text holds, at "
                         f"character {at}): the run writes its paths into its protocol and report; give a path "
                         "of UTF-8 text")


class StagedRun:
    """What every resumable edit run resolves once and shares: the model (located by path or public
    name), its chat template, the plain texts, progress by label, and, once `start` has been
    called (after the run's own input checks), the stage ledger and the inputs' sha256, which key
    every stage too; and the two stages every edit run has: `apply_stage` and `verify_stage`."""

    def __init__(self, out, model, template, texts, progress: Progress | None):
        from exactedit.native.llamacpp.models import locate

        _utf8_path("--out", out)     # the inputs' paths are the configs' (runs/loop/settings.py utf8_paths)
        self.out = Path(out)
        self.progress = progress
        self.tick = (lambda label: (lambda d, t: progress(label, d, t))) if progress else (lambda label: None)
        self.model = locate(model, progress=self.tick("model"))
        self.template = template
        self.tpl_path = None if template is None else str(template.path)
        self.texts = tuple(texts)

    def start(self, total: int, command: str, state_file: str, finals: Sequence[str] = ()) -> None:
        """Open the ledger (refusing a directory not a run's, or one another run holds: it stays
        held until `close()`, or the end of a `with` block; `finals`: the report files, removed when
        a stage is redone) and hash the inputs."""
        self.stages = Stages(self.out, total, self.progress, command, state_file=state_file, lock=True,
                             finals=finals)
        try:
            self.sha = {"model": file_sha256(self.model, progress=self.tick("hashing the model")),
                        "template": None if self.tpl_path is None else file_sha256(self.tpl_path),
                        "texts": [file_sha256(t) for t in self.texts]}
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the run's directory to the next run."""
        if hasattr(self, "stages"):
            self.stages.close()

    def __enter__(self) -> "StagedRun":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, name: str, inputs: dict, outputs: Sequence[str], fn: Callable[[], dict]) -> dict:
        return self.stages.run(name, {"model": self.sha["model"], "template": self.sha["template"], **inputs},
                               outputs, fn)

    def apply_stage(self, bundle) -> dict:
        """`apply`: the solve's bundle written into DIR/edited.gguf (and its manifest,
        DIR/edited.gguf.manifest.json), every other byte of the model kept."""
        from exactedit.solvers.apply import apply_bundle

        def apply():
            applied = apply_bundle(bundle, self.model, self.out / "edited.gguf", progress=self.tick("apply"))
            return {"edited": str(applied.out), "sha256": applied.out_sha256}

        return self.run("apply", {"solve": self.stages.outputs("solve")},
                        ["edited.gguf", "edited.gguf.manifest.json"], apply)

    def verify_stage(self, bundle, applied: dict, dump, count: int) -> dict:
        """`verify`: llama.cpp on the base and edited files against the engine-faithful prediction,
        on the first `count` tokens of the longest document of the held-out `dump` -> DIR/verify.json."""
        from exactedit.dumps import read_dump
        from exactedit.native.verify.live import verify_live

        def verify():
            d = read_dump(dump)
            doc = max(d.docs, key=lambda x: x.stop - x.first_row)
            tokens = d.tokens[doc.first_row:min(doc.stop, doc.first_row + count)].copy()
            report = verify_live(self.model, bundle, tokens, edited=applied["edited"],
                                 progress=self.tick("verify live"))
            obj = report.to_json()
            atomic_write_text(self.out / "verify.json", json.dumps(obj, indent=1, default=str) + "\n")
            return obj

        return self.run("verify", {"edited": applied["sha256"], "data": self.stages.outputs("data"),
                                   "tokens": count}, ["verify.json"], verify)
