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

# ---- end section: evals ----------------------------------------------------------------------

# ---- section: solve head + apply -------------------------------------------------------------

# ---- end section: solve head -----------------------------------------------------------------

# ---- section: solve wfld ---------------------------------------------------------------------

# ---- end section: solve wfld -----------------------------------------------------------------


if __name__ == "__main__":
    sys.exit(main())
