"""exactedit command line: parses flags, builds configs, calls one library function, reports.

This module only wires. Library code never imports click and never prints; domain errors
(`ExacteditError` subclasses) become click errors in `main` below, in one place.
"""
from __future__ import annotations

import sys

import click


class _Group(click.Group):
    """Turns the library's domain errors into clean click errors (one line, exit code 1)."""

    def invoke(self, ctx):
        from quant.errors import ExacteditError

        try:
            return super().invoke(ctx)
        except ExacteditError as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=_Group)
@click.version_option(package_name="exactedit")
def main() -> None:
    """Exact offline edits of a GGUF model's output head and last layer."""


@main.group()
def bench() -> None:
    """Benchmarks, reported as ratios against a baseline measured in the same run."""


@main.group()
def dump() -> None:
    """Activation dumps."""


@main.group()
def fixture() -> None:
    """The bundled tiny hc4 model and its dumps."""


@main.group()
def solve() -> None:
    """Solvers: `solve head`, `solve wfld`."""


@main.group(name="eval")
def eval_() -> None:
    """Pre-registered protocol, splits, bars, blind sign-off."""


@main.group()
def verify() -> None:
    """Live verification on a compiled engine."""


@main.group()
def engine() -> None:
    """Compiled engines (llama.cpp) behind the production engine's CLI contract."""


# ---- section: quant (inspect, bench quant) ---------------------------------------------------

def _gguf_bar(stack, label: str):
    """A progress(done, total) callback drawing a click progress bar on stderr, opened lazily."""
    bar = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = stack.enter_context(click.progressbar(length=total, label=label, file=sys.stderr))
        bar.update(done - bar.pos)

    return update


@main.command("inspect")
@click.argument("model", type=click.Path(dir_okay=False, exists=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect_cmd(model: str, as_json: bool) -> None:
    """Show MODEL.gguf's tail architecture, the tensors it uses, tied or not, sha256, metadata."""
    import contextlib
    import json

    from quant.arch import render_summary, summarize

    with contextlib.ExitStack() as stack:
        summary = summarize(model, progress=_gguf_bar(stack, "sha256"))
    click.echo(json.dumps(summary.to_dict(), indent=1) if as_json else render_summary(summary))


@bench.command("gguf-open")
@click.option("--vocab", default=262_144, show_default=True, type=click.IntRange(1), help="Tokens.")
@click.option("--merges/--no-merges", default=True, show_default=True, help="Also as many merges.")
@click.option("--layers", default=48, show_default=True, type=click.IntRange(0), help="Blocks of tensors.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1), help="Our opens (best).")
@click.option("--gguf-py-repeats", default=1, show_default=True, type=click.IntRange(1),
              help="gguf-py opens (best); each takes seconds to minutes at 262K tokens.")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False),
              help="Also write the result as JSON here ('-' for stdout only).")
def bench_gguf_open(vocab, merges, layers, repeats, gguf_py_repeats, json_out) -> None:
    """Open + list tensors of a synthetic GGUF with a big vocabulary: ours vs gguf-py's GGUFReader."""
    import contextlib
    import json

    from bench.gguf_open import GGUFOpenBenchConfig, run_gguf_open_bench

    cfg = GGUFOpenBenchConfig(vocab=vocab, merges=merges, layers=layers, repeats=repeats,
                              gguf_py_repeats=gguf_py_repeats)
    with contextlib.ExitStack() as stack:
        r = run_gguf_open_bench(cfg, progress=_gguf_bar(stack, "bench gguf-open"))
    text = json.dumps(r.to_dict(), indent=1)
    if json_out == "-":
        click.echo(text)
        return
    if json_out:
        with open(json_out, "w") as fh:
            fh.write(text + "\n")
    click.echo(f"vocab {r.vocab:,}{' + merges' if r.merges else ''}, file {r.file_bytes:,} bytes, "
               f"{r.tensors_ours} tensors\n"
               f"  exactedit open + list   {r.ours_s * 1e3:10.1f} ms\n"
               f"  gguf-py GGUFReader      {r.gguf_py_s * 1e3:10.1f} ms\n"
               f"  ratio (gguf-py / ours)  {r.ratio:10.1f}x\n"
               f"  token table decode      {r.tokens_s * 1e3:10.1f} ms")


@bench.command("quant")
@click.option("--rows", default=4096, show_default=True, type=click.IntRange(1), help="Rows per run.")
@click.option("--cols", default=2560, show_default=True, type=click.IntRange(1), help="Row width.")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1),
              help="Threads for both sides (numba.set_num_threads / C row chunks).")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1), help="Best of.")
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False),
              help="Also write the result as JSON here.")
def bench_quant(rows, cols, threads, repeats, json_out) -> None:
    """Q6_K and Q8_0 quantize/dequantize throughput: our numba paths vs ggml's C (ratio)."""
    import contextlib

    from bench.quant import QuantBenchConfig, format_table, run_quant_bench, write_json

    cfg = QuantBenchConfig(rows=rows, cols=cols, threads=threads, repeats=repeats)
    with contextlib.ExitStack() as stack:
        result = run_quant_bench(cfg, progress=_gguf_bar(stack, "bench quant"))
    click.echo(format_table(result))
    if json_out:
        sha = write_json(result, json_out)
        click.echo(f"wrote {json_out} (sha256 {sha[:16]})")


# ---- end section: quant ----------------------------------------------------------------------

# ---- section: dumps + forwards (dump inspect, logits, kld, bench head) ------------------------

def _dump_scan_bar(stack, label: str):
    """A progress(done, total) callback drawing a click progress bar on stderr, opened lazily."""
    bar = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = stack.enter_context(click.progressbar(length=total, label=label, file=sys.stderr))
        bar.update(done - bar.pos)

    return update


@dump.command("inspect")
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--verify-hashes", is_flag=True, help="Re-hash every field file against the manifest.")
def dump_inspect(directory: str, as_json: bool, verify_hashes: bool) -> None:
    """Validate the dump DIRECTORY; show arch, rows, fields, documents and role counts."""
    import contextlib
    import json

    from dumps.summary import format_table, inspect_dump

    with contextlib.ExitStack() as stack:
        summary = inspect_dump(directory, verify_hashes=verify_hashes,
                               progress=_dump_scan_bar(stack, "validating"))
    click.echo(json.dumps(summary.to_json(), indent=1) if as_json else format_table(summary))


@main.command("logits")
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True), help="GGUF model.")
@click.option("--dump", "dump_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="Activation dump directory.")
@click.option("--rows", default=None, metavar="A:B", help="Row range of the dump (default: all).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output .npy [rows, V] float32.")
@click.option("--tile-rows", default=8192, show_default=True, type=click.IntRange(1), help="Head rows per tile.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def logits_cmd(model, dump_dir, rows, out, tile_rows, as_json) -> None:
    """Full-vocabulary logits of MODEL recomputed from the dump rows, written to OUT."""
    import contextlib
    import json

    from solvers.logits import render_logits, write_logits

    with contextlib.ExitStack() as stack:
        res = write_logits(model, dump_dir, out, rows=rows, tile_rows=tile_rows,
                           progress=_dump_scan_bar(stack, "vocab pass"))
    click.echo(json.dumps(res.to_dict(), indent=1) if as_json else render_logits(res))


@main.command("kld")
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True), help="Base GGUF.")
@click.option("--dump", "dump_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="Activation dump directory (of the base model).")
@click.option("--edited", required=True, type=click.Path(dir_okay=False, exists=True), help="Edited GGUF.")
@click.option("--rows", default=None, metavar="A:B", help="Row range of the dump (default: all).")
@click.option("--tile-rows", default=8192, show_default=True, type=click.IntRange(1), help="Head rows per tile.")
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
def kld_cmd(model, dump_dir, edited, rows, tile_rows, as_json) -> None:
    """KL divergence of EDITED against MODEL on the dump (llama.cpp perplexity-tool statistics)."""
    import contextlib
    import json

    from evals.kld import kld, render_kld

    with contextlib.ExitStack() as stack:
        res = kld(model, dump_dir, edited, rows=rows, tile_rows=tile_rows,
                  progress=_dump_scan_bar(stack, "KL pass"))
    click.echo(json.dumps(res.to_dict(), indent=1) if as_json else render_kld(res))


@bench.command("head")
@click.option("--rows", default=512, show_default=True, type=click.IntRange(1), help="Activation rows.")
@click.option("--vocab", default=248320, show_default=True, type=click.IntRange(1), help="Head rows V.")
@click.option("--n", default=2560, show_default=True, type=click.IntRange(1), help="Model width (multiple of 256).")
@click.option("--tile-rows", default=8192, show_default=True, type=click.IntRange(1), help="Head rows per tile.")
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(1), help="Alternating repeats; best time kept.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench_head(rows, vocab, n, tile_rows, repeats, seed, as_json) -> None:
    """Streaming full-vocab pass over a synthetic Q6_K head vs numpy sgemm of the same shape."""
    import contextlib
    import json

    from bench.head import BenchHeadConfig, render_bench_head, run_bench_head

    try:
        cfg = BenchHeadConfig(rows, vocab, n, tile_rows, repeats, seed)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    with contextlib.ExitStack() as stack:
        res = run_bench_head(cfg, progress=_dump_scan_bar(stack, "bench head"))
    click.echo(json.dumps(res.to_dict(), indent=1) if as_json else render_bench_head(res))


# ---- end section: dumps + forwards -----------------------------------------------------------

# ---- section: fixture + demo -----------------------------------------------------------------

# ---- end section: fixture + demo -------------------------------------------------------------

# ---- section: native (engine run, verify live, mine) -----------------------------------------

# ---- end section: native ---------------------------------------------------------------------

# ---- section: evals --------------------------------------------------------------------------

_WORKSPACE = click.option("--workspace", type=click.Path(file_okay=False), default=".exactedit", show_default=True,
                          help="Directory holding this project's ledger.")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def _eval_command_line() -> str:
    import shlex

    return "exactedit " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _eval_progress(stack, label: str):
    """progress(done, total) -> a click progress bar on stderr, opened at the first call."""
    bar = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = stack.enter_context(click.progressbar(length=total, label=label, file=sys.stderr))
        bar.update(done - bar.pos)

    return update


def _eval_print(obj, as_json: bool, text: str) -> None:
    import json

    click.echo(json.dumps(obj, indent=2, sort_keys=True) if as_json else text)


def _eval_config(**kw):
    from evals.evaluate import ScoreConfig

    try:
        return ScoreConfig(**kw)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@eval_.command("register")
@click.argument("protocol", type=click.Path(dir_okay=False, exists=True))
@_WORKSPACE
@_JSON
def eval_register(protocol, workspace, as_json):
    """Record PROTOCOL's sha256 (and its traces' dump hashes) in the ledger."""
    from evals import workflow

    r = workflow.register(protocol, workspace, _eval_command_line())
    obj = {"name": r.record.name, "sha256": r.record.sha256, "entry": r.record.seq, "traces": dict(r.trace_sha256)}
    _eval_print(obj, as_json, f"registered protocol {r.record.name!r} sha256 {r.record.sha256} "
                f"(ledger entry {r.record.seq}, {len(r.trace_sha256)} traces)")


@eval_.command("split")
@click.option("--protocol", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--unregistered", is_flag=True, help="Allow an unregistered or changed protocol (marked).")
@_WORKSPACE
@_JSON
def eval_split(protocol, unregistered, workspace, as_json):
    """Split the traces' documents into train / dev / test by the protocol's rule; record it."""
    from evals import workflow

    r = workflow.split(protocol, workspace, _eval_command_line(), unregistered)
    docs = [{"trace": d.trace, "doc": d.doc, "group": d.group, "role": d.role} for d in r.splits.docs]
    lines = ([r.record.marker] if r.record.marker else []) + [f"split {r.splits.sha256}: {r.splits.counts()}"]
    lines += [f"  {d['role']:<10} {d['trace']}/{d['doc']}  ({d['group']})" for d in docs]
    _eval_print({"sha256": r.splits.sha256, "marker": r.record.marker, "docs": docs}, as_json, "\n".join(lines))


@eval_.command("score")
@click.option("--protocol", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--bundle", type=click.Path(file_okay=False, exists=True), help="A solver's bundle directory.")
@click.option("--edited", type=click.Path(dir_okay=False, exists=True), help="An edited GGUF instead of a bundle.")
@click.option("--shape", "shapes", multiple=True,
              help="Sampler rule scored as an edit: prefix-penalty=B, step0-guard=B, persona-case (repeatable).")
@click.option("--bars", type=click.Choice(["anti-slop", "persona", "all"]), default="anti-slop", show_default=True)
@click.option("--persona-tag", default="style", show_default=True, help="Document tag that activates the persona.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Directory for dev-report.*")
@click.option("--unregistered", is_flag=True, help="Allow an unregistered or changed protocol (marked).")
@_WORKSPACE
@_JSON
def eval_score(protocol, model, bundle, edited, shapes, bars, persona_tag, out, unregistered, workspace, as_json):
    """Dev bars of MODEL + a bundle / edited GGUF / shaping rules; the report is recorded."""
    import contextlib

    from evals import workflow
    from evals.report import format_table, report_to_json

    config = _eval_config(heldout_role="dev", bars=bars, shapes=tuple(shapes), persona_tag=persona_tag)
    with contextlib.ExitStack() as stack:
        r = workflow.score(protocol, workspace, model, out, _eval_command_line(), bundle=bundle, edited=edited,
                           config=config, unregistered=unregistered, progress=_eval_progress(stack, "scoring"))
    files = {k: str(v) for k, v in r.files.paths.items()}
    _eval_print({**report_to_json(r.report), "files": files, "entry": r.seq}, as_json,
                format_table(r.report) + f"\nwrote {files['json']} (ledger entry {r.seq})")


@eval_.command("test")
@click.option("--protocol", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--bundle", required=True, type=click.Path(file_okay=False, exists=True))
@click.option("--bars", type=click.Choice(["anti-slop", "persona", "all"]), default="anti-slop", show_default=True)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Directory for test-report.*")
@click.option("--unregistered", is_flag=True, help="Allow an unregistered or changed protocol (marked).")
@_WORKSPACE
@_JSON
def eval_test(protocol, model, bundle, bars, out, unregistered, workspace, as_json):
    """Score the test split of BUNDLE, once. A repeat prints the recorded result and fails."""
    import contextlib

    from evals import workflow
    from evals.ledger import LedgerRefusal
    from evals.report import format_table, report_from_json, report_to_json

    config = _eval_config(heldout_role="test", bars=bars)
    try:
        with contextlib.ExitStack() as stack:
            r = workflow.score_test(protocol, workspace, model, bundle, out, _eval_command_line(), config=config,
                                    unregistered=unregistered, progress=_eval_progress(stack, "scoring test"))
    except LedgerRefusal as exc:
        if exc.recorded is not None:
            _eval_print(exc.recorded, as_json, "recorded test result:\n" + format_table(report_from_json(exc.recorded)))
        raise
    _eval_print({**report_to_json(r.report), "entry": r.seq}, as_json,
                format_table(r.report) + f"\nrecorded as ledger entry {r.seq}")


@eval_.command("blind")
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--bundle", required=True, type=click.Path(file_okay=False, exists=True))
@click.option("--doc", required=True, type=click.Path(file_okay=False, exists=True), help="The fresh document's dump.")
@click.option("--dev-report", required=True, type=click.Path(dir_okay=False, exists=True),
              help="dev-report.json written by `eval score` for this bundle.")
@click.option("--protocol", type=click.Path(dir_okay=False, exists=True),
              help="Default: the protocol the dev report names.")
@click.option("--out", type=click.Path(file_okay=False), help="Directory for signoff.* (default WORKSPACE/blind).")
@_WORKSPACE
@_JSON
def eval_blind(model, bundle, doc, dev_report, protocol, out, workspace, as_json):
    """The one-shot blind sign-off of BUNDLE on DOC; a second run is refused and recorded."""
    import contextlib
    from pathlib import Path

    from evals import workflow
    from evals.report import format_table, report_to_json

    out = out or str(Path(workspace) / "blind")
    with contextlib.ExitStack() as stack:
        r = workflow.blind(model, bundle, doc, dev_report, workspace, out, _eval_command_line(),
                           protocol_path=protocol, progress=_eval_progress(stack, "blind run"))
    comps = [c.__dict__ for c in r.comparisons]
    lines = [format_table(r.report), "against the dev report:"]
    lines += [f"  {c.metric:<36} dev {c.dev:.4g}  blind {c.blind:.4g}  bound {c.op} {c.allowed:.4g}  "
              f"{'pass' if c.passed else 'FAIL'}" for c in r.comparisons]
    lines.append(f"SIGN-OFF: {'PASS' if r.passed else 'FAIL'}  (wrote {r.files.paths['md']})")
    _eval_print({"passed": r.passed, "comparisons": comps, "report": report_to_json(r.report),
                 "files": {k: str(v) for k, v in r.files.paths.items()}}, as_json, "\n".join(lines))


@eval_.command("ledger")
@click.option("--verify", "check", is_flag=True, help="Check the hash chain; exit non-zero naming the first bad entry.")
@_WORKSPACE
@_JSON
def eval_ledger(check, workspace, as_json):
    """List the ledger's entries, or verify its hash chain."""
    from evals.ledger import Ledger

    with Ledger.open(workspace) as ledger:
        if check:
            c = ledger.verify()
            _eval_print(c.__dict__, as_json, f"ledger {ledger.path}: {c.entries} entries, "
                        + ("hash chain intact" if c.ok else f"BROKEN at entry {c.first_bad}: {c.reason}"))
            if not c.ok:
                sys.exit(1)
            return
        entries = ledger.entries()
    rows = [{"seq": e.seq, "time": e.time, "kind": e.kind, "command": e.command} for e in entries]
    _eval_print(rows, as_json, "\n".join(f"{e['seq']:>4}  {e['time']}  {e['kind']:<12} {e['command']}" for e in rows))

# ---- end section: evals ----------------------------------------------------------------------

# ---- section: solve head + apply -------------------------------------------------------------

# ---- end section: solve head -----------------------------------------------------------------

# ---- section: solve wfld ---------------------------------------------------------------------

# ---- end section: solve wfld -----------------------------------------------------------------


if __name__ == "__main__":
    sys.exit(main())
