"""A run's stages, resumable: each stage keyed by the sha256 of its inputs, its outputs recorded
by sha256, the record in one state file written atomically.

DIR/<run>.json (`exactedit antislop`: antislop.json, `exactedit persona`: persona.json) holds, per finished stage, its key (the sha256 of the stage's name and inputs:
settings, the sha256 of input files, the records of the stages it reads), the sha256 of every
file it wrote, its record (what later stages and the report read) and its time. Running a stage:
- its key matches the recorded one and every recorded output is there with its sha256: the
  record is returned, nothing is redone;
- otherwise its entry is dropped from the state (written first: a crash from here on leaves no
  entry, so the next run redoes the stage), its old outputs are removed (they are the stage's
  own, under DIR), it runs, its outputs are hashed and its entry written.
A stage whose inputs changed is redone, and so is every stage whose key holds its record.
A directory that holds files but no state file is not a run's: it is refused, never cleared.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from exactedit.errors import ExacteditError
from exactedit.files import atomic_write_text, file_sha256

VERSION = 1
MAX_STATE_BYTES = 64 << 20       # the state file is read back before anything else: bounded

Progress = Callable[[str, int, int], None]


class StageError(ExacteditError):
    """The output directory cannot hold a resumable run (not a run's, or its state unreadable)."""


def key_of(name: str, inputs: dict) -> str:
    """sha256 of the stage's name and inputs as canonical JSON (sorted keys; non-JSON values as str)."""
    text = json.dumps({"stage": name, "inputs": inputs}, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return [path] if path.is_file() else []


class Stages:
    """The stages of one run in `out` (see the module doc). `progress(label, done, total)` gets
    ("stages", k, n) as each of the `total` stages starts or is resumed."""

    def __init__(self, out, total: int, progress: Progress | None = None, command: str = "", *, state_file: str):
        self.out = Path(out)
        self.state_file = state_file
        self.total, self.progress, self.done = total, progress, 0
        self.resumed: list[str] = []
        self.ran: list[str] = []
        state = self.out / state_file
        if state.is_file():
            if state.stat().st_size > MAX_STATE_BYTES:
                raise StageError(f"{state}: {state.stat().st_size} bytes, more than a run's state holds "
                                 f"({MAX_STATE_BYTES}); not a state file")
            try:
                self.state = json.loads(state.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise StageError(f"{state}: unreadable ({exc}); move the directory aside to start again") from None
            if not isinstance(self.state, dict) or self.state.get("version") != VERSION \
                    or not isinstance(self.state.get("stages"), dict):
                raise StageError(f"{state}: version: expected a version {VERSION} run state")
        elif self.out.exists() and any(self.out.iterdir()):
            raise StageError(f"{self.out}: exists, holds files and no {state_file}: not a run's directory "
                             "(give a new --out, or the --out of an earlier run to continue it)")
        else:
            self.out.mkdir(parents=True, exist_ok=True)
            self.state = {"version": VERSION, "stages": {}}
        self.state["command"] = command

    def _save(self) -> None:
        atomic_write_text(self.out / self.state_file, json.dumps(self.state, indent=1, sort_keys=True, default=str) + "\n")

    def _hashes(self, outputs: Sequence[str]) -> dict[str, str]:
        return {str(p.relative_to(self.out)): file_sha256(p) for o in outputs for p in _files(self.out / o)}

    def _intact(self, entry: dict, outputs: Sequence[str]) -> bool:
        recorded = entry.get("outputs") or {}
        present = {str(p.relative_to(self.out)) for o in outputs for p in _files(self.out / o)}
        if present != set(recorded):
            return False
        return all(file_sha256(self.out / rel) == sha for rel, sha in recorded.items())

    def skip(self, name: str) -> None:
        """A stage this run has no use for (its settings turn it off): counted in the progress, no entry."""
        self.done += 1
        if self.progress is not None:
            self.progress("stages", self.done, self.total)

    def run(self, name: str, inputs: dict, outputs: Sequence[str], fn: Callable[[], dict]) -> dict:
        """The stage's record: the recorded one when its key and outputs still hold, else fn()'s
        (fn writes `outputs`, paths relative to the run's directory, and returns a JSON-able record;
        it is returned as read back from JSON, the same form a resumed run gets)."""
        self.done += 1
        if self.progress is not None:
            self.progress("stages", self.done, self.total)
        key = key_of(name, inputs)
        stages = self.state["stages"]
        entry = stages.get(name)
        if entry is not None and entry.get("key") == key and self._intact(entry, outputs):
            self.resumed.append(name)
            return entry["record"]
        stages.pop(name, None)
        self._save()
        for o in outputs:
            path = self.out / o
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        t0 = time.perf_counter()
        record = fn()
        json.dumps(record, default=str)           # a record that cannot be stored fails here, not at the next run
        stages[name] = {"key": key, "inputs": inputs, "outputs": self._hashes(outputs), "record": record,
                        "seconds": round(time.perf_counter() - t0, 2)}
        self._save()
        self.ran.append(name)
        return json.loads(json.dumps(record, default=str))

    def seconds(self) -> dict[str, float]:
        """Each finished stage's time when it ran (a resumed stage keeps its first run's)."""
        return {k: v.get("seconds", 0.0) for k, v in self.state["stages"].items()}

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


class StagedRun:
    """What every resumable edit run resolves once and shares: the model (located by path or public
    name), its chat template, the plain texts, progress by label, and, once `start` has been
    called (after the run's own input checks), the stage ledger and the inputs' sha256, which key
    every stage too; and the two stages every edit run has: `apply_stage` and `verify_stage`."""

    def __init__(self, out, model, template, texts, progress: Progress | None):
        from exactedit.native.llamacpp.models import locate

        self.out = Path(out)
        self.progress = progress
        self.tick = (lambda label: (lambda d, t: progress(label, d, t))) if progress else (lambda label: None)
        self.model = locate(model, progress=self.tick("model"))
        self.template = template
        self.tpl_path = None if template is None else str(template.path)
        self.texts = tuple(texts)

    def start(self, total: int, command: str, state_file: str) -> None:
        """Open the ledger (refusing a directory not a run's) and hash the inputs."""
        self.stages = Stages(self.out, total, self.progress, command, state_file=state_file)
        self.sha = {"model": file_sha256(self.model, progress=self.tick("hashing the model")),
                    "template": None if self.tpl_path is None else file_sha256(self.tpl_path),
                    "texts": [file_sha256(t) for t in self.texts]}

    def run(self, name: str, inputs: dict, outputs: Sequence[str], fn: Callable[[], dict]) -> dict:
        return self.stages.run(name, {"model": self.sha["model"], "template": self.sha["template"], **inputs},
                               outputs, fn)

    def apply_stage(self, bundle) -> dict:
        """`apply`: the solve's bundle written into DIR/edited.gguf, every other byte of the model kept."""
        from exactedit.solvers.apply import apply_bundle

        def apply():
            applied = apply_bundle(bundle, self.model, self.out / "edited.gguf", progress=self.tick("apply"))
            return {"edited": str(applied.out), "sha256": applied.out_sha256}

        return self.run("apply", {"solve": self.stages.outputs("solve")}, ["edited.gguf"], apply)

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
