"""The production engine's contract: a command that reads a tokens file and writes a logits file.

Command: `strata_window_cli --metal-gguf {gguf} --tokens-file {tokens} --logits-out {logits}`
followed by the user's own flags (batch, threads, ...), which are recorded with every run.

Tokens file: little-endian int32 token ids, one after another, no header (4 * T bytes).
Logits file: little-endian float32, one full-vocabulary row per position, row-major, no header
(4 * T * V bytes); row t holds the logits after reading tokens 0..t (it predicts token t + 1).

On Linux the contract is exercised with `exactedit engine run`, which honours the same flags
with llama.cpp (`run_llamacpp` below), so the same runner and the same checks serve both.
"""
from __future__ import annotations

import shlex
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from exactedit.dumps.contract import StrataError, check_ids, read_logits, read_tokens, write_logits, write_tokens

TEMPLATE = ("strata_window_cli", "--metal-gguf", "{gguf}", "--tokens-file", "{tokens}",
            "--logits-out", "{logits}")
PLACEHOLDERS = ("{gguf}", "{tokens}", "{logits}")


@dataclass(frozen=True)
class EngineCommand:
    """A command template with the three placeholders, plus the user's extra flags."""

    template: tuple[str, ...] = TEMPLATE
    extra: tuple[str, ...] = ()

    def __post_init__(self):
        template = tuple(self.template)
        for ph in PLACEHOLDERS:
            if sum(ph in part for part in template) != 1:
                raise StrataError("command", "template", f"needs {ph} exactly once: {shlex.join(template)}")
        object.__setattr__(self, "template", template)
        object.__setattr__(self, "extra", tuple(self.extra))

    @classmethod
    def parse(cls, text: str | None, extra: str | Sequence[str] = ()) -> EngineCommand:
        template = tuple(shlex.split(text)) if text else TEMPLATE
        extra = tuple(shlex.split(extra)) if isinstance(extra, str) else tuple(extra)
        return cls(template, extra)

    def argv(self, gguf, tokens, logits) -> list[str]:
        values = {"{gguf}": str(gguf), "{tokens}": str(tokens), "{logits}": str(logits)}
        out = []
        for part in self.template:
            for ph, v in values.items():
                part = part.replace(ph, v)
            out.append(part)
        return out + list(self.extra)


@dataclass(frozen=True)
class StrataRun:
    argv: tuple[str, ...]
    logits: np.ndarray
    stderr_tail: str


def run_engine(command: EngineCommand, gguf, tokens, vocab: int, workdir,
               runner: Callable[..., subprocess.CompletedProcess] = subprocess.run,
               timeout: float | None = None) -> StrataRun:
    """Write the tokens file, run the command, read and check the logits file."""
    workdir = Path(workdir)
    toks = np.asarray(tokens)
    tok_path = write_tokens(workdir / "tokens.i32", toks)
    out_path = workdir / "logits.f32"
    if out_path.exists():
        out_path.unlink()
    argv = command.argv(gguf, tok_path, out_path)
    try:
        proc = runner(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise StrataError(argv[0], "command", f"could not run: {exc}") from None
    tail = (proc.stderr or "")[-2000:]
    if proc.returncode != 0:
        raise StrataError(argv[0], "exit status", f"{proc.returncode}: {tail.strip()[-500:]}")
    return StrataRun(tuple(argv), np.array(read_logits(out_path, toks.size, vocab)), tail)


@dataclass(frozen=True)
class ContractRun:
    """`exactedit engine run`: llama.cpp honouring the contract (what it read and wrote)."""

    gguf: str
    tokens_file: str
    logits_file: str
    rows: int
    vocab: int
    settings: dict
    ubatch_sizes: tuple[int, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def run_llamacpp(gguf, tokens_file, logits_out, settings=None,
                 progress: Callable[[int, int], None] | None = None) -> ContractRun:
    """Read the tokens file (before the model loads), evaluate with llama.cpp, write the logits file
    (atomically)."""
    from exactedit.native.llamacpp.engine import EngineSettings, LlamaEngine

    settings = settings or EngineSettings()
    toks = read_tokens(tokens_file)
    with LlamaEngine(gguf, settings) as engine:
        check_ids(tokens_file, toks, engine.n_vocab)
        run = engine.evaluate(toks, progress=progress)
    write_logits(logits_out, run.logits)
    return ContractRun(str(gguf), str(tokens_file), str(logits_out), int(toks.size), int(run.logits.shape[1]),
                       settings.as_meta(), run.ubatch_sizes)


def render_contract_run(res: ContractRun) -> str:
    """`exactedit engine run`'s line."""
    return (f"wrote {res.logits_file}: {res.rows} x {res.vocab} float32 logits "
            f"(micro-batches {list(res.ubatch_sizes)})")
