"""Live verification: does a compiled engine loading the edited GGUF produce the predicted logits?

`verify_live(model, bundle, tokens)`:
 1. runs llama.cpp on the base model, capturing the tail's inputs (a dump: R, hh);
 2. writes the edited model through the bundle's transplant (`solvers.apply.apply_bundle`);
 3. runs llama.cpp on the edited model with the same settings;
 4. predicts both engines' logits offline from the base dump alone, in the engine-faithful mode
    (`solvers.tail.engine_math`, `--match-engine llamacpp`), with the base or the edited
    tensors; and compares: KL(engine || prediction) statistics, top-1 agreement, max |diff|.

Tolerance (`Tolerance`), and why it is tight. llama.cpp's CPU matmuls quantize each activation
row (Q8_K for K-quant weights, Q8_0 for Q8_0 weights) and add exact per-block integer dot
products in float32; the engine-faithful prediction does the same operations in the same order,
so on the build this project ships (x86-64 AVX2+FMA) it reproduces the logits bit for bit (Qwen's
Q6_K tail and Gemma 3's Q8_0 head with its post-FFN norm). The tolerance only leaves room for a
build whose kernels add the same terms in another order: every logit is a sum of n/256 (Q8_0:
n/32) block terms, each rounded once in float32 (relative 6e-8), so |diff| stays below about
n/256 * 6e-8 * sum|terms| ~ 1e-5 * max|logit|; we allow max|diff| <= 1e-4 * max(1, max|logit|)
and the live check's KL bars (mean <= 1e-8, max <= 1e-5, top-1 100%). Ignoring the activation
quantization alone already costs mean KL ~1e-5 and |diff| ~0.05, ten thousand times the bound;
an edit written to the wrong row or a mis-quantized tensor moves logits by far more than 1e-4.
"""
from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from exactedit.native.llamacpp.capture import pick, tail_names
from exactedit.native.llamacpp.engine import EngineError, EngineSettings, LlamaEngine
from exactedit.quant.model import arch
from exactedit.quant import gguf
from exactedit.solvers.tail.engine_math import MatchEngine, engine_matmul, rmsnorm_engine_mix, softcap

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class LogitStats:
    """How far logits B are from reference logits A, row by row (KL(softmax A || softmax B),
    float64), in llama.cpp's KL-divergence statistics."""

    rows: int
    kl_mean: float
    kl_median: float
    kl_p90: float
    kl_p99: float
    kl_max: float
    top1: float
    max_abs: float
    max_logit: float
    bitwise: bool


def logit_stats(a: np.ndarray, b: np.ndarray) -> LogitStats:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a64.shape != b64.shape or a64.ndim != 2:
        raise EngineError("logits", "shape", f"{a64.shape} vs {b64.shape}: expected equal [rows, V]")
    la = a64 - a64.max(1, keepdims=True)
    la -= np.log(np.exp(la).sum(1, keepdims=True))
    lb = b64 - b64.max(1, keepdims=True)
    lb -= np.log(np.exp(lb).sum(1, keepdims=True))
    kl = np.maximum((np.exp(la) * (la - lb)).sum(1), 0.0)
    q = np.quantile(kl, [0.5, 0.9, 0.99])
    return LogitStats(int(a64.shape[0]), float(kl.mean()), float(q[0]), float(q[1]), float(q[2]),
                      float(kl.max()), float((a64.argmax(1) == b64.argmax(1)).mean()),
                      float(np.abs(a64 - b64).max()), float(np.abs(a64).max()),
                      bool(np.array_equal(np.asarray(a), np.asarray(b))))


@dataclass(frozen=True)
class Tolerance:
    """The pass bars of a live check (see the module doc for where the numbers come from)."""

    kl_mean: float = 1e-8
    kl_max: float = 1e-5
    top1: float = 1.0
    max_abs_rel: float = 1e-4

    def __post_init__(self):
        for key in ("kl_mean", "kl_max", "max_abs_rel"):
            if not getattr(self, key) >= 0:
                raise EngineError("Tolerance", key, f"expected >= 0, got {getattr(self, key)!r}")
        if not 0 <= self.top1 <= 1:
            raise EngineError("Tolerance", "top1", f"expected a fraction in [0, 1], got {self.top1!r}")

    def failures(self, s: LogitStats) -> tuple[str, ...]:
        out = []
        if not s.kl_mean <= self.kl_mean:
            out.append(f"mean KL {s.kl_mean:.3g} > {self.kl_mean:g}")
        if not s.kl_max <= self.kl_max:
            out.append(f"max KL {s.kl_max:.3g} > {self.kl_max:g}")
        if not s.top1 >= self.top1:
            out.append(f"top-1 {s.top1:.4f} < {self.top1:g}")
        bound = self.max_abs_rel * max(1.0, s.max_logit)
        if not s.max_abs <= bound:
            out.append(f"max |diff| {s.max_abs:.3g} > {bound:.3g}")
        return tuple(out)


@dataclass(frozen=True)
class Check:
    name: str
    stats: LogitStats
    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class VerifyReport:
    model: str
    model_sha256: str
    edited: str
    edited_sha256: str
    bundle_sha256: str
    tokens: int
    settings: Mapping
    ubatch_sizes: tuple[int, ...]
    checks: tuple[Check, ...]            # base and edited: engine vs prediction
    edit_effect: LogitStats              # edited engine vs base engine: the edit did something
    tolerance: Tolerance

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def offload_note(self) -> str | None:
        """With layers on a GPU backend (n_gpu_layers != 0), what the check means: the prediction is
        the CPU backend's, bit-exact there only; None on the CPU backend."""
        layers = self.settings.get("n_gpu_layers", 0)
        if not layers:
            return None
        return (f"llama.cpp ran with {'all' if layers == -1 else layers} layers on a GPU backend (n_gpu_layers "
                f"{layers}); the prediction is CPU-faithful, bit-exact on the CPU backend only (--gpu-layers 0): "
                "a difference here may be the GPU's rounding, not the edit")

    def to_json(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        if self.offload_note is not None:     # absent on the CPU backend: its report is as before
            d["offload_note"] = self.offload_note
        for c, obj in zip(self.checks, d["checks"]):
            obj["passed"] = c.passed
        return d

    to_dict = to_json  # the name every printed result answers to (cli.emit)


def predict_rmsnorm(g: gguf.GGUFFile, R: np.ndarray, hh: np.ndarray, match: MatchEngine,
                    raw: Mapping[str, np.ndarray] | None = None,
                    base: np.ndarray | None = None) -> np.ndarray:
    """llama.cpp's logits [T, V] for an rmsnorm tail from a dump's R and hh, with tensors from
    `raw` (name -> uint8 rows, the edited bytes) in place of the file's. With `base` (the
    prediction for the unedited file) and only head rows changed, only those rows are recomputed."""
    tail = arch.detect_tail(g)
    if tail.kind != "rmsnorm":
        raise EngineError(g.path, "tail", f"expected an rmsnorm tail, got {tail.kind}")
    raw = dict(raw or {})
    head, down = tail.tensor("head"), tail.tensor("ffn_down")
    if head.name == "token_embd.weight" and head.name in raw:
        raise EngineError(g.path, "edits", "token_embd.weight is the tied head: an edit of it also moves "
                          "input embeddings, which a dump cannot predict; untie first")
    units = {down.name.replace("ffn_down", part) for part in ("ffn_gate", "ffn_up")}
    unknown = sorted(set(raw) - {head.name, down.name} - units)
    if unknown:
        raise EngineError(g.path, "edits", f"{unknown} are not in the tail (head {head.name}, "
                          f"ffn_down {down.name}, the last FFN's gate and up rows); their effect cannot be "
                          "predicted from a dump")
    if units & set(raw):
        hh = _rewritten_units(g, tail, R, hh, raw, match)
    W_out = raw.get(head.name)
    if base is not None and down.name not in raw and not units & set(raw):
        if W_out is None:
            return base.copy()
        changed = np.flatnonzero((W_out != g.read_raw(head.name)).any(1))
        xn = _normed(g, tail, R, hh, match, None)
        out = base.copy()
        if changed.size:
            out[:, changed] = _capped(engine_matmul(W_out[changed], head.type_name, tail.n, xn, match), tail)
        return out
    xn = _normed(g, tail, R, hh, match, raw.get(down.name))
    W_out = W_out if W_out is not None else g.read_raw(head.name)
    return _capped(engine_matmul(W_out, head.type_name, tail.n, xn, match), tail)


def _rewritten_units(g, tail, R, hh, raw, match) -> np.ndarray:
    """The dump's hh with the units whose gate or up row `raw` changes recomputed from R as the
    engine computes them (solvers/tail/forward/ffn_hidden.py: ffn_norm, the rows' products in the
    kernel each micro-batch takes, the fused swiglu, or geglu: the architecture's activation)."""
    from exactedit.errors import QuantError
    from exactedit.solvers.tail.forward.ffn_hidden import last_ffn

    ffn = last_ffn(g, tail.tensor("ffn_down").name, tail.architecture, float(tail.rms_eps))
    changed = ffn.changed(raw.get(ffn.gate, ffn.gate_raw), raw.get(ffn.up, ffn.up_raw))
    if not changed.size:
        return hh
    out = np.array(hh, dtype=np.float32)
    try:
        out[:, changed] = ffn.hidden(R, changed, gate_raw=raw.get(ffn.gate), up_raw=raw.get(ffn.up),
                                     ubatch_sizes=match.ubatch_sizes)
    except QuantError as exc:           # gate and up of different types, an architecture not listed
        raise EngineError(g.path, "edits", str(exc)) from None
    return out


def _capped(logits: np.ndarray, tail) -> np.ndarray:
    return softcap(logits, tail.logit_softcap) if tail.logit_softcap else logits


def _normed(g, tail, R, hh, match, W_down) -> np.ndarray:
    down = tail.tensor("ffn_down")
    W_down = W_down if W_down is not None else g.read_raw(down.name)

    def vector(role):
        return np.asarray(g.read_rows(tail.tensor(role).name), np.float32).reshape(-1)

    post = vector("post_ffn_norm") if "post_ffn_norm" in tail.names else None
    return rmsnorm_engine_mix(R, hh, W_down, down.type_name, tail.h, vector("output_norm"), tail.rms_eps,
                              match, w_post=post)


@dataclass(frozen=True)
class Baseline:
    """The base model's engine run on `tokens` and its offline prediction, made once and shared
    by every edit checked on the same tokens and settings."""

    model: Path
    model_sha256: str
    settings: EngineSettings
    tokens: np.ndarray
    logits: np.ndarray          # the engine's
    R: np.ndarray
    hh: np.ndarray
    match: MatchEngine
    predicted: np.ndarray


def live_baseline(model, tokens, settings: EngineSettings | None = None) -> Baseline:
    model = Path(model)
    settings = settings or EngineSettings()
    with gguf.open(model) as g:
        tail = arch.detect_tail(g)
        with LlamaEngine(model, settings) as engine:
            run = engine.evaluate(tokens, capture=tail_names(tail.layer))
        fields = pick(run, tail.layer, model)
        match = MatchEngine("llamacpp", run.ubatch_sizes)
        pred = predict_rmsnorm(g, fields["R"], fields["hh"], match)
        sha = g.sha256()
    return Baseline(model, sha, settings, run.tokens, run.logits, fields["R"], fields["hh"], match, pred)


def baseline_from_dump(model, dump, engine_logits: np.ndarray) -> Baseline:
    """A baseline from a llama.cpp dump (native.llamacpp.capture) and the engine logits of that run: the
    dump's documents are evaluated as one token stream, so this suits a one-document dump."""
    from exactedit.dumps import read_dump

    d = read_dump(dump)
    if len(d.manifest.docs) != 1:
        raise EngineError(dump, "docs", f"a baseline needs a one-document dump, got {len(d.manifest.docs)}")
    meta = d.manifest.meta
    settings = EngineSettings.from_meta(meta.get("engine_settings", {}), dump)
    match = MatchEngine.from_meta("llamacpp", meta, d.rows)
    R, hh = np.asarray(d.field("R")), np.asarray(d.field("hh"))
    with gguf.open(model) as g:
        sha = g.sha256()
        if d.manifest.model_sha256 != sha:
            raise EngineError(dump, "model_sha256", f"the dump is of {d.manifest.model_sha256}, {model} is {sha}")
        pred = predict_rmsnorm(g, R, hh, match)
    return Baseline(Path(model), sha, settings, np.asarray(d.field("tokens")), np.asarray(engine_logits),
                    R, hh, match, pred)


def check_edit(base: Baseline, bundle, *, tolerance: Tolerance | None = None, edited=None,
               workdir=None, check_model: bool = True) -> VerifyReport:
    """Check one bundle against a baseline. The prediction applies the bundle's edits in memory
    to the base tensors; the engine loads the file the transplant writes, or `edited` when given
    (an already edited GGUF, e.g. one made elsewhere): a file whose bytes are not the bundle's
    claim fails."""
    from exactedit.solvers.apply import apply_bundle
    from exactedit.solvers.bundle import Bundle, model_tensors, read_bundle

    tolerance = tolerance or Tolerance()
    if isinstance(bundle, Bundle):
        b = bundle
    else:
        with gguf.open(base.model) as g:      # the edits bounded by the model's tensors before they are read
            b = read_bundle(bundle, tensors=model_tensors(g))
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        if edited is None:
            edited = apply_bundle(b, base.model, Path(tmp) / "edited.gguf", check_model=check_model).out
        edited = Path(edited)
        with LlamaEngine(edited, base.settings) as engine:
            run = engine.evaluate(base.tokens)
        edited_sha = gguf.file_sha256(edited)
    with gguf.open(base.model) as g:
        pred = predict_rmsnorm(g, base.R, base.hh, base.match, bundle_raw(g, b), base=base.predicted)
    checks = []
    for name, engine_logits, predicted in (("base", base.logits, base.predicted), ("edited", run.logits, pred)):
        stats = logit_stats(engine_logits, predicted)
        checks.append(Check(name, stats, tolerance.failures(stats)))
    return VerifyReport(str(base.model), base.model_sha256, str(edited), edited_sha, b.sha256,
                        int(base.tokens.size), base.settings.as_meta(), base.match.ubatch_sizes,
                        tuple(checks), logit_stats(base.logits, run.logits), tolerance)


def verify_live(model, bundle, tokens, *, settings: EngineSettings | None = None,
                tolerance: Tolerance | None = None, edited=None, workdir=None,
                check_model: bool = True, progress: Progress | None = None) -> VerifyReport:
    """Apply `bundle` to `model`, run llama.cpp on both, compare with the offline predictions."""
    if progress is not None:
        progress(0, 2)
    base = live_baseline(model, tokens, settings)
    if progress is not None:
        progress(1, 2)
    report = check_edit(base, bundle, tolerance=tolerance, edited=edited, workdir=workdir,
                        check_model=check_model)
    if progress is not None:
        progress(2, 2)
    return report


def bundle_raw(g: gguf.GGUFFile, bundle) -> dict[str, np.ndarray]:
    """The bundle's claim: each edited tensor's full bytes, its edits applied in memory to `g`'s."""
    from exactedit.quant.gguf.patch import RowPatch, apply_row_patch

    out = {}
    for e in bundle.edits:
        if e.kind == "rows":
            out[e.tensor] = apply_row_patch(np.array(g.read_raw(e.tensor)), RowPatch(e.row_ids, e.raw))
        else:
            out[e.tensor] = np.ascontiguousarray(e.raw, dtype=np.uint8).reshape(g.read_raw(e.tensor).shape)
    return out


def render_report(r: VerifyReport) -> str:
    """A plain-text table of a live check (the CLI prints it; `--json` prints `to_json`)."""
    lines = [f"model   {r.model}  sha256 {r.model_sha256[:16]}",
             f"edited  {r.edited}  sha256 {r.edited_sha256[:16]}",
             f"bundle  sha256 {r.bundle_sha256[:16]}   tokens {r.tokens}   ubatches {list(r.ubatch_sizes)}",
             f"{'check':8} {'mean KL':>10} {'p99 KL':>10} {'max KL':>10} {'top-1':>8} {'max|diff|':>10} "
             f"{'bitwise':>8}  result"]
    for c in r.checks:
        s = c.stats
        lines.append(f"{c.name:8} {s.kl_mean:10.3g} {s.kl_p99:10.3g} {s.kl_max:10.3g} {s.top1:8.4f} "
                     f"{s.max_abs:10.3g} {str(s.bitwise):>8}  {'PASS' if c.passed else 'FAIL: ' + '; '.join(c.failures)}")
    e = r.edit_effect
    lines.append(f"edit effect (engine edited vs engine base): mean KL {e.kl_mean:.3g}, max KL {e.kl_max:.3g}, "
                 f"top-1 kept {e.top1:.4f}")
    t = r.tolerance
    lines.append(f"tolerance: mean KL <= {t.kl_mean:g}, max KL <= {t.kl_max:g}, top-1 >= {t.top1:g}, "
                 f"max|diff| <= {t.max_abs_rel:g} * max(1, max|logit|)")
    if r.offload_note is not None:
        lines.append("note: " + r.offload_note)
    lines.append("PASS" if r.passed else "FAIL")
    return "\n".join(lines)
