"""`exactedit kld`: an edited model against its base over the rows of one or more dumps.

Two choices, both recorded in the result:
* the logits: exact float arithmetic (default), or `match_engine="llamacpp"`, the engine-faithful
  path (`solvers.tail.engine_math`: activations quantized before each quantized matmul, ggml-cpu's
  summation order), which reproduces llama.cpp's logits bit for bit from a dump it captured;
* the statistics: `exact` (`evals.kl.stats`: the KL over the whole vocabulary, computed in float64 from
  the logits) or `llama-perplexity` (`evals.kl.llamacpp`: the tool's 16-bit base codes and
  -16-nat cutoff, its formulas and float types; rows must have a known next token).

With the default both sides are computed in exact arithmetic: the KL measures the edit's own effect.
llama.cpp's own report also contains the engine's activation rounding, which differs between base
and edited (about 2e-4 of KL per row on Qwen) and dominates the bulk of the distribution; the
engine-faithful path with the tool's statistics reproduces that report to its printed digits.

Rows: `rows` is a range A:B of each dump (one range for every dump, or one per dump), `doc_rows`
the same range A:B within every document (e.g. 256:511, the rows llama-perplexity scores in chunks
of 512). Rows of all dumps are combined, in order, into one report.

With the tool's statistics the base side can come from elsewhere: `base` (anything with `rows`,
`next_tokens()` and `base_rows(a, b)`, e.g. a `--kl-divergence-base` file that llama-perplexity
wrote, `evals.kl.base_file`) replaces the base model, and `base_sink` receives the base rows as
they are computed (to write such a file).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

import numpy as np

from exactedit.evals.kl.stats import KldStats, kld_stats, render_kld_stats
from exactedit.evals.kl.llamacpp import BaseRows, LpRows, concat_rows, encode_base, score_rows
from exactedit.evals.kl.llamacpp_stats import (
    LlamacppStats, base_ppl, lp_stats, render_chunk_table, render_lp_report,
)
from exactedit.errors import ExacteditError
from exactedit.solvers.tail.passes.kl_pass import KlRows, kl_rows

Progress = Callable[[int, int], None]
STATS = ("exact", "llama-perplexity")


class KldConfigError(ExacteditError):
    """An impossible `exactedit kld` request (missing model, rows that do not fit, ...)."""


class BaseSource(Protocol):
    rows: int

    def next_tokens(self) -> np.ndarray: ...

    def base_rows(self, start: int, stop: int) -> BaseRows: ...


@dataclass(frozen=True)
class KldConfig:
    """What `exactedit kld` compares; CLI flags map 1:1 to fields."""

    dumps: tuple[str, ...]
    model: str | None = None          # base GGUF (not needed when the base comes from a base file)
    edited: str | None = None         # edited GGUF (not needed when only the base side is written)
    rows: tuple[str, ...] = ()        # 'A:B' of each dump: one for all, or one per dump
    doc_rows: str | None = None       # 'A:B' within every document
    match_engine: str | None = None   # None (exact arithmetic) or "llamacpp"
    stats: str = "exact"              # "exact" or "llama-perplexity"
    tile_rows: int = 8192
    block_rows: int = 128             # rows whose full logits are held at once (llama-perplexity stats)

    def __post_init__(self):
        object.__setattr__(self, "dumps", tuple(str(d) for d in self.dumps))
        object.__setattr__(self, "rows", tuple(self.rows))
        if not self.dumps:
            raise KldConfigError("kld: give at least one dump")
        if self.stats not in STATS:
            raise KldConfigError(f"kld: stats must be one of {STATS}, got {self.stats!r}")
        if self.match_engine not in (None, "llamacpp"):
            raise KldConfigError(f"kld: match-engine must be llamacpp, got {self.match_engine!r}")
        if self.rows and self.doc_rows is not None:
            raise KldConfigError("kld: give --rows or --doc-rows, not both")
        if len(self.rows) not in (0, 1, len(self.dumps)):
            raise KldConfigError(f"kld: {len(self.rows)} --rows for {len(self.dumps)} dumps; give one for "
                                 f"all, or one per dump")
        for key in ("tile_rows", "block_rows"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise KldConfigError(f"kld: {key} must be an integer >= 1")


class Span(NamedTuple):
    """Rows [start, stop) of dump `dump` (an index into the config's dumps); `doc` names the document
    when the span came from --doc-rows."""

    dump: int
    start: int
    stop: int
    doc: str | None


def select_rows(cfg: KldConfig, dumps) -> list[Span]:
    """The spans the report is made of, dump after dump, in row order."""
    from exactedit.solvers.tail.logits import parse_rows

    spans = []
    for i, d in enumerate(dumps):
        if cfg.doc_rows is not None:
            for doc in d.docs:
                a, b = parse_rows(cfg.doc_rows, doc.rows)
                spans.append(Span(i, doc.first_row + a, doc.first_row + b, doc.name))
        else:
            text = cfg.rows[0] if len(cfg.rows) == 1 else (cfg.rows[i] if cfg.rows else None)
            spans.append(Span(i, *parse_rows(text, d.rows), None))
    return spans


@dataclass(frozen=True)
class DumpRef:
    path: str
    sha256: str
    spans: tuple[tuple[str | None, int, int], ...]


@dataclass(frozen=True)
class KldComparison:
    """What was compared, how, and the statistics (`exact` or `llamacpp`, per `stats`)."""

    stats: str
    match_engine: str | None
    model: str | None
    model_sha256: str | None
    edited: str | None
    edited_sha256: str | None
    dumps: tuple[DumpRef, ...]
    span_rows: tuple[int, ...]         # rows per span, in order (the chunks of the tool's table)
    exact: KldStats | None
    llamacpp: LlamacppStats | None
    exact_rows: KlRows | None
    lp_rows: LpRows | None
    base_ppl: tuple[float, float] | None   # the tool's base-pass estimate, when the base was computed here

    @property
    def per_row_kld(self) -> np.ndarray | None:
        """float64 per-row KLD, or None when no edited model was scored."""
        if self.exact_rows is not None:
            return np.asarray(self.exact_rows.kl, np.float64)
        return None if self.lp_rows is None else np.asarray(self.lp_rows.kld, np.float64)

    def summary(self) -> dict | None:
        """The headline numbers, alike for both statistics."""
        if self.exact is not None:
            s = self.exact
            kld = {"mean": s.kld_mean, "median": s.kld_median, "p90": s.kld_p90, "p95": s.kld_p95,
                   "p99": s.kld_p99, "p999": s.kld_p999, "max": s.kld_max, "min": s.kld_min}
            return {"rows": s.rows, "kld": kld, "same_top": s.same_top, "ppl_base": s.ppl_base,
                    "ppl_edited": s.ppl_edited, "rms_dp": s.dp_rms}
        if self.llamacpp is not None:
            s = self.llamacpp
            lv = s.kld
            kld = {"mean": s.kld_mean, "median": lv["Median"], "p90": lv["90.0%"], "p95": lv["95.0%"],
                   "p99": lv["99.0%"], "p999": lv["99.9%"], "max": lv["Maximum"], "min": lv["Minimum"]}
            return {"rows": s.rows, "kld": kld, "same_top": s.same_top, "ppl_base": s.ppl_base,
                    "ppl_edited": s.ppl, "rms_dp": s.rms_dp}
        return None

    def to_dict(self, per_row: bool = True) -> dict:
        out = {"stats": self.stats, "match_engine": self.match_engine, "model": self.model,
               "model_sha256": self.model_sha256, "edited": self.edited, "edited_sha256": self.edited_sha256,
               "dumps": [{"path": d.path, "sha256": d.sha256,
                          "spans": [{"doc": doc, "rows": [a, b]} for doc, a, b in d.spans]} for d in self.dumps]}
        summary = self.summary()
        if summary is not None:
            out.update(summary)
        if self.exact is not None:
            out["exact_stats"] = self.exact.to_dict()
        if self.llamacpp is not None:
            out["llama_perplexity"] = self.llamacpp.to_dict()
        if self.base_ppl is not None:
            out["base_pass_ppl"] = {"ppl": self.base_ppl[0], "unc": self.base_ppl[1]}
        if per_row and self.per_row_kld is not None:
            out["per_row_kld"] = self.per_row_kld.tolist()
        return out


class _Side(NamedTuple):
    path: str
    g: object
    tail: object


def _open(path) -> _Side:
    from exactedit.quant import gguf
    from exactedit.solvers.tail.model import load_tail

    g = gguf.open(path)
    return _Side(str(path), g, load_tail(g))


def _check_same_tail(base: _Side, edited: _Side) -> None:
    for key in ("kind", "n", "vocab", "h", "streams", "layer"):
        a, b = getattr(base.tail.spec, key), getattr(edited.tail.spec, key)
        if a != b:
            raise ExacteditError(f"{edited.path}: tail {key} is {b!r}, the base model's is {a!r}")
    if base.tail.softcap != edited.tail.softcap:
        raise ExacteditError(f"{edited.path}: logit softcap {edited.tail.softcap} differs from the base's "
                             f"{base.tail.softcap}")


def rewritten_units(base: _Side, edited: _Side):
    """A function dump -> the dump as the edited model sees it: where the edited file's last-FFN
    gate or up rows differ from the base's (a gated edit: solvers/l47/gated), those units' hidden
    values recomputed from the dump's R as the engine computes them
    (solvers/tail/forward/ffn_hidden.py); the dump itself when none differ. A dump's hh is the base
    model's: without this the edited side would read the old unit's activation through the new
    down column. The changed units are found once per comparison."""
    from exactedit.errors import GGUFFormatError
    from exactedit.solvers.l47.gated.edit import GatedDump
    from exactedit.solvers.tail.forward.ffn_hidden import last_ffn

    same = lambda dump: dump  # noqa: E731
    tail = edited.tail
    if base is None or tail.kind != "rmsnorm":
        return same
    try:
        ffn = last_ffn(edited.g, tail.spec.names["ffn_down"], tail.spec.architecture, float(tail.spec.rms_eps))
        g_b, u_b = np.asarray(base.g.read_raw(ffn.gate)), np.asarray(base.g.read_raw(ffn.up))
    except GGUFFormatError:             # a file without the last FFN's gate / up (a tail-only fixture)
        return same
    if g_b.shape != ffn.gate_raw.shape or u_b.shape != ffn.up_raw.shape:
        return same
    units = ffn.changed(g_b, u_b)
    if not units.size:
        return same

    def rewrite(dump):
        meta = dump.manifest.meta if isinstance(getattr(dump.manifest, "meta", None), dict) else {}
        A = ffn.hidden(dump.R, units.tolist(), ubatch_sizes=meta.get("ubatch_sizes"))
        return GatedDump(dump, units.tolist(), A)
    return rewrite


def _mix(side: _Side, dump, span: Span, match_engine: str | None):
    """(mix [rows, n], matmul for them): exact (None = the default sgemm) or engine-faithful."""
    from exactedit.solvers.tail.engine_math import engine_logits_setup
    from exactedit.solvers.tail.logits import tail_mix

    if match_engine is None:
        return tail_mix(side.tail, dump, (span.start, span.stop)), None
    return engine_logits_setup(side.g, side.tail, dump, (span.start, span.stop), match_engine)


def _block_matmul(matmul, a: int, b: int):
    from exactedit.solvers.tail.engine_math import EngineMatmul

    return None if matmul is None else EngineMatmul(matmul.match, matmul.tiled[a:b])


def _full_logits(side: _Side, mix: np.ndarray, matmul, tile_rows: int) -> np.ndarray:
    from exactedit.solvers.tail.logits import head_pass

    out = np.empty((mix.shape[0], side.tail.spec.vocab), np.float32)

    def sink(a, b, tile):
        out[:, a:b] = tile

    head_pass(side.tail, mix, matmul=matmul, tile_rows=tile_rows, sink=sink)
    return out


def compare(cfg: KldConfig, *, base: BaseSource | None = None, base_sink: Callable[[BaseRows], None] | None = None,
            matmul=None, progress: Progress | None = None) -> KldComparison:
    """Score `cfg.edited` against `cfg.model` (or `base`) on the selected dump rows."""
    from exactedit.dumps import read_dump

    lp = cfg.stats == "llama-perplexity"
    if (base is not None or base_sink is not None) and not lp:
        raise KldConfigError("kld: a base file holds llama-perplexity's 16-bit codes; use --stats llama-perplexity")
    if base is not None and cfg.model is not None:
        raise KldConfigError("kld: the base comes from the base file; do not give --model too")
    if base is None and cfg.model is None:
        raise KldConfigError("kld: give --model (the base GGUF) or a base file")
    if cfg.edited is None and base_sink is None:
        raise KldConfigError("kld: give --edited (or only write a base file)")
    if matmul is not None and cfg.match_engine is not None:
        raise KldConfigError("kld: give match_engine or matmul, not both")
    b_side = _open(cfg.model) if cfg.model is not None else None
    e_side = _open(cfg.edited) if cfg.edited is not None else None
    if b_side is not None and e_side is not None:
        _check_same_tail(b_side, e_side)
    ref = b_side or e_side
    dumps = [read_dump(p, expect=ref.tail.dump_expect()) for p in cfg.dumps]
    spans = select_rows(cfg, dumps)
    sizes = tuple(s.stop - s.start for s in spans)
    total = sum(sizes)
    refs = tuple(DumpRef(p, d.sha256(), tuple((s.doc, s.start, s.stop) for s in spans if s.dump == i))
                 for i, (p, d) in enumerate(zip(cfg.dumps, dumps)))
    nexts = [np.asarray(dumps[s.dump].next[s.start:s.stop], np.int64) for s in spans]
    edited_dumps = list(map(rewritten_units(b_side, e_side), dumps)) if e_side is not None else dumps
    meta = dict(stats=cfg.stats, match_engine=cfg.match_engine,
                model=None if b_side is None else b_side.path, model_sha256=None if b_side is None else b_side.g.sha256(),
                edited=None if e_side is None else e_side.path,
                edited_sha256=None if e_side is None else e_side.g.sha256(), dumps=refs, span_rows=sizes)
    if not lp:
        parts = []
        for s, nxt in zip(spans, nexts):
            mb, mm = _mix(b_side, dumps[s.dump], s, cfg.match_engine)
            me, _ = _mix(e_side, edited_dumps[s.dump], s, cfg.match_engine)
            parts.append(kl_rows(mb, b_side.tail.head, me, e_side.tail.head, next_ids=nxt,
                                 softcap=b_side.tail.softcap, tile_rows=cfg.tile_rows,
                                 matmul=mm if mm is not None else matmul))
            if progress is not None:
                progress(sum(len(p.kl) for p in parts), total)
        rows = KlRows(*(np.concatenate([getattr(p, f) for p in parts]) for f in KlRows._fields))
        return KldComparison(**meta, exact=kld_stats(rows), llamacpp=None, exact_rows=rows, lp_rows=None,
                             base_ppl=None)
    for s, nxt in zip(spans, nexts):
        if nxt.size and nxt.min() < 0:
            bad = s.start + int(np.flatnonzero(nxt < 0)[0])
            raise KldConfigError(f"{cfg.dumps[s.dump]}: row {bad} has no next token; llama-perplexity scores only "
                                 f"rows with one (leave the document's last row out, e.g. --doc-rows A:-1)")
    all_next = np.concatenate(nexts)
    if base is not None:
        if base.rows != total:
            raise KldConfigError(f"kld: the base file has {base.rows} rows, the dumps' selected rows are {total}")
        want = np.asarray(base.next_tokens(), np.int64)
        if not np.array_equal(want, all_next):
            i = int(np.flatnonzero(want != all_next)[0])
            raise KldConfigError(f"kld: row {i} of the selection predicts token {int(all_next[i])}, the base file's "
                                 f"row {i} token {int(want[i])}: the dumps are not the file's chunks")
    parts, nll_base, done = [], [], 0
    for s, nxt in zip(spans, nexts):
        mb, mmb = (None, None) if base is not None else _mix(b_side, dumps[s.dump], s, cfg.match_engine)
        me, mme = (None, None) if e_side is None else _mix(e_side, edited_dumps[s.dump], s, cfg.match_engine)
        for a in range(0, s.stop - s.start, cfg.block_rows):
            b = min(a + cfg.block_rows, s.stop - s.start)
            if base is not None:
                rows_b = base.base_rows(done, done + b - a)
            else:
                lb = _full_logits(b_side, mb[a:b], _block_matmul(mmb, a, b) or matmul, cfg.tile_rows)
                rows_b, nll = encode_base(lb, nxt[a:b])
                nll_base.append(nll)
                del lb
            if base_sink is not None:
                base_sink(rows_b)
            if e_side is not None:
                le = _full_logits(e_side, me[a:b], _block_matmul(mme, a, b) or matmul, cfg.tile_rows)
                parts.append(score_rows(le, rows_b, nxt[a:b]))
            done += b - a
            if progress is not None:
                progress(done, total)
    rows = concat_rows(parts) if parts else None
    return KldComparison(**meta, exact=None, llamacpp=None if rows is None else lp_stats(rows, sizes),
                         exact_rows=None, lp_rows=rows,
                         base_ppl=base_ppl(np.concatenate(nll_base)) if nll_base else None)


def render_comparison(r: KldComparison) -> str:
    """The text report: inputs, then the statistics (for llama-perplexity's, its own lines)."""
    lines = []
    if r.model is not None:
        lines.append(f"base    {r.model}  ({r.model_sha256[:12]})")
    if r.edited is not None:
        lines.append(f"edited  {r.edited}  ({r.edited_sha256[:12]})")
    for d in r.dumps:
        spans = ", ".join(f"{doc + ' ' if doc else ''}{a}:{b}" for doc, a, b in d.spans)
        lines.append(f"dump    {d.path}  rows {spans}  ({d.sha256[:12]})")
    how = "engine-faithful (llamacpp)" if r.match_engine else "exact float arithmetic"
    lines.append(f"logits  {how}; statistics: {r.stats}")
    if r.exact is not None:
        lines += render_kld_stats(r.exact)
    if r.llamacpp is not None:
        if r.llamacpp.rows < 100:
            lines.append("(llama-perplexity itself prints no summary below 100 rows)")
        lines += render_chunk_table(r.llamacpp) + [""] + render_lp_report(r.llamacpp)
    if r.base_ppl is not None:
        lines.append("base pass: Final estimate: PPL = %.4f +/- %.5f" % r.base_ppl)
    return "\n".join(lines)
