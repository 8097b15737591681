"""Live verification through the production engine's command contract (native/verify/strata.py).

The engine is any program honouring `--metal-gguf {gguf} --tokens-file {tokens} --logits-out
{logits}` (the Metal CLI in production; `exactedit engine run`, llama.cpp, on Linux). exactedit
applies the bundle through the transplant, runs the command on the base and the edited file with
the dump's tokens, and compares each engine output with its offline prediction recomputed from the
dump (`solvers.tail.logits.write_logits`, exact arithmetic or `match_engine`'s). The tolerance is the
caller's: it depends on how faithfully the offline arithmetic models the engine's (docs/live.md).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from exactedit.native.verify.strata import EngineCommand, run_engine
from exactedit.native.verify.live import Check, Tolerance, VerifyReport, logit_stats

Progress = Callable[[int, int], None]


def verify_engine(command: EngineCommand, model, bundle, dump, *, tolerance: Tolerance | None = None,
                  match_engine: str | None = None, workdir=None,
                  progress: Progress | None = None) -> VerifyReport:
    """Engine (through `command`) vs offline prediction, on base and edited files, over the
    tokens of `dump` (one document read from its first token). The dump's field hashes are
    verified (once: a cache serves the two predictions) and a dump recorded as of another model
    than `model` is refused before anything runs; a dump that records no model is reported so."""
    from exactedit.dumps import VerifyCache, read_dump
    from exactedit.native.llamacpp.engine import EngineError
    from exactedit.quant.gguf import file_sha256
    from exactedit.solvers.apply import apply_bundle
    from exactedit.solvers.tail.logits import write_logits

    tolerance = tolerance or Tolerance()
    tick = (lambda i: progress(i, 5)) if progress else (lambda i: None)
    cache = VerifyCache()
    d = read_dump(dump, check_finite=False, cache=cache)
    model_sha = file_sha256(model)
    if d.model_sha256 is not None and d.model_sha256 != model_sha:
        raise EngineError(dump, "model_sha256", f"the dump was captured from a model with sha256 {d.model_sha256}; "
                          f"--model {model} has {model_sha}: its activations cannot predict that model's logits")
    tokens = np.asarray(d.tokens, dtype=np.int32)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        edited = tmp / "edited.gguf"
        applied = apply_bundle(bundle, model, edited)
        tick(1)
        checks, engine_out = [], {}
        for i, (name, path) in enumerate((("base", Path(model)), ("edited", edited))):
            predicted = write_logits(path, dump, tmp / f"{name}-offline.npy", match_engine=match_engine, cache=cache)
            offline = np.load(predicted.out)
            run_dir = tmp / f"{name}-run"
            run_dir.mkdir()
            engine_out[name] = run_engine(command, path, tokens, offline.shape[1], run_dir).logits
            stats = logit_stats(offline, engine_out[name])
            checks.append(Check(name, stats, tolerance.failures(stats)))
            tick(2 + 2 * i)
        report = VerifyReport(str(model), model_sha, str(edited), applied.out_sha256,
                              applied.bundle_sha256, int(tokens.size),
                              {"engine": shell_join(command), "match_engine": match_engine,
                               "dump_sha256": d.sha256(), "dump_model_sha256": d.model_sha256}, (),
                              tuple(checks), logit_stats(engine_out["base"], engine_out["edited"]), tolerance)
    tick(5)
    return report


def shell_join(command: EngineCommand) -> str:
    import shlex

    return shlex.join(command.template + command.extra)
