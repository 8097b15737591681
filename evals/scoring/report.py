"""Bar reports: one `BarReport` dataclass, rendered as a text table, markdown, JSON and a PNG of
per-phrase p(rejected) before and after. Nothing here prints; renderers return strings and the
writer returns the paths and sha256 of what it wrote (each file: `*.tmp`, fsync, rename).

A report made under `--unregistered` carries the ledger's marker line; every rendering starts
with it, so an unregistered number can never pass for a registered one.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from exactedit.evals.scoring.bars import BarRow, PhraseRow
from exactedit.evals.protocol.ledger import file_sha256
from exactedit.errors import FieldError
from exactedit.files import decode_utf8, fsync_replace, read_regular, write_png

REPORT_KIND = "exactedit.eval-report"
MAX_REPORT_BYTES = 64 << 20      # a report JSON read back (`eval blind --dev-report`), read whole


class ReportError(FieldError):
    """A report file cannot be read back: not a regular file, too large, or not an exactedit report."""


@dataclass(frozen=True)
class BarReport:
    """The bars of one scoring run. `kind` is "score", "test" or "blind"; `kld` maps a scope name
    to llama.cpp-form KL statistics (`evals.kl.stats.KldStats.to_dict()`); `meta` names the inputs
    (model, edited model or bundle and their sha256, dumps, protocol, shaping rules)."""

    kind: str
    heldout_role: str
    rows: tuple[BarRow, ...]
    verdict: str
    phrases: tuple[PhraseRow, ...] = ()
    kld: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
    marker: str = ""

    def row(self, key: str) -> BarRow | None:
        for r in self.rows:
            if r.key == key:
                return r
        return None


def _num(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


def report_to_json(r: BarReport) -> dict:
    """JSON-safe dict (NaN -> null)."""
    def row(b: BarRow) -> dict:
        d = asdict(b)
        d["ci"] = [_num(c) for c in b.ci]
        return {k: (_num(v) if isinstance(v, float) else v) for k, v in d.items()}

    return {"kind": REPORT_KIND, "report": r.kind, "heldout_role": r.heldout_role, "verdict": r.verdict,
            "marker": r.marker, "meta": dict(r.meta),
            "bars": [row(b) for b in r.rows],
            "phrases": [{k: (_num(v) if isinstance(v, float) else list(v) if isinstance(v, tuple) else v)
                         for k, v in asdict(p).items()} for p in r.phrases],
            "kld": {k: {kk: _num(vv) for kk, vv in v.items()} for k, v in r.kld.items()}}


def _typed(value, kinds, where: str, what: str):
    """`value` when it is one of `kinds` (a bool is no number), else TypeError naming `where`."""
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise TypeError(f"{where}: expected {what}, got {value!r:.80}")
    return value


def _bar_row(b, i: int) -> BarRow:
    """One bar as read back: every field of the type `report_to_json` writes (a number or null
    where a number may be missing), else TypeError naming the field (a string compared as a number
    was a TypeError deep in `eval blind`)."""
    nan = lambda v: math.nan if v is None else v  # noqa: E731

    def num(key):
        return nan(_typed(b[key], (int, float, type(None)), f"bars[{i}].{key}", "a number or null"))

    def text(key):
        return _typed(b[key], (str,), f"bars[{i}].{key}", "a string")

    ci = _typed(b["ci"], (list,), f"bars[{i}].ci", "[low, high]")
    if len(ci) != 2:
        raise TypeError(f"bars[{i}].ci: expected [low, high], got {ci!r:.80}")
    ci = tuple(nan(_typed(c, (int, float, type(None)), f"bars[{i}].ci", "[low, high] numbers or null")) for c in ci)
    return BarRow(text("key"), text("bar"), text("label"), num("number"), num("threshold"), text("op"),
                  _typed(b["passed"], (bool, type(None)), f"bars[{i}].passed", "true, false or null"),
                  _typed(b["n"], (int,), f"bars[{i}].n", "an integer"), ci, num("base"), num("edited"),
                  text("scope"), _typed(b.get("gating", True), (bool,), f"bars[{i}].gating", "true or false"))


def report_from_json(obj: Mapping) -> BarReport:
    """Inverse of `report_to_json` (null -> NaN). Raises ValueError on a foreign document, TypeError
    naming the field where a bar's field or `meta` has the wrong type."""
    if not isinstance(obj, Mapping) or obj.get("kind") != REPORT_KIND:
        raise ValueError(f"not an exactedit eval report (kind {REPORT_KIND!r})")
    nan = lambda v: math.nan if v is None else v  # noqa: E731
    rows = tuple(_bar_row(b, i) for i, b in enumerate(obj["bars"]))
    _typed(obj.get("meta", {}), (dict,), "meta", "an object")
    phrases = tuple(PhraseRow(p["phrase"], tuple(p["tokens"]), p["n"], nan(p["base"]), nan(p["edited"]),
                              p.get("text", "")) for p in obj.get("phrases", []))
    kld = {k: {kk: nan(vv) for kk, vv in v.items()} for k, v in obj.get("kld", {}).items()}
    return BarReport(obj["report"], obj["heldout_role"], rows, obj["verdict"], phrases, kld,
                     dict(obj.get("meta", {})), obj.get("marker", ""))


def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.0f}" if float(x).is_integer() and abs(x) < 1e6 else f"{x:.4g}"


def _status(b: BarRow) -> str:
    if not b.gating:
        return "reported"
    return "n/a" if b.passed is None else ("pass" if b.passed else "FAIL")


def format_table(r: BarReport) -> str:
    """A fixed-width text table of every bar, then the KL statistics per scope."""
    head = ("bar", "what", "scope", "number", "bar at", "95% CI", "n", "")
    lines = [(b.bar, b.label, b.scope, _fmt(b.number), f"{b.op} {_fmt(b.threshold)}",
              "" if not math.isfinite(b.ci[0]) else f"[{_fmt(b.ci[0])}, {_fmt(b.ci[1])}]", str(b.n), _status(b))
             for b in r.rows]
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    out = [r.marker] if r.marker else []
    out.append(f"{r.kind} report, held-out role {r.heldout_role}: {r.verdict.upper()}")
    for x in [head, *lines]:
        out.append("  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip())
    for scope, st in r.kld.items():
        out.append(f"KL {scope}: mean {_fmt(st['kld_mean'])}  median {_fmt(st['kld_median'])}  "
                   f"p90 {_fmt(st['kld_p90'])}  p99 {_fmt(st['kld_p99'])}  max {_fmt(st['kld_max'])}  "
                   f"top-1 {_fmt(100 * st['same_top'])}%  PPL {_fmt(st['ppl_base'])} -> {_fmt(st['ppl_edited'])}"
                   f"  ({st['rows']} rows)")
    return "\n".join(out)


def format_markdown(r: BarReport, title: str = "") -> str:
    out = []
    if r.marker:
        out += [f"> **{r.marker}**", ""]
    out += [f"# {title or r.kind + ' report'}", "", f"Verdict: **{r.verdict}** (held-out role: {r.heldout_role})", ""]
    for k, v in r.meta.items():
        out.append(f"- {k}: `{v}`")
    out += ["", "| bar | what | scope | number | bar at | CI | n | |", "|---|---|---|---|---|---|---|---|"]
    for b in r.rows:
        ci = "" if not math.isfinite(b.ci[0]) else f"[{_fmt(b.ci[0])}, {_fmt(b.ci[1])}]"
        out.append(f"| {b.bar} | {b.label} | {b.scope} | {_fmt(b.number)} | {b.op} {_fmt(b.threshold)} | {ci} | "
                   f"{b.n} | {_status(b)} |")
    if r.phrases:
        out += ["", "| phrase | positions | p(rejected) base | edited |", "|---|---|---|---|"]
        out += [f"| {p.text or p.tokens} | {p.n} | {_fmt(p.base)} | {_fmt(p.edited)} |" for p in r.phrases]
    return "\n".join(out) + "\n"


def plot_phrases(r: BarReport, path: Path, title: str = "") -> None:
    """PNG: mean p(rejected) per phrase, base beside edited (phrases without positions left out)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rows = [p for p in r.phrases if p.n > 0]
    fig = Figure(figsize=(max(4.0, 1.1 * len(rows) + 2), 3.6), dpi=110)
    ax = fig.add_subplot()
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [p.base for p in rows], width=0.4, label="base")
    ax.bar([x + 0.2 for x in xs], [p.edited for p in rows], width=0.4, label="edited")
    ax.set_xticks(list(xs), [f"{p.text or p.tokens}\n(n={p.n})" for p in rows], fontsize=7)
    ax.set_ylabel("mean p(rejected)")
    ax.set_ylim(0, 1)
    ax.set_title((r.marker + "\n" if r.marker else "") + (title or f"{r.kind}: per-phrase p(rejected)"), fontsize=8)
    ax.legend(fontsize=7)
    write_png(fig, path)


@dataclass(frozen=True)
class WrittenFiles:
    """Paths and sha256 of the files a report writer produced."""

    paths: Mapping[str, Path]
    sha256: Mapping[str, str]


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    fsync_replace(tmp, path)


def write_report(r: BarReport, out_dir, stem: str, title: str = "", png: bool = True,
                 extra_md: str = "") -> WrittenFiles:
    """Write STEM.json, STEM.md (+ `extra_md`) and (with phrases) STEM.png into out_dir. A JSON
    larger than `read_report` reads (MAX_REPORT_BYTES) is refused (ReportError) before any is written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md"}
    text = json.dumps(report_to_json(r), indent=2, sort_keys=True, allow_nan=False) + "\n"   # ASCII
    if len(text) > MAX_REPORT_BYTES:                # `read_report` would refuse it: not written
        raise ReportError(paths["json"], "file", f"{len(text)} bytes, over the limit of {MAX_REPORT_BYTES} a report "
                          "is read back with")
    _atomic(paths["json"], lambda p: p.write_text(text, encoding="utf-8"))
    md = format_markdown(r, title) + ("\n" + extra_md if extra_md else "")
    _atomic(paths["md"], lambda p: p.write_text(md, encoding="utf-8"))
    if png and r.phrases:
        paths["png"] = out_dir / f"{stem}.png"
        _atomic(paths["png"], lambda p: plot_phrases(r, p, title))
    return WrittenFiles(paths, {k: file_sha256(p) for k, p in paths.items()})


def read_report(path, field: str = "report") -> tuple[BarReport, str]:
    """A report JSON file and the sha256 of the bytes read. A regular file of at most
    MAX_REPORT_BYTES (a FIFO or a device is refused, not waited on), UTF-8 JSON of an exactedit
    report; else ReportError(path, `field` (the flag that named it), why)."""
    path = Path(path)
    data = read_regular(path, MAX_REPORT_BYTES, ReportError, field)
    text = decode_utf8(data, path, ReportError, field)
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ReportError(path, field, f"not JSON ({exc})") from None
    except RecursionError:
        raise ReportError(path, field, "not JSON (nested too deeply)") from None
    try:
        report = report_from_json(obj)
    except ValueError as exc:                       # a foreign document: it says which kind it expected
        raise ReportError(path, field, str(exc)) from None
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        why = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ReportError(path, field, f"not an exactedit eval report ({why})") from None
    return report, hashlib.sha256(data).hexdigest()
