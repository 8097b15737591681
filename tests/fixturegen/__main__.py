"""`python -m tests.fixturegen --out DIR [--seed N] [--force] [--json]`: build the fixture in DIR.
Exits 1 when a planted property does not hold."""
from __future__ import annotations

import contextlib
import json
import sys

import click

from exactedit.cli import _progress
from exactedit.errors import ExacteditError
from tests.fixturegen.make import make_fixture
from tests.fixturegen.readme import render_result


@click.command()
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0), help="Random seed.")
@click.option("--force", is_flag=True, help="Replace the fixture files DIR already holds.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def main(out, seed, force, as_json) -> None:
    """Build the tiny hc4 model, its dumps, phrases.txt, planted.json and README.md in DIR."""
    with contextlib.ExitStack() as stack:
        try:
            result = make_fixture(out, seed, progress=_progress(stack, "building"), overwrite=force)
        except ExacteditError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(result.to_json(), indent=1) if as_json else render_result(result))
    if not result.ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
