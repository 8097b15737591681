"""exactedit command line: parses flags, builds configs, calls one library function, reports.

This module only wires. Library code never imports click and never prints; domain errors
(`ExacteditError` subclasses) become click errors in `main` below, in one place. Results are printed
by `emit` alone (the library's text, or its JSON with --json). The commands are in `--help`'s order:
the top-level ones, then each group's. Imports of the library stay inside the commands, through the
packages' faces, so that starting the CLI imports neither numba nor JAX.
"""
from __future__ import annotations

import contextlib
import json
import sys

import click


class _Group(click.Group):
    """Turns the library's domain errors and the operating system's (a missing directory, no
    permission, a full disk) into clean click errors naming the path (one line, exit code 1)."""

    def invoke(self, ctx):
        from exactedit.errors import ExacteditError

        try:
            return super().invoke(ctx)
        except ExacteditError as exc:
            raise click.ClickException(str(exc)) from exc
        except OSError as exc:
            raise click.ClickException(_os_error(exc)) from exc


def _os_error(exc: OSError) -> str:
    """`PATH: reason` (`PATH -> PATH2` for a rename) from an OSError."""
    where = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
    why = exc.strerror or str(exc)
    return f"{where}: {why}" if where else why


def _progress(stack, label: str):
    """progress(done, total) for the library -> a click progress bar on stderr, opened at the
    first call and closed with `stack`."""
    bar = None
    if not sys.stderr.isatty():      # a log file: a line per tenth of the work (click draws nothing there)
        import time

        shown = [None]           # the last tenth printed
        start = time.monotonic()

        def line(done: int, total: int) -> None:
            tenth = (10 * done) // max(total, 1)
            if tenth != shown[0]:
                shown[0] = tenth
                spent = time.monotonic() - start
                left = f", about {spent * (total - done) / done:.0f} s left" if 0 < done < total and spent > 1 else ""
                click.echo(f"{label}: {done}/{total}{left}", err=True)

        return line

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = stack.enter_context(click.progressbar(length=total, label=label, file=sys.stderr))
        bar.update(max(done - bar.pos, 0))

    return update


def with_progress(label: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) with `progress=` a bar labelled `label`, closed when fn returns or raises."""
    with contextlib.ExitStack() as stack:
        return fn(*args, progress=_progress(stack, label), **kwargs)


@contextlib.contextmanager
def _bad_parameter():
    """A ValueError from a config's validation (or from parsing a flag) -> a click usage error."""
    try:
        yield
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _floats(text: str, flag: str) -> tuple[float, ...]:
    """'1,0.7,0.5' -> (1.0, 0.7, 0.5); '' -> ()."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected numbers separated by commas") from None


# ---- output: every result goes through emit ------------------------------------------------------

def emit(obj, text: str, as_json: bool, *, allow_nan: bool = True) -> None:
    """Print a result: with --json its JSON (`obj.to_dict()`, or `obj` itself where the library built
    the JSON value), else `text` (made by the library's render function)."""
    if as_json:
        obj = obj.to_dict() if hasattr(obj, "to_dict") else obj
        click.echo(json.dumps(obj, indent=1, allow_nan=allow_nan))
    else:
        click.echo(text)


def emit_json_file(result, text: str, json_out: str | None) -> None:
    """Print a JSON_FILE command's result: '-' prints its JSON alone; with a path, its text, the JSON
    written there (temporary name, fsync, rename) and a line naming the file and its sha256."""
    import hashlib

    if json_out == "-":
        emit(result, text, as_json=True)
        return
    if json_out:
        from exactedit.files import atomic_write_text

        data = json.dumps(result.to_dict(), indent=1) + "\n"
        atomic_write_text(json_out, data)
        text += f"\nwrote {json_out} (sha256 {hashlib.sha256(data.encode()).hexdigest()[:16]})"
    emit(result, text, as_json=False)


def _refuse_clobber(outputs: dict, inputs: dict, *, holds_inputs: bool = False) -> None:
    """Refuse outputs that would overwrite an input, for the commands whose library function does not
    know its inputs (files.refuse_clobber; apply, logits and kld check in the library)."""
    from exactedit.files import refuse_clobber as refuse

    refuse(outputs, inputs, holds_inputs=holds_inputs)


def _existing(path):
    """A model flag's value when it names a file (not a public model's name), else None."""
    import os

    return path if path is not None and os.path.exists(path) else None


def command_line() -> str:
    """The command line as run, shell-quoted (recorded in ledgers, bundles and blind.cmd)."""
    import shlex

    return "exactedit " + " ".join(shlex.quote(a) for a in sys.argv[1:])


# ---- flags shared by several commands (declared once) --------------------------------------------

class ModelPath(click.ParamType):
    """A GGUF path, or a public model's name (qwen, gemma, smollm), resolved once to the GGUF's path
    (native.llamacpp.locate: a public model is assembled from its installed packages on first use)."""

    name = "text"                    # --help shows TEXT, as it did before this type

    def convert(self, value, param, ctx):
        if ctx is not None and ctx.resilient_parsing:      # shell completion: assemble nothing
            return value
        from exactedit.native.llamacpp import locate

        return locate(value)


MODEL = ModelPath()
JSON_FLAG = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of a table.")
JSON_FILE = click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False),
                         help="Also write the result as JSON here ('-' for stdout only).")
_CHAT_FALLBACK = click.option(
    "--chat-fallback", type=click.Choice(["chatml"]), default=None,
    help="The framing to use when the model's chat template is refused or fails (recorded in the dump's "
         "manifest); without it such a template stops the command.")
_CHAT_TEMPLATE = click.option(
    "--chat-template", "chat_template", type=click.Path(dir_okay=False, exists=True), default=None,
    help="A Jinja2 chat template file to render chat with, for a model whose GGUF has none (Gemma 3 270M); "
         "it wins over the GGUF's own when both exist. Rendered in the same sandbox; the turn framing, the "
         "turn end and the specials are read off it (framing 'user:FILE' in the dump's manifest).")


TILE_ROWS = click.option("--tile-rows", default=8192, show_default=True, type=click.IntRange(1),
                         help="Head rows per tile.")
_WORKSPACE = click.option("--workspace", type=click.Path(file_okay=False), default=".exactedit", show_default=True,
                          help="Directory holding this project's ledger.")
_DUMP = click.Path(file_okay=False, exists=True)


def _options(*opts):
    """One decorator for several click options, listed by --help in the order given."""
    def apply(f):
        for opt in reversed(opts):
            f = opt(f)
        return f
    return apply


# llama.cpp evaluation flags, mapping 1:1 to native.llamacpp.EngineSettings (see _settings)
_engine_settings = _options(
    click.option("--n-ctx", default=2048, show_default=True, type=click.IntRange(1), help="Context size."),
    click.option("--n-batch", default=512, show_default=True, type=click.IntRange(1),
                 help="Tokens per llama_decode call (1 = token by token)."),
    click.option("--n-ubatch", default=512, show_default=True, type=click.IntRange(1),
                 help="Micro-batch the graph runs with (<= n-batch)."),
    click.option("--threads", "n_threads", default=2, show_default=True, type=click.IntRange(1)),
    click.option("--flash-attn", type=click.Choice(["off", "on"]), default="off", show_default=True),
    click.option("--gpu-layers", "n_gpu_layers", default=None, type=click.IntRange(-1), metavar="N",
                 help="Layers offloaded to a GPU backend, -1: all, 0: none (default: all when llama-cpp-python was "
                      "built with a GPU backend, else 0). Live verification is bit-exact with 0 (the CPU backend)."),
)
_GPU_LAYERS = click.option(
    "--gpu-layers", "n_gpu_layers", default=None, type=click.IntRange(-1), metavar="N",
    help="The engine's layers offloaded to a GPU backend, -1: all, 0: none (default: all when llama-cpp-python was "
         "built with a GPU backend, else 0).")

# document labels, mapping 1:1 to the library's tags / source / character
_labels = _options(
    click.option("--tag", "tags", multiple=True,
                 help="Tag every document (repeatable), e.g. anchor, collateral, slop, blind."),
    click.option("--source", default=None, help="Document source (what splits group by)."),
    click.option("--character", default=None, help="Document character (what splits group by)."),
)

# sampling, mapping to native.llamacpp.Sampling (see _gen_config) and the seeds
_gen_options = _options(
    click.option("--max-new", default=64, show_default=True, type=click.IntRange(1), help="Tokens per reply (cap)."),
    click.option("--temperature", default=0.8, show_default=True, type=float),
    click.option("--top-k", default=40, show_default=True, type=click.IntRange(1)),
    click.option("--seed", "seeds", multiple=True, type=int, help="Sample seed (repeatable; default 0)."),
)

# what `verify live` and `verify engine` accept, mapping 1:1 to native.verify.Tolerance
_tolerance = _options(
    click.option("--kl-mean", default=1e-8, show_default=True, type=float),
    click.option("--kl-max", default=1e-5, show_default=True, type=float),
    click.option("--top1", default=1.0, show_default=True, type=float),
    click.option("--max-abs-rel", default=1e-4, show_default=True, type=float),
)


def _settings(n_ctx, n_batch, n_ubatch, n_threads, flash_attn, n_gpu_layers=None):
    """The engine's settings; --gpu-layers not given: all layers with a GPU backend, else 0."""
    from exactedit.native.llamacpp import EngineSettings, default_gpu_layers

    return EngineSettings(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads,
                          flash_attn=flash_attn,
                          n_gpu_layers=default_gpu_layers() if n_gpu_layers is None else n_gpu_layers)


def _gen_config(max_new, temperature, top_k):
    from exactedit.native.llamacpp import Sampling

    return Sampling(max_new=max_new, temperature=temperature, top_k=top_k)


def _tolerance_of(kl_mean, kl_max, top1, max_abs_rel):
    from exactedit.native.verify import Tolerance

    return Tolerance(kl_mean=kl_mean, kl_max=kl_max, top1=top1, max_abs_rel=max_abs_rel)


def _lines(path) -> list[str]:
    """A one-per-line file (prompts): bounded, a regular file, UTF-8 (runs.loop.inputs.lines)."""
    from exactedit.runs import read_lines

    return list(read_lines(path))


def _phrases(path, top: int | None = None, kind: str = "style") -> list[str]:
    """A phrases file: one phrase per line, or `exactedit discover`'s JSON (its first `top` usable
    phrases of `kind`, each at its measured ban point)."""
    from exactedit.solvers import load_phrases

    return list(load_phrases(path, top, kind))


def _check_kind(ctx, param, value):
    """--kind: discover's entry kinds (style, mixed, topic, comma-separated, or any)."""
    from exactedit.solvers import kinds_of

    if value is not None:
        try:
            kinds_of(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


_TOP = click.option("--top", type=click.IntRange(1), default=None,
                    help="With --phrases from `exactedit discover` (JSON): its first N usable phrases.")
_KIND_HELP = ("With --phrases from `exactedit discover` (JSON): the entries of this kind: style, mixed, topic, "
              "several comma-separated, or any (topic phrases are the prompts' subject)")
_KIND = click.option("--kind", default="style", show_default=True, callback=_check_kind, help=_KIND_HELP + ".")
_RULES_MODE_HELP = ("How the rules' banned phrases are kept out: penalty (the prefix penalty on the phrase's last "
                    "token) or rewind (as well, a phrase or a case / spacing / quote variant of it that completes is "
                    "rolled back to its first token and resampled with that token banned there; docs/shaping.md)")
_RULES_MODE = click.option("--rules-mode", type=click.Choice(["penalty", "rewind"]), default="penalty",
                           show_default=True, help=_RULES_MODE_HELP + ".")


def _read_tokens_arg(tokens, text, model_path):
    """Token ids from --tokens (int32 file, the engine contract's layout) or --text (tokenized), each
    read bounded (a regular file, capped: a FIFO or a device is refused naming the flag) before the
    model loads."""
    from exactedit.dumps import read_tokens
    from exactedit.errors import FieldError
    from exactedit.files import MAX_TEXT_BYTES, read_utf8
    from exactedit.native.llamacpp import LlamaEngine

    if (tokens is None) == (text is None):
        raise click.UsageError("give exactly one of --tokens FILE (int32 ids) and --text FILE")
    if tokens is not None:
        return read_tokens(tokens, field="--tokens")
    body = read_utf8(text, MAX_TEXT_BYTES, FieldError, "--text")
    with LlamaEngine(model_path) as engine:
        toks = engine.tokenize(body)
    if len(toks) == 0:          # an empty file was refused as the model's "tokens", not named
        raise FieldError(text, "--text", "no tokens (an empty text): give a text to run on")
    return toks


def _head_tokens(values) -> tuple:
    """Token flags: the token's text as the model's table decodes it, or #ID for an id."""
    return tuple(int(v[1:]) if v.startswith("#") and v[1:].isdigit() else v for v in values)


@click.group(cls=_Group)
@click.version_option(package_name="exactedit")
@click.option("--jax-cache", default=None, metavar="DIR|off",
              help="JAX's persistent compilation cache: a directory, or off (default: "
                   "~/.cache/exactedit/jax; the same as EXACTEDIT_JAX_CACHE).")
def main(jax_cache) -> None:
    """Exact offline edits of a GGUF model's output head and last layer."""
    if jax_cache is not None:
        import os

        os.environ["EXACTEDIT_JAX_CACHE"] = jax_cache


# ---- top-level commands: apply, demo, discover, generate, inspect, kld, logits, mine, serve, untie

@main.command("apply")
@click.argument("bundle", type=click.Path(file_okay=False, exists=True))
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True), help="The base GGUF.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The edited GGUF to write.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@JSON_FLAG
def apply_cmd(bundle, model, out, overwrite, as_json) -> None:
    """Write BUNDLE's edits into a copy of MODEL (every other byte kept)."""
    from exactedit.solvers import apply_bundle, render_apply

    r = with_progress("apply", apply_bundle, bundle, model, out, overwrite=overwrite)
    emit(r, render_apply(r), as_json)


def _loop_options(demo: bool):
    """The options `antislop` and `demo --model` share (the same run; demo's defaults are the
    bundled model's). `demo`: the help says they apply with --model."""
    h = (lambda text: "With --model: " + text) if demo else (lambda text: text[:1].upper() + text[1:])
    dflt = (lambda bundled: f" (default: {bundled})") if demo else (lambda bundled: "")
    given = (lambda bundled: f" (default: {bundled})")
    opts = [
        click.option("--phrases", type=click.Path(dir_okay=False, exists=True), default=None,
                     help=h("banned phrases, one per line, or discover's JSON with --top" + dflt("the bundled ones")
                     + ("" if demo else " [required]") + ".")),
        _TOP,
        click.option("--kind", default=None, callback=_check_kind,
                     help=h("of discover's JSON given as --phrases, the entries of this kind: style, mixed, topic, "
                     "several comma-separated, or any (topic phrases are the prompts' subject)" + given("style") + ".")),
        click.option("--prompts", type=click.Path(dir_okay=False, exists=True), default=None,
                     help=h("prompts, one per line, whose replies build the solve's data" + dflt("bundled")
                     + ("" if demo else " [required]") + ".")),
        click.option("--rate-prompts", type=click.Path(dir_okay=False, exists=True), default=None,
                     help=h("held-out prompts, one per line, for the phrase rates in free generation (none may be "
                     "a data prompt)" + dflt("bundled") + ("" if demo else " [required]") + ".")),
        click.option("--watch", type=click.Path(dir_okay=False, exists=True), default=None,
                     help=h("phrases measured in generation beside the solved ones, not solved for (e.g. the whole "
                     "phrase whose prefix is banned)" + dflt("the bundled watch list") + ".")),
        click.option("--texts", multiple=True, type=click.Path(exists=True),
                     help=h("plain texts for collateral, the null space and anchors: a .txt file or a directory "
                     "of them (repeatable)"
                     + dflt("bundled") + ".")),
        click.option("--same-sense", "same_sense", type=click.Path(dir_okay=False, exists=True), default=None,
                     help=h("PHRASE=WORD[,WORD] per line, paraphrases of a phrase's final token that the solve "
                     "holds with it" + dflt("the bundled list, if any") + ".")),
        click.option("--chat-template", "chat_template", type=click.Path(dir_okay=False, exists=True), default=None,
                     help=h("a Jinja2 chat template file, used instead of the GGUF's own"
                     + (" (default: the bundled chat_template.jinja for a model whose file has none, e.g. gemma)"
                        if demo else "; needed for a GGUF without one") + ".")),
        click.option("--samples", default=None, type=click.IntRange(1),
                     help=h("replies per data prompt" + given("the model's, 2") + ".")),
        click.option("--rate-samples", default=None, type=click.IntRange(1),
                     help=h("replies per held-out rate prompt" + given("the model's, 2") + ".")),
        click.option("--max-new", default=None, type=click.IntRange(1),
                     help=h("reply cap in tokens" + given("the model's, 160") + ".")),
        click.option("--seed", default=0, show_default=True, type=int,
                     help=h("sampling seed, >= 0: reply i of a data prompt has seed + i, of a rate prompt "
                     "seed + 10000 + i, each a seed of llama.cpp's 32-bit sampler (at most 4294967294; -1, its "
                     "'random', is refused: a run reproduces).")),
        click.option("--ridge", default=None, type=float,
                     help=h("solve wfld's background ridge" + given("0.01, chosen on dev: docs/real-model.md") + ".")),
        click.option("--corpus-tokens", type=click.IntRange(0), default=None,
                     help=h("prefill budget of the teacher-forced corpus windows (dataset corpus); 0: none"
                     + given("12,000; docs/real-model.md") + ".")),
        click.option("--key", type=click.Choice(["dense", "discriminative", "units", "gated", "auto"]), default=None,
                     help=h("solve wfld --key" + given("dense, chosen on dev") + ".")),
        click.option("--word-holds", type=click.IntRange(0), default=None,
                     help=h("solve wfld --word-holds" + given("2000, chosen on dev") + ".")),
        click.option("--strength-grid", default=None, metavar="S,S,...",
                     help=h("solve wfld --strength-grid ('' for a fixed strength 1)" + given("1,0.8,0.6,0.45,0.3,0.2")
                     + ".")),
        click.option("--gated-headroom", "gated_headroom", default=None, type=float, metavar="H",
                     help=h("with the gated key: the rewritten units' activation at their contexts, in multiples of "
                     "the model's 99.9th percentile of |hh| (a larger one needs a smaller down column, whose "
                     "entries ffn_down's block scales bound)" + given("4") + ".")),
        click.option("--rules-bias", default=None, type=float,
                     help=h("the shipped rules' prefix penalty in nats (shape compile --bias), > 0 and a number "
                     "float32 holds exactly, e.g. 6 or 6.5" + given("6") + ".")),
        click.option("--rules-mode", type=click.Choice(["penalty", "rewind"]), default=None,
                     help=h("the rates stage's arms with rules: " + _RULES_MODE_HELP[:1].lower() + _RULES_MODE_HELP[1:]
                     + given("penalty") + ".")),
        click.option("--gpu-layers", "gpu_layers", default=None, type=click.IntRange(-1), metavar="N",
                     help=h("the engine's layers offloaded to a GPU backend in the data, corpus and rates stages, -1: "
                     "all, 0: none; verify live runs on the CPU backend, where it is bit-exact"
                     + given("all when llama-cpp-python was built with a GPU backend, else 0") + ".")),
    ]

    def wrap(f):
        for o in reversed(opts):
            f = o(f)
        return f
    return wrap


def _loop_inputs(given: dict) -> dict:
    """The input files among the shared options, by flag (what --out must not overwrite)."""
    return {f"--{k.replace('_', '-')}": given[k] for k in ("phrases", "prompts", "rate_prompts", "watch", "texts",
                                                          "same_sense", "chat_template")}


def _loop(model: str, out: str, given: dict, stack, demo: bool):
    """Run (or continue) `exactedit antislop` for `model` into `out` with the shared options `given`."""
    from exactedit.runs import AntislopConfig, run_antislop

    model = str(model)
    bars: dict = {}

    def progress(label: str, done: int, total: int) -> None:
        bars.setdefault(label, _progress(stack, label))(done, total)

    given = dict(given)
    with _bad_parameter():
        if given["strength_grid"] is not None:
            given["strength_grid"] = _floats(given["strength_grid"], "--strength-grid")
    given["texts"] = tuple(given["texts"]) or None
    if not demo:
        missing = [f"--{k.replace('_', '-')}" for k in ("prompts", "phrases", "rate_prompts") if given[k] is None]
        bundled = AntislopConfig(model=model).bundled
        if missing and bundled is None:
            raise click.UsageError(f"give {', '.join(missing)} (only a public model with bundled inputs has defaults: "
                                   "`exactedit demo --model NAME`)")
    cfg = AntislopConfig.for_model(model, **given)
    return run_antislop(cfg, out, progress=progress, command=command_line())


@main.command("antislop")
@click.option("--model", required=True, type=MODEL, help="The GGUF to edit: a path, or a public model name.")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="The run's directory: new, or an earlier run's to continue it (stages whose inputs are unchanged "
                   "are kept; the others are redone).")
@_loop_options(demo=False)
@JSON_FLAG
def antislop_cmd(model, out, as_json, **given) -> None:
    """The whole anti-slop loop on your GGUF: data from its own replies, protocol, solve wfld, apply,
    verify live, dev score, sampler rules compiled for it, phrase rates on held-out prompts in four
    arms (base, rules, weights, both), the cost on ordinary text. Ships OUT/edited.gguf and
    OUT/rules.json side by side, with OUT/report.md, report.json and PNGs (docs/antislop.md)."""
    _refuse_clobber({"--out": out}, {"--model": _existing(model), **_loop_inputs(given)})
    with contextlib.ExitStack() as stack:
        result = _loop(model, out, given, stack, demo=False)
    emit(result.report, result.text, as_json)
    if not result.verified:
        sys.exit(1)


def _persona(model: str, out: str, given: dict, stack):
    """Run (or continue) `exactedit persona` for `model` into `out`."""
    from exactedit.runs import PersonaConfig, run_persona

    bars: dict = {}

    def progress(label: str, done: int, total: int) -> None:
        bars.setdefault(label, _progress(stack, label))(done, total)

    given = dict(given)
    system_file = given.pop("system_file", None)
    if system_file is not None:
        if given.get("system") is not None:
            raise click.UsageError("give --system or --system-file, not both")
        with _bad_parameter():
            given["system"] = _read_bounded_text(system_file, "--system-file")
    given["texts"] = tuple(given.get("texts") or ()) or None
    cfg = PersonaConfig.for_model(str(model), **given)
    return run_persona(cfg, out, progress=progress, command=command_line())


def _read_bounded_text(path, flag: str) -> str:
    """A persona prompt file: a regular file (a FIFO or a device is refused, not waited on) of at most
    4 * MAX_SYSTEM_CHARS bytes, UTF-8 (else InputError naming the file and `flag`), of 1 to
    MAX_SYSTEM_CHARS characters."""
    from exactedit.files import decode_utf8, read_regular
    from exactedit.runs import MAX_SYSTEM_CHARS, InputError

    data = read_regular(path, 4 * MAX_SYSTEM_CHARS, InputError, flag)
    text = decode_utf8(data, path, InputError, flag).strip()
    if not text or len(text) > MAX_SYSTEM_CHARS:
        raise click.BadParameter(f"{path}: the persona prompt must be 1 to {MAX_SYSTEM_CHARS} characters",
                                 param_hint=flag)
    return text


@main.command("persona")
@click.option("--model", required=True, type=MODEL, help="The GGUF to edit (untied output.weight): a path, or a "
              "public model name.")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="The run's directory: new, or an earlier run's to continue it.")
@click.option("--system", default=None, help="The persona's system prompt [this or --system-file].")
@click.option("--system-file", "system_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A file holding the persona's system prompt.")
@click.option("--style", default=None, metavar="SPEC",
              help="What the persona shows: starter:TEXT, signoff:TEXT, kaomoji or lowercase [required].")
@click.option("--prompts", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Prompts, one per line, split train / dev / test by prompt [required].")
@click.option("--rate-prompts", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Held-out prompts, one per line, for the style rates in free generation [required].")
@click.option("--texts", multiple=True, type=click.Path(exists=True),
              help="Plain texts, a .txt file or a directory of them: half anchor the solve, half measure its "
                   "cost (repeatable).")
@click.option("--chat-template", "chat_template", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A Jinja2 chat template file, used instead of the GGUF's own.")
@click.option("--samples", default=None, type=click.IntRange(1), help="Replies per data prompt and side (default 1).")
@click.option("--rate-samples", default=None, type=click.IntRange(1), help="Replies per rate prompt and side (default 2).")
@click.option("--max-new", default=None, type=click.IntRange(1), help="Reply cap in tokens (default 128).")
@click.option("--seed", default=None, type=int,
              help="Sampling and split seed (default 0): reply i has seed + i (rate replies seed + 10000 + i), each "
                   "within llama.cpp's 32-bit seeds (-1, its 'random', is refused).")
@click.option("--edit-count", default=None, type=click.IntRange(1),
              help="|S|: the train split's most frequent initiation tokens (default 1, at most 1024 and the "
                   "model's vocabulary).")
@click.option("--rank", default=None, type=click.IntRange(1),
              help="solve head --rank (default 1, at most --edit-count and the model's width).")
@click.option("--lr", default=None, type=click.FloatRange(min=0, min_open=True), help="Adam step size (default 1e-3).")
@click.option("--max-steps", default=None, type=click.IntRange(1), help="The stopping rule's step budget (default 300).")
@click.option("--hold", type=click.Choice(["none", "paragraph"]), default=None,
              help="Anchor rows held in the solve's KL term besides the prompts (default none; paragraph: the "
                   "paragraph starts after a blank line in the plain replies and texts).")
@click.option("--watch-kl/--no-watch-kl", "watch_kl", default=None,
              help="The stopping rule also stops where the dev KL off the style's decision rows passes the bar "
                   "(default off).")
@click.option("--edit", type=click.Choice(["head", "gated"]), default=None,
              help="head: a rank-r edit of the output rows (default); gated: one rewritten unit of the last FFN "
                   "that fires at the style's decision rows only, its strength chosen on dev within the KL bar "
                   "off those rows (docs/solve-head.md).")
@click.option("--device", type=click.Choice(["auto", "cpu", "gpu"]), default=None, help="Where the solve's passes run.")
@JSON_FLAG
def persona_cmd(model, out, as_json, **given) -> None:
    """A persona's style distilled into the output head: the model's own replies with the persona's
    system prompt (chosen) and without it (reference), split by prompt; the style's initiation
    token as the edit set; solve head --rank 1 under a registered protocol (test once), or with
    --edit gated one unit of the last FFN that fires at the reply start only; apply, verify
    live; the style rate in free generation WITHOUT the persona prompt on held-out prompts, base vs
    edited; the cost on ordinary text. OUT/report.md, report.json, style-rates.png
    (docs/solve-head.md)."""
    inputs = {"--model": _existing(model), **{f"--{k.replace('_', '-')}": given[k]
                                              for k in ("prompts", "rate_prompts", "texts", "chat_template", "system_file")}}
    _refuse_clobber({"--out": out}, inputs)
    with contextlib.ExitStack() as stack:
        result = _persona(model, out, given, stack)
    emit(result.report, result.text, as_json)
    if result.shipped and not result.records["verify"]["passed"]:
        sys.exit(1)


@main.command("demo")
@click.option("--out", default="demo-out", show_default=True, type=click.Path(file_okay=False),
              help="New directory for the demo's bundles, reports and workspace (with --model: an earlier run's "
                   "to continue it).")
@click.option("--fixture", type=click.Path(file_okay=False, exists=True), default=None,
              help="Fixture directory (default: the bundled fixtures/default).")
@click.option("--model", default=None,
              help="Run the real-model loop instead (`exactedit antislop` with the model's bundled inputs and "
                   "settings, runs/bundled/NAME/antislop/), on this public model (qwen, gemma) through llama.cpp.")
@click.option("--persona", is_flag=True, default=False,
              help="With --model: the persona run instead (`exactedit persona` with the model's bundled persona, "
                   "style and prompts, runs/bundled/NAME/persona/persona.toml).")
@_loop_options(demo=True)
@JSON_FLAG
def demo_cmd(out, fixture, model, persona, as_json, **given) -> None:
    """The whole workflow on the bundled fixture: register + split, solve head, solve wfld, dev
    score, and the one-shot blind sign-off (its command line in OUT/blind.cmd). With --model:
    `exactedit antislop` on a real model with its bundled inputs (data from its own replies, solve,
    apply, verify live, dev score, rules, phrase rates on held-out prompts in four arms, cost;
    OUT/report.md, report.json and PNGs)."""
    _refuse_clobber({"--out": out}, {"--fixture": fixture, "--model": _existing(model), **_loop_inputs(given)})
    if persona and model is None:
        raise click.UsageError("--persona needs --model (e.g. --model qwen)")
    if persona:
        extra = [f"--{k.replace('_', '-')}" for k, v in given.items() if k != "seed" and v not in (None, ())]
        if extra:
            raise click.UsageError(f"{', '.join(extra)}: the anti-slop loop's options do not apply with --persona "
                                   "(give your own persona inputs to `exactedit persona`)")
    with contextlib.ExitStack() as stack:
        if persona:
            result = _persona(model, out, {"seed": given["seed"] or None}, stack)
            emit(result.report, result.text, as_json)
            if result.shipped and not result.records["verify"]["passed"]:
                sys.exit(1)
            return
        if model is not None:
            result = _loop(model, out, given, stack, demo=True)
            emit(result.report, result.text, as_json)
            if not result.verified:
                sys.exit(1)
            return
        bars: dict = {}

        def progress(label: str, done: int, total: int) -> None:
            bars.setdefault(label, _progress(stack, label))(done, total)

        from exactedit.runs import DEFAULT_FIXTURE, demo_report, run_demo

        report = demo_report(run_demo(out, fixture=fixture or DEFAULT_FIXTURE, progress=progress))
    emit(*report, as_json)


@main.command("discover")
@click.option("--model-text", "model_text", required=True, multiple=True, type=click.Path(exists=True),
              help="The model's text: replies JSON, chat transcripts (.jsonl: OpenAI, ShareGPT, Claude Code), .txt / "
                   ".md files, or directories of them (repeatable).")
@click.option("--human", required=True, multiple=True, type=click.Path(exists=True),
              help="Your own writing to compare against: .txt / .md / .json / .jsonl files or directories (the user's "
                   "turns of transcripts; repeatable).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The ranked phrases as JSON.")
@click.option("--top", default=50, show_default=True, type=click.IntRange(1), help="Phrases listed.")
@click.option("--min-count", default=3, show_default=True, type=click.IntRange(1),
              help="Model occurrences a phrase needs to be scored.")
@click.option("--max-n", default=5, show_default=True, type=click.IntRange(1, 16),
              help="Every phrase up to this many tokens is scored (longer ones grow by extension).")
@click.option("--background", type=click.Choice(["wordfreq", "human"]), default="wordfreq", show_default=True,
              help="The prior's background: English word frequencies, or both corpora pooled.")
@click.option("--alpha0", default=1000.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="The prior's weight in grams (keep it well below your text's word count).")
@click.option("--min-z", default=3.0, show_default=True, type=float,
              help="The evidence against your text: z at least this (with little text of your own, z stays small; "
                   "the language's evidence still lists: see docs/discover.md).")
@click.option("--min-ratio", default=5.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="The evidence against the language: the model's rate at least this many times its rarest word's "
                   "wordfreq rate (the Poisson lower bound at --confidence).")
@click.option("--confidence", default=0.95, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Of the lower bounds (the rate ratio's, the log-odds').")
@click.option("--lang", default="en", show_default=True,
              help="wordfreq's language for the background and the language's evidence (e.g. de, fr, es).")
@click.option("--sides", default=None, metavar="SIDE,...",
              help="Of reply records with a side (replies.json: base, edited), only these.")
@click.option("--png", type=click.Path(dir_okay=False), help="Write a chart of the top phrases here.")
@click.option("--model", type=MODEL, default=None,
              help="GGUF path or public model name: each phrase's tokens, whether its last word is one token, "
                   "and its ban point measured by the model (p of the last word after its prefix).")
@click.option("--contexts", default=4, show_default=True, type=click.IntRange(1),
              help="With --model: occurrences per phrase the ban point is measured at.")
@click.option("--certain", default=0.9, show_default=True, type=click.FloatRange(0, 1),
              help="With --model: a last word this likely after its prefix moves the ban one word earlier.")
@_CHAT_TEMPLATE
@_GPU_LAYERS
@JSON_FLAG
def discover_cmd(model_text, human, out, top, min_count, max_n, background, alpha0, min_z, min_ratio, confidence, lang,
                 sides, png, model, contexts, certain, chat_template, n_gpu_layers, as_json) -> None:
    """Phrases the model over-uses against your own writing and against written English (or --lang):
    n-grams with both evidences, each marked style, mixed or topic (docs/discover.md); with --model,
    where to ban each one."""
    from exactedit.evals.discover import (DiscoverConfig, discover, human_texts, model_texts, plot_discovery,
                                          render_discovery, write_discovery)

    _refuse_clobber({"--out": out, "--png": png}, {"--model-text": model_text, "--human": human,
                                                  "--model": _existing(model), "--chat-template": chat_template})
    with _bad_parameter():
        cfg = DiscoverConfig(top=top, min_count=min_count, max_n=max_n, max_len=max(max_n, 8), background=background,
                             alpha0=alpha0, min_z=min_z, min_ratio=min_ratio, confidence=confidence, lang=lang)
    chosen = None if sides is None else [s.strip() for s in sides.split(",") if s.strip()]
    if chosen == []:
        raise click.BadParameter("expected side names separated by commas", param_hint="--sides")
    mt, ht = model_texts(model_text, sides=chosen), human_texts(human)
    d = with_progress("tokenizing", discover, mt, ht, cfg)
    text = render_discovery(d)
    obj = d.to_dict()
    if model is not None:
        from exactedit.runs import ban_lines, discover_with_model

        from exactedit.native.llamacpp import EngineSettings, default_gpu_layers

        layers = default_gpu_layers() if n_gpu_layers is None else n_gpu_layers
        obj = with_progress("ban points", discover_with_model, model, mt, ht, cfg, contexts=contexts,
                            certain=certain, template=chat_template, settings=EngineSettings(n_gpu_layers=layers))
        text += "\n\n" + "\n".join(ban_lines(obj["phrases"]))
    write_discovery(obj, out)
    if png:
        plot_discovery(d, png)
    emit(obj, text + f"\n\nwrote {out}" + (f" and {png}" if png else ""), as_json, allow_nan=False)


@main.command("generate")
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (qwen, gemma).")
@click.option("--prompt", required=True, help="The user's message.")
@click.option("--rules", type=click.Path(dir_okay=False, exists=True), help="Compiled shaping rules to run live.")
@click.option("--persona/--no-persona", default=None, help="Override the rules' persona gate.")
@_RULES_MODE
@_CHAT_TEMPLATE
@_gen_options
@_engine_settings
@JSON_FLAG
def generate_cmd(model, prompt, rules, persona, rules_mode, chat_template, max_new, temperature, top_k, seeds, as_json,
                 **flags) -> None:
    """Sample one reply with llama.cpp, the shaping rules (if given) between logits and sampler."""
    from exactedit.native.llamacpp import Sampling
    from exactedit.native.shaping import generate_text, render_generation

    if len(seeds) > 1:
        raise click.UsageError("generate takes one --seed")
    cfg = Sampling(max_new=max_new, temperature=temperature, top_k=top_k, seed=seeds[0] if seeds else 0)
    r = generate_text(model, prompt, cfg, rules, settings=_settings(**flags), persona=persona,
                      chat_template=chat_template, rules_mode=rules_mode)
    emit(r, render_generation(r), as_json)


@main.command("inspect")
@click.argument("model", type=click.Path(dir_okay=False, exists=True, path_type=str))
@JSON_FLAG
def inspect_cmd(model: str, as_json: bool) -> None:
    """Show MODEL.gguf's tail architecture, the tensors it uses, tied or not, sha256, metadata."""
    from exactedit.quant import render_summary, summarize

    summary = with_progress("sha256", summarize, model)
    emit(summary, render_summary(summary), as_json)


@main.command("kld")
@click.option("--model", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Base GGUF (not with --base-file, which holds the base side).")
@click.option("--dump", "dump_dirs", required=True, multiple=True, type=click.Path(file_okay=False, exists=True),
              help="Activation dump directory of the base model; repeat to combine dumps into one report.")
@click.option("--edited", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Edited GGUF (may be left out with --write-base: then only the base file is written).")
@click.option("--rows", multiple=True, metavar="A:B",
              help="Row range of each dump (default: all); once for every dump, or once per --dump.")
@click.option("--doc-rows", default=None, metavar="A:B",
              help="Row range within every document instead (e.g. 256:511: what llama-perplexity scores "
                   "in chunks of 512).")
@click.option("--match-engine", type=click.Choice(["llamacpp"]), default=None,
              help="Both models' logits as this engine computes them (needs dumps it captured). "
                   "Default: exact float arithmetic (the edit's own effect).")
@click.option("--stats", "stats", type=click.Choice(["exact", "llama-perplexity"]), default=None,
              help="exact (default): KL over the whole vocabulary in float64; llama-perplexity: the "
                   "tool's 16-bit base codes and -16-nat cutoff, its report (default with base files).")
@click.option("--base-file", default=None, type=click.Path(dir_okay=False, exists=True),
              help="A llama-perplexity --kl-divergence-base file: the base side, as the tool recorded it.")
@click.option("--write-base", default=None, type=click.Path(dir_okay=False),
              help="Write the base side as a --kl-divergence-base file llama-perplexity reads.")
@click.option("--rows-out", default=None, type=click.Path(dir_okay=False),
              help="Write the per-row KLD as .npy (float64); --json then leaves it out.")
@TILE_ROWS
@JSON_FLAG
def kld_cmd(model, dump_dirs, edited, rows, doc_rows, match_engine, stats, base_file, write_base, rows_out,
            tile_rows, as_json) -> None:
    """KL divergence of EDITED against MODEL on the dumps (llama.cpp's perplexity-tool statistics)."""
    from exactedit.evals.kl import KldConfig
    from exactedit.runs import KldFiles, render_kld_run, run_kld

    if stats is None:
        stats = "llama-perplexity" if (base_file or write_base) else "exact"
    cfg = KldConfig(dumps=dump_dirs, model=model, edited=edited, rows=rows, doc_rows=doc_rows,
                    match_engine=match_engine, stats=stats, tile_rows=tile_rows)
    res = with_progress("KL pass", run_kld, cfg, KldFiles(base_file, write_base, rows_out))
    emit(res, render_kld_run(res), as_json)


@main.command("logits")
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True), help="GGUF model.")
@click.option("--dump", "dump_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="Activation dump directory.")
@click.option("--rows", default=None, metavar="A:B", help="Row range of the dump (default: all).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output .npy [rows, V] float32.")
@TILE_ROWS
@click.option("--match-engine", type=click.Choice(["llamacpp"]), default=None,
              help="Compute the logits as this engine does (quantized activations, its summation order; "
                   "needs a dump captured by that engine). Default: exact float arithmetic.")
@click.option("--verify/--no-verify", "verify_hashes", default=True, show_default=True,
              help="Re-hash the dump's field files first (--no-verify is recorded in the output manifest).")
@JSON_FLAG
def logits_cmd(model, dump_dir, rows, out, tile_rows, match_engine, verify_hashes, as_json) -> None:
    """Full-vocabulary logits of MODEL recomputed from the dump rows, written to OUT."""
    from exactedit.solvers.tail import render_logits, write_logits

    res = with_progress("vocab pass", write_logits, model, dump_dir, out, rows=rows, tile_rows=tile_rows,
                        match_engine=match_engine, verify_hashes=verify_hashes)
    emit(res, render_logits(res), as_json)


@main.command("mine")
@click.option("--engine", "engine_name", type=click.Choice(["llamacpp"]), default="llamacpp", show_default=True)
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (qwen).")
@click.option("--prompts", required=True, type=click.Path(dir_okay=False, exists=True),
              help="One user prompt per line.")
@click.option("--phrases", required=True, type=click.Path(dir_okay=False, exists=True),
              help="One banned phrase per line, e.g. 'rather than' (or discover's JSON, with --top).")
@_TOP
@_KIND
@click.option("--out", type=click.Path(file_okay=False), help="Dump of the replies with slop contexts.")
@click.option("--replies", "replies_out", type=click.Path(dir_okay=False),
              help="Write every reply's text here (JSON, base and --edited; `exactedit discover` reads it).")
@click.option("--edited", type=click.Path(dir_okay=False, exists=True),
              help="Also sample this edited GGUF (same prompts and seeds) and compare the rates.")
@click.option("--max-new", default=256, show_default=True, type=click.IntRange(1),
              help="Cap on a reply's tokens (a reply cut here is truncated: no turn end).")
@click.option("--samples", default=1, show_default=True, type=click.IntRange(1), help="Replies per prompt.")
@click.option("--temperature", default=0.8, show_default=True, type=float)
@click.option("--top-k", default=40, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--capitalized/--no-capitalized", default=True, show_default=True,
              help="Also match each phrase with a capital first letter.")
@click.option("--n-boot", default=1000, show_default=True, type=click.IntRange(0), help="Bootstrap resamples.")
@_labels
@click.option("--png", type=click.Path(dir_okay=False), help="Write the phrase rates as a PNG here.")
@click.option("--shape", "shape_rules", type=click.Path(dir_okay=False, exists=True),
              help="Compiled shaping rules (exactedit shape compile) to run live on every side.")
@_CHAT_FALLBACK
@_CHAT_TEMPLATE
@click.option("--overwrite", is_flag=True)
@_engine_settings
@JSON_FLAG
def mine_cmd(engine_name, model, prompts, phrases, top, kind, out, replies_out, edited, max_new, samples, temperature, top_k, seed,
             capitalized, n_boot, tags, source, character, png, shape_rules, chat_fallback, chat_template, overwrite, as_json,
             **flags) -> None:
    """Sample replies to the turn end, find prefix-exact slop contexts, dump them; phrase rates
    (base and --edited) and style rates of the generation."""
    from exactedit.evals.rates import plot_phrase_rates
    from exactedit.runs import MineConfig, render_mine, run_mine
    from exactedit.native.shaping import shape_processors

    _refuse_clobber({"--out": out, "--png": png, "--replies": replies_out},
                    {"--model": model, "--prompts": prompts, "--phrases": phrases, "--edited": edited,
                     "--shape": shape_rules, "--chat-template": chat_template})
    from exactedit.native.llamacpp import Sampling

    cfg = MineConfig(sampling=Sampling(max_new, temperature, top_k, seed), samples=samples, capitalized=capitalized, n_boot=n_boot, tags=tuple(tags), source=source or "mine",
                     character=character, chat_fallback=chat_fallback, chat_template=chat_template)
    res = with_progress("sampling", run_mine, model, _lines(prompts), _phrases(phrases, top, kind), out, edited=edited, config=cfg,
                        settings=_settings(**flags), processors=shape_processors(model, shape_rules, edited),
                        overwrite=overwrite)
    if png:
        plot_phrase_rates(res.phrase_rates, png)
    if replies_out:
        from exactedit.runs import write_replies

        write_replies(res, _lines(prompts), replies_out)
    emit(res, render_mine(res), as_json, allow_nan=False)


@main.command("serve")
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (qwen, gemma, smollm).")
@click.option("--rules", type=click.Path(dir_okay=False, exists=True),
              help="Compiled shaping rules, live on every request (read once, at startup).")
@click.option("--persona/--no-persona", default=None, help="Override the rules' persona gate.")
@_RULES_MODE
@_CHAT_TEMPLATE
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--model-id", default=None, help="The model's name in /v1/models (default: the GGUF's file name).")
@click.option("--max-tokens", default=512, show_default=True, type=click.IntRange(1),
              help="Cap on a request's max_tokens, and its default.")
@click.option("--max-body", "max_body_bytes", default=1 << 20, show_default=True, type=click.IntRange(1024),
              help="Cap on a request body, in bytes (413 past it).")
@click.option("--max-waiting", default=8, show_default=True, type=click.IntRange(0),
              help="Requests that may wait while one generates (503 past them).")
@_engine_settings
def serve_cmd(model, rules, persona, rules_mode, chat_template, host, port, model_id, max_tokens, max_body_bytes,
              max_waiting, **flags) -> None:
    """An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models), the rules live."""
    from exactedit.runs.serve import ServeConfig, serve

    serve(ServeConfig(model=str(model), rules=rules, chat_template=chat_template, persona=persona, rules_mode=rules_mode,
                      host=host, port=port,
                      model_id=model_id, max_tokens=max_tokens, max_body_bytes=max_body_bytes,
                      max_waiting=max_waiting, settings=_settings(**flags)))


@main.command("untie")
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (gemma).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The untied copy to write.")
@click.option("--overwrite", is_flag=True)
@JSON_FLAG
def untie_cmd(model, out, overwrite, as_json) -> None:
    """Add output.weight as a byte copy of token_embd.weight (every other tensor byte-identical)."""
    from exactedit.quant import render_untie, untie_gguf

    _refuse_clobber({"--out": out}, {"--model": model})
    res = with_progress("writing", untie_gguf, model, out, overwrite=overwrite)
    emit(res, render_untie(res), as_json)


# ---- bench: dump-verify, engine, frontier, gbnf, generate, gguf-open, head, loop, quant, serve, shape-compile, ship, solve-head, solve-wfld

@main.group()
def bench() -> None:
    """Benchmarks, reported as ratios against a baseline measured in the same run."""


@bench.command("dump-verify")
@click.option("--mb", default=1024, show_default=True, type=click.IntRange(1), help="Dump size in MiB.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1), help="Best of.")
@click.option("--workdir", type=click.Path(file_okay=False, exists=True), help="Where the dump is written.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench_dump_verify(mb, repeats, workdir, as_json) -> None:
    """Field-hash verification of a production-width dump at open: GB/s, vs a plain read."""
    from exactedit.bench import DumpVerifyBenchConfig, render_dump_verify, run_dump_verify_bench

    r = with_progress("bench dump-verify", run_dump_verify_bench,
                      DumpVerifyBenchConfig(mb=mb, repeats=repeats, workdir=workdir))
    emit(r, render_dump_verify(r), as_json)


@bench.command("engine")
@click.option("--rows", default=395, show_default=True, type=click.IntRange(1), help="Activation rows.")
@click.option("--vocab", default=151936, show_default=True, type=click.IntRange(1), help="Head rows V.")
@click.option("--n", default=1536, show_default=True, type=click.IntRange(1), help="Model width.")
@click.option("--qtype", default="Q6_K", show_default=True, type=click.Choice(["Q6_K", "Q8_0"]))
@click.option("--ubatch", default=0, show_default=True, type=click.IntRange(0),
              help="Micro-batch size the engine ran with (0: one micro-batch of all rows).")
@TILE_ROWS
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(1), help="Alternating repeats; best kept.")
@JSON_FLAG
def bench_engine(rows, vocab, n, qtype, ubatch, tile_rows, repeats, as_json) -> None:
    """Full-vocab pass with --match-engine llamacpp numerics vs the exact path, same head (ratio)."""
    from exactedit.bench import EngineBenchConfig, render_engine_bench, run_engine_bench

    cfg = EngineBenchConfig(rows=rows, vocab=vocab, n=n, qtype=qtype, ubatch=ubatch,
                            tile_rows=tile_rows, repeats=repeats)
    res = with_progress("bench engine", run_engine_bench, cfg)
    emit(res, render_engine_bench(res), as_json)


@bench.command("generate")
@click.option("--model", type=MODEL, default="gemma", show_default=True,
              help="GGUF path, or a public model name (qwen, gemma).")
@click.option("--prompts", default=8, show_default=True, type=click.IntRange(1, 12), help="The bench's own prompts.")
@click.option("--seeds", default=1, show_default=True, type=click.IntRange(1), help="Replies per prompt.")
@click.option("--max-new", default=64, show_default=True, type=click.IntRange(1), help="Tokens per reply (cap).")
@click.option("--slots", default=16, show_default=True, type=click.IntRange(1), help="Replies decoded together.")
@click.option("--rules", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Compiled shaping rules run live (on both sides; with --against plain, on one).")
@click.option("--phrases", default=0, show_default=True, type=click.IntRange(0),
              help="Instead of --rules: compile this many banned phrases of the model's own words in the run.")
@click.option("--phrase-seed", default=0, show_default=True, type=int, help="Which of the model's words --phrases draws.")
@click.option("--against", default="one-at-a-time", show_default=True, type=click.Choice(["one-at-a-time", "plain"]),
              help="The baseline: the one-at-a-time loop, or (plain) batched without the rules: the rules' cost.")
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(1), help="Alternating repeats; best kept.")
@JSON_FLAG
def bench_generate(model, prompts, seeds, max_new, slots, rules, phrases, phrase_seed, against, repeats,
                   as_json) -> None:
    """Batched sampling vs the one-at-a-time loop on a real model, same replies (tokens/s ratio);
    --against plain: batched with the rules vs without them, same jobs (the rules' cost)."""
    from exactedit.bench import GenerateBenchConfig, render_generate_bench, run_generate_bench

    cfg = GenerateBenchConfig(str(model), prompts=prompts, seeds=seeds, max_new=max_new, slots=slots,
                              rules=rules, repeats=repeats, against=against, phrases=phrases, phrase_seed=phrase_seed)
    res = with_progress("bench generate", run_generate_bench, cfg)
    emit(res, render_generate_bench(res), as_json)


@bench.command("gguf-open")
@click.option("--vocab", default=262_144, show_default=True, type=click.IntRange(1), help="Tokens.")
@click.option("--merges/--no-merges", default=True, show_default=True, help="Also as many merges.")
@click.option("--layers", default=48, show_default=True, type=click.IntRange(0), help="Blocks of tensors.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1), help="Our opens (best).")
@click.option("--gguf-py-repeats", default=1, show_default=True, type=click.IntRange(1),
              help="gguf-py opens (best); each takes seconds to minutes at 262K tokens.")
@JSON_FILE
def bench_gguf_open(vocab, merges, layers, repeats, gguf_py_repeats, json_out) -> None:
    """Open + list tensors of a synthetic GGUF with a big vocabulary: ours vs gguf-py's GGUFReader."""
    from exactedit.bench import GGUFOpenBenchConfig, render_gguf_open_bench, run_gguf_open_bench

    cfg = GGUFOpenBenchConfig(vocab=vocab, merges=merges, layers=layers, repeats=repeats,
                              gguf_py_repeats=gguf_py_repeats)
    r = with_progress("bench gguf-open", run_gguf_open_bench, cfg)
    emit_json_file(r, render_gguf_open_bench(r), json_out)


@bench.command("gbnf")
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (smollm, qwen, gemma).")
@click.option("--rules", type=click.Path(dir_okay=False, exists=True), help="Compiled rules: their phrases' grammar.")
@click.option("--phrases", type=click.Path(dir_okay=False, exists=True),
              help="Or a phrase list (one per line, or discover's JSON with --top).")
@_TOP
@click.option("--case", default="rules", show_default=True, type=click.Choice(("rules", "fold")))
@click.option("--sampler", default="chain", show_default=True, type=click.Choice(("chain", "check-first")),
              help="chain: llama-cpp-python's (the grammar on every step); check-first: llama.cpp's common "
                   "sampler, greedy (the drawn token checked alone).")
@click.option("--prompts", default=4, show_default=True, type=click.IntRange(1, 8), help="Of the bench's own prompts.")
@click.option("--max-new", default=64, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0), help="0: greedy.")
@click.option("--repeats", default=2, show_default=True, type=click.IntRange(1), help="Rotating repeats; best kept.")
@click.option("--threads", default=2, show_default=True, type=click.IntRange(1))
@JSON_FLAG
def bench_gbnf(model, rules, phrases, top, case, sampler, prompts, max_new, temperature, repeats, threads,
               as_json) -> None:
    """The phrase-ban grammar (shape export --format gbnf) on llama.cpp: tokens/s against no grammar."""
    from exactedit.native.shaping import GrammarCostConfig, grammar_cost, render_grammar_cost

    if (rules is None) == (phrases is None):
        raise click.UsageError("give --rules or --phrases")
    cfg = GrammarCostConfig(model, rules, phrases, top, case, sampler, prompts=prompts, max_new=max_new,
                            temperature=temperature, repeats=repeats, threads=threads)
    r = with_progress("bench gbnf", grammar_cost, cfg)
    emit(r, render_grammar_cost(r), as_json)


@bench.command("head")
@click.option("--rows", default=512, show_default=True, type=click.IntRange(1), help="Activation rows.")
@click.option("--vocab", default=248320, show_default=True, type=click.IntRange(1), help="Head rows V.")
@click.option("--n", default=2560, show_default=True, type=click.IntRange(1), help="Model width (multiple of 256).")
@TILE_ROWS
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(1), help="Alternating repeats; best time kept.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--device", type=click.Choice(["cpu", "gpu", "auto"]), default="cpu", show_default=True,
              help="gpu: the JAX device pass (exact, tf32, bf16) vs the device matmul; auto: gpu if JAX sees one.")
@JSON_FLAG
def bench_head(rows, vocab, n, tile_rows, repeats, seed, device, as_json) -> None:
    """Streaming full-vocab pass over a synthetic Q6_K head vs numpy sgemm of the same shape."""
    from exactedit.bench import (
        BenchHeadConfig, GpuHeadConfig, device_bench, render_bench_head, render_gpu_head, run_bench_head, run_gpu_head,
    )

    if device_bench(device):
        res = with_progress("bench head (device)", run_gpu_head,
                            GpuHeadConfig(rows, vocab, n, tile_rows, repeats, seed, device))
        emit(res, render_gpu_head(res), as_json)
        return
    with _bad_parameter():
        cfg = BenchHeadConfig(rows, vocab, n, tile_rows, repeats, seed)
    res = with_progress("bench head", run_bench_head, cfg)
    emit(res, render_bench_head(res), as_json)


@bench.command("loop")
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (smollm, qwen, gemma).")
@click.option("--phrases", default=4, show_default=True, type=click.IntRange(1, 8),
              help="Of the bench's own phrases: their final words are the corpus windows' words.")
@click.option("--prompts", default=4, show_default=True, type=click.IntRange(1, 12), help="Of the bench's own prompts.")
@click.option("--samples", default=2, show_default=True, type=click.IntRange(1), help="Replies per prompt.")
@click.option("--max-new", default=48, show_default=True, type=click.IntRange(1), help="Tokens per reply (no stop).")
@click.option("--slots", default=16, show_default=True, type=click.IntRange(1), help="Replies decoded together.")
@click.option("--corpus-tokens", default=1024, show_default=True, type=click.IntRange(1),
              help="The corpus windows' prefill budget (dataset corpus --max-tokens; bundled English only).")
@click.option("--head-rows", default=256, show_default=True, type=click.IntRange(1), help="Rows of the vocab pass.")
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(1), help="Alternating repeats; best kept.")
@click.option("--out", "json_out", default=None, type=click.Path(dir_okay=False),
              help="Also write the result as JSON here ('-' for stdout only).")
@_engine_settings
@JSON_FLAG
def bench_loop(model, phrases, prompts, samples, max_new, slots, corpus_tokens, head_rows, repeats, json_out, as_json,
               **flags) -> None:
    """The antislop loop's engine work (generation, capture, the corpus stage, the vocab pass) on a small
    fixed workload, each beside llama.cpp's (or sgemm's) own rate measured in the same run: ratios."""
    from exactedit.bench import LoopBenchConfig, render_loop_bench, run_loop_bench

    cfg = LoopBenchConfig(str(model), phrases=phrases, prompts=prompts, samples=samples, max_new=max_new, slots=slots,
                          corpus_tokens=corpus_tokens, head_rows=head_rows, repeats=repeats, settings=_settings(**flags))
    res = with_progress("bench loop", run_loop_bench, cfg)
    if as_json and json_out not in (None, "-"):        # both: the file written, the JSON printed
        from exactedit.files import atomic_write_text

        atomic_write_text(json_out, json.dumps(res.to_dict(), indent=1) + "\n")
    emit_json_file(res, render_loop_bench(res), "-" if as_json else json_out)


@bench.command("quant")
@click.option("--rows", default=4096, show_default=True, type=click.IntRange(1), help="Rows per run.")
@click.option("--cols", default=2560, show_default=True, type=click.IntRange(1), help="Row width.")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1),
              help="Threads for both sides (numba.set_num_threads / C row chunks).")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1), help="Best of.")
@click.option("--qtype", "qtypes", multiple=True,
              help="Only this ggml type (repeatable); default: every quantized format.")
@JSON_FILE
def bench_quant(rows, cols, threads, repeats, qtypes, json_out) -> None:
    """Quantize/dequantize throughput of each quantized format: our numba paths vs ggml's C."""
    from exactedit.bench import BENCHED, QuantBenchConfig, format_table, run_quant_bench

    cfg = QuantBenchConfig(rows=rows, cols=cols, threads=threads, repeats=repeats,
                           qtypes=tuple(qtypes) or BENCHED)
    result = with_progress("bench quant", run_quant_bench, cfg)
    emit_json_file(result, format_table(result), json_out)


@bench.command("serve")
@click.option("--model", type=MODEL, default="smollm", show_default=True,
              help="GGUF path, or a public model name (qwen, gemma, smollm).")
@click.option("--rules", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Compiled shaping rules, live on the rules side.")
@click.option("--phrases", default=0, show_default=True, type=click.IntRange(0),
              help="Instead of --rules: compile this many banned phrases of the model's own words in the run.")
@click.option("--phrase-seed", default=0, show_default=True, type=int, help="Which of the model's words --phrases draws.")
@click.option("--prompts", default=8, show_default=True, type=click.IntRange(1, 12), help="The bench's own prompts.")
@click.option("--seeds", default=1, show_default=True, type=click.IntRange(1), help="Requests per prompt.")
@click.option("--max-new", default=64, show_default=True, type=click.IntRange(1), help="max_tokens of each request.")
@click.option("--temperature", default=0.8, show_default=True, type=click.FloatRange(0, 2))
@click.option("--top-k", default=40, show_default=True, type=click.IntRange(1))
@click.option("--stream/--no-stream", default=True, show_default=True, help="Streamed requests (SSE) or not.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1), help="Alternating repeats; best kept.")
@JSON_FLAG
def bench_serve(model, rules, phrases, phrase_seed, prompts, seeds, max_new, temperature, top_k, stream, repeats,
                as_json) -> None:
    """`exactedit serve` with the rules vs without them, same requests over HTTP, same run (tokens/s ratio)."""
    from exactedit.bench import ServeBenchConfig, render_serve_bench, run_serve_bench

    cfg = ServeBenchConfig(str(model), rules=rules, phrases=phrases, phrase_seed=phrase_seed, prompts=prompts,
                           seeds=seeds, max_new=max_new, temperature=temperature, top_k=top_k, stream=stream,
                           repeats=repeats)
    res = with_progress("bench serve", run_serve_bench, cfg)
    emit(res, render_serve_bench(res), as_json)


@bench.command("shape-compile")
@click.option("--model", type=MODEL, default="qwen", show_default=True, help="GGUF path, or a public model name.")
@click.option("--phrases", default=1000, show_default=True, type=click.IntRange(1), help="Banned phrases compiled.")
@click.option("--scan-phrases", default=50, show_default=True, type=click.IntRange(1),
              help="Phrases of the same-run baseline (the old per-token scan over every prefix).")
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(1), help="Compiles; best kept.")
@click.option("--seed", default=0, show_default=True, type=int, help="Which of the model's words make the phrases.")
@JSON_FLAG
def bench_shape_compile(model, phrases, scan_phrases, repeats, seed, as_json) -> None:
    """`shape compile` of many phrases drawn from the model's words; the piece search against its old scan."""
    from exactedit.bench import ShapeCompileBenchConfig, render_shape_compile_bench, run_shape_compile_bench

    with _bad_parameter():
        cfg = ShapeCompileBenchConfig(model=str(model), phrases=phrases, scan_phrases=min(scan_phrases, phrases),
                                      repeats=repeats, seed=seed)
    r = with_progress("bench shape-compile", run_shape_compile_bench, cfg)
    emit(r, render_shape_compile_bench(r), as_json)


@bench.command("solve-head")
@click.option("--rows", default=17352, show_default=True, type=click.IntRange(1), help="Rows of the Adam step.")
@click.option("--k", default=16, show_default=True, type=click.IntRange(1), help="|S|, edited head rows.")
@click.option("--n", default=2560, show_default=True, type=click.IntRange(1), help="Model width.")
@click.option("--null-k", default=32, show_default=True, type=click.IntRange(0), help="Null-space directions.")
@click.option("--steps", default=20, show_default=True, type=click.IntRange(1), help="Timed Adam steps.")
@click.option("--vocab", default=248320, show_default=True, type=click.IntRange(1), help="Head rows V of the pass.")
@click.option("--pass-rows", default=512, show_default=True, type=click.IntRange(1), help="Rows of the vocab pass.")
@TILE_ROWS
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--skip-pass", is_flag=True, help="Time only the Adam steps.")
@click.option("--device", type=click.Choice(["cpu", "gpu", "auto"]), default="cpu", show_default=True,
              help="gpu: mix + one device pass over --rows + 300 steps + dev tracking, timed whole "
                   "(--pass-rows and --skip-pass do not apply); auto: gpu if JAX sees one.")
@JSON_FLAG
def bench_solve_head(as_json, device, **flags) -> None:
    """One Adam step of solve head at production size, and its full-vocab pass against sgemm."""
    from exactedit.bench import (
        BenchSolveHeadConfig, GpuSolveHeadConfig, device_bench, render_bench_solve_head, render_gpu_solve_head,
        run_bench_solve_head, run_gpu_solve_head,
    )

    if device_bench(device):
        f = flags
        cfg = GpuSolveHeadConfig(rows=f["rows"], k=f["k"], n=f["n"], vocab=f["vocab"], null_k=f["null_k"],
                                 step_repeats=f["steps"], seed=f["seed"], tile_rows=f["tile_rows"], device=device)
        r = with_progress("bench solve-head (device)", run_gpu_solve_head, cfg)
        emit(r, render_gpu_solve_head(r), as_json)
        return
    with _bad_parameter():
        cfg = BenchSolveHeadConfig(**flags)
    r = with_progress("bench solve-head", run_bench_solve_head, cfg)
    emit(r, render_bench_solve_head(r), as_json)


@bench.command("frontier")
@click.option("--n", default=1536, show_default=True, type=click.IntRange(1), help="Model width.")
@click.option("--h", default=8960, show_default=True, type=click.IntRange(1), help="FFN width.")
@click.option("--vocab", default=151936, show_default=True, type=click.IntRange(1), help="Head rows V.")
@click.option("--rows", default=256, show_default=True, type=click.IntRange(1),
              help="Frontier rows (half slop positions, half legitimate uses).")
@click.option("--phrases", default=4, show_default=True, type=click.IntRange(1))
@click.option("--conditions", default=512, show_default=True, type=click.IntRange(1),
              help="Rows of the Gram solve the phrase parts come from.")
@click.option("--seed", default=0, show_default=True, type=int)
@JSON_FLAG
def bench_frontier(as_json, **flags) -> None:
    """The dense strength search along lines vs a full-vocabulary pass per point, same run."""
    from exactedit.bench import BenchFrontierConfig, render_bench_frontier, run_bench_frontier

    with _bad_parameter():
        cfg = BenchFrontierConfig(**flags)
    r = with_progress("bench frontier", run_bench_frontier, cfg)
    emit(r, render_bench_frontier(r), as_json)


@bench.command("ship")
@click.option("--h", default=8960, show_default=True, type=click.IntRange(1), help="FFN width (the tensor's row length).")
@click.option("--rows", default=1536, show_default=True, type=click.IntRange(1), help="Tensor rows shipped.")
@click.option("--extra", default=512, show_default=True, type=click.IntRange(1),
              help="Background rows beyond h (the metric's factor is folded to h x h).")
@click.option("--seed", default=0, show_default=True, type=int)
@JSON_FLAG
def bench_ship(as_json, **flags) -> None:
    """The feedback ship with the metric's upper factor used as one vs as a general factor, same run."""
    from exactedit.bench import BenchShipConfig, render_bench_ship, run_bench_ship

    with _bad_parameter():
        cfg = BenchShipConfig(**flags)
    r = with_progress("bench ship", run_bench_ship, cfg)
    emit(r, render_bench_ship(r), as_json)


@bench.command("solve-wfld")
@click.option("--n", default=2560, show_default=True, type=click.IntRange(1), help="Model width.")
@click.option("--h", default=640, show_default=True, type=click.IntRange(1), help="Shared-expert hidden width.")
@click.option("--vocab", default=248320, show_default=True, type=click.IntRange(1), help="Head rows V.")
@click.option("--d-lo", default=320, show_default=True, type=click.IntRange(1), help="output_hc rank d_lo.")
@click.option("--rows", default=1024, show_default=True, type=click.IntRange(1), help="Rows per trace (3 traces).")
@click.option("--slop-every", default=10, show_default=True, type=click.IntRange(6),
              help="One planted phrase or legitimate use every this many tokens.")
@click.option("--gn-iters", default=3, show_default=True, type=click.IntRange(1), help="Gauss-Newton rounds.")
@click.option("--special-rows", default=256, show_default=True, type=click.IntRange(0))
@TILE_ROWS
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--workdir", type=click.Path(file_okay=False), help="Where the synthetic model and dumps go.")
@click.option("--device", type=click.Choice(["cpu", "gpu", "auto"]), default="cpu", show_default=True,
              help="gpu: the whole solve with its passes and VJPs on the JAX device, timed twice in one "
                   "process (first call: compiles included); auto: gpu if JAX sees one.")
@JSON_FLAG
def bench_solve_wfld(as_json, device, **flags) -> None:
    """A whole `solve wfld` at production size on synthetic data: where the time goes."""
    from exactedit.bench import (
        BenchSolveWfldConfig, device_bench, render_bench_solve_wfld, render_gpu_solve_wfld, run_bench_solve_wfld,
        run_gpu_solve_wfld,
    )

    with _bad_parameter():
        cfg = BenchSolveWfldConfig(**flags)
    if device_bench(device):
        r = with_progress("bench solve-wfld (device)", run_gpu_solve_wfld, cfg, device)
        emit(r, render_gpu_solve_wfld(r), as_json)
        return
    r = with_progress("bench solve-wfld", run_bench_solve_wfld, cfg)
    emit(r, render_bench_solve_wfld(r), as_json)


# ---- dataset: build ------------------------------------------------------------------------------

@main.group()
def dataset() -> None:
    """Labelled dump sets for the solvers, from a model's own replies."""


@dataset.command("build")
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (qwen).")
@click.option("--prompts", required=True, type=click.Path(dir_okay=False, exists=True),
              help="One user prompt per line (the split is by prompt).")
@click.option("--phrases", required=True, type=click.Path(dir_okay=False, exists=True),
              help="One banned phrase per line (or discover's JSON, with --top).")
@_TOP
@_KIND
@click.option("--texts", type=click.Path(file_okay=False, exists=True),
              help="A directory of plain .txt files: plain anchors and legitimate uses.")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Directory for train/ heldout/ collateral/ anchors/ and dataset.json.")
@click.option("--samples", default=2, show_default=True, type=click.IntRange(1), help="Replies per prompt.")
@click.option("--max-new", default=256, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=0.8, show_default=True, type=float)
@click.option("--top-k", default=40, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--heldout", default=0.25, show_default=True, type=float, help="Share of prompts held out.")
@click.option("--collateral", default=0.15, show_default=True, type=float, help="Share of prompts for collateral.")
@click.option("--anchor", default=0.15, show_default=True, type=float, help="Share of prompts for chat anchors.")
@click.option("--chunk", default=256, show_default=True, type=click.IntRange(16), help="Tokens per text document.")
@click.option("--capitalized/--no-capitalized", default=True, show_default=True)
@_CHAT_FALLBACK
@_CHAT_TEMPLATE
@click.option("--overwrite", is_flag=True)
@_engine_settings
@JSON_FLAG
def dataset_build(model, prompts, phrases, top, kind, texts, out, overwrite, as_json, n_ctx, n_batch, n_ubatch, n_threads,
                  flash_attn, n_gpu_layers, **flags) -> None:
    """Sample the model's replies and write the train / heldout / collateral / anchors dumps
    (tags, roles, split by prompt) with a summary of slop contexts and legitimate uses per set."""
    from exactedit.runs import DatasetConfig, build_dataset, render_dataset, text_files

    _refuse_clobber({"--out": out}, {"--model": model, "--prompts": prompts, "--phrases": phrases, "--texts": texts,
                                     "--chat-template": flags.get("chat_template")})
    from exactedit.native.llamacpp import Sampling
    from exactedit.runs import MineConfig

    mine = MineConfig(sampling=Sampling(flags.pop("max_new"), flags.pop("temperature"), flags.pop("top_k"),
                                        flags.pop("seed")), samples=flags.pop("samples"), n_boot=0,
                      capitalized=flags.pop("capitalized"), chat_fallback=flags.pop("chat_fallback"),
                      chat_template=flags.pop("chat_template"))
    cfg = DatasetConfig(mine=mine, **flags)
    files = list(text_files([texts], None)) if texts else []
    res = with_progress("sampling", build_dataset, model, _lines(prompts), _phrases(phrases, top, kind), out, texts=files,
                        config=cfg, settings=_settings(n_ctx, n_batch, n_ubatch, n_threads, flash_attn, n_gpu_layers),
                        overwrite=overwrite)
    emit(res, render_dataset(res), as_json)


@dataset.command("corpus")
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (qwen).")
@click.option("--phrases", required=True, type=click.Path(dir_okay=False, exists=True),
              help="One banned phrase per line (their final tokens are the words; or discover's JSON, with --top).")
@_TOP
@_KIND
@click.option("--texts", multiple=True, type=click.Path(dir_okay=False, exists=True),
              help="A plain text file of yours, searched first for the words' uses (repeatable; one source document "
              "each).")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Directory for solve/ dev/ collateral/ and corpus.json.")
@click.option("--max-tokens", default=12_000, show_default=True, type=click.IntRange(1),
              help="Prefill tokens in all, shared by the parts and round-robin by the words.")
@click.option("--context", default=48, show_default=True, type=click.IntRange(1), help="Tokens before each use.")
@click.option("--after", default=8, show_default=True, type=click.IntRange(0), help="Tokens past each use.")
@click.option("--max-window", default=512, show_default=True, type=click.IntRange(1),
              help="Longest span overlapping windows merge into.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--solve", default=0.5, show_default=True, type=float, help="Share of source documents for the solve.")
@click.option("--dev", default=0.25, show_default=True, type=float, help="Share for choosing the edit's strength.")
@click.option("--collateral", default=0.25, show_default=True, type=float, help="Share held out for bar (d).")
@click.option("--stdlib/--no-stdlib", default=True, show_default=True,
              help="Use the Python standard library's docstrings.")
@click.option("--english/--no-english", default=True, show_default=True,
              help="Use the bundled general-English corpus (runs/bundled/english/).")
@click.option("--capitalized/--no-capitalized", default=True, show_default=True)
@_CHAT_FALLBACK
@_CHAT_TEMPLATE
@click.option("--overwrite", is_flag=True)
@_engine_settings
@JSON_FLAG
def dataset_corpus(model, phrases, top, kind, texts, out, overwrite, as_json, n_ctx, n_batch, n_ubatch, n_threads,
                   flash_attn, n_gpu_layers, **flags) -> None:
    """Teacher-force windows of an offline corpus (--texts first, then the bundled general English,
    then the stdlib's docstrings) around each use of the phrases' final tokens: solve / dev /
    collateral dumps, split by source document."""
    from exactedit.runs import CorpusConfig, build_corpus, render_corpus

    _refuse_clobber({"--out": out}, {"--model": model, "--phrases": phrases, "--texts": list(texts),
                                     "--chat-template": flags.get("chat_template")})
    cfg = CorpusConfig(**flags)
    res = with_progress("prefill", build_corpus, model, _phrases(phrases, top, kind), out, texts=list(texts), config=cfg,
                        settings=_settings(n_ctx, n_batch, n_ubatch, n_threads, flash_attn, n_gpu_layers),
                        overwrite=overwrite)
    emit(res, render_corpus(res), as_json)


# ---- dump: import, inspect -----------------------------------------------------------------------

@main.group()
def dump() -> None:
    """Activation dumps."""


@dump.command("import")
@click.argument("source", type=click.Path(exists=True, path_type=str))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="The v1 dump directory to write.")
@click.option("--model", type=MODEL, default=None,
              help="GGUF path or public model name: check dims, record its sha256, derive row roles from its chat.")
@_CHAT_FALLBACK
@_CHAT_TEMPLATE
@click.option("--overwrite", is_flag=True)
@JSON_FLAG
def dump_import(source, out, model, chat_fallback, chat_template, overwrite, as_json) -> None:
    """Raw little-endian field files + SOURCE/dump.toml (dtype, shape per field) -> a v1 dump
    (docs/dump-format.md, "Importing an engine's raw arrays")."""
    from exactedit.native.llamacpp import import_dump, render_import

    _refuse_clobber({"--out": out}, {"SOURCE": source, "--model": model, "--chat-template": chat_template})
    res = import_dump(source, out, model=model, overwrite=overwrite, chat_fallback=chat_fallback,
                      chat_template=chat_template)
    emit(res, render_import(res), as_json)


@dump.command("inspect")
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@JSON_FLAG
@click.option("--verify/--no-verify", "verify_hashes", default=True, show_default=True,
              help="Re-hash every field file against the manifest (--no-verify is recorded in the output).")
def dump_inspect(directory: str, as_json: bool, verify_hashes: bool) -> None:
    """Validate the dump DIRECTORY; show arch, rows, fields, documents and role counts."""
    from exactedit.dumps import format_table, inspect_dump

    summary = with_progress("validating", inspect_dump, directory, verify_hashes=verify_hashes)
    emit(summary, format_table(summary), as_json)


# ---- engine: dump, model, perplexity-chunks, run -------------------------------------------------

@main.group()
def engine() -> None:
    """Compiled engines (llama.cpp) behind the production engine's CLI contract."""


@engine.command("dump")
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (qwen, gemma).")
@click.option("--tokens", type=click.Path(dir_okay=False, exists=True), help="int32 token ids file.")
@click.option("--text", type=click.Path(dir_okay=False, exists=True), help="A text file to tokenize.")
@click.option("--chat", "chat_file", type=click.Path(dir_okay=False, exists=True),
              help="Conversations, one JSON list of {role, content} per line, rendered with the model's template.")
@_labels
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Dump directory to write.")
@_CHAT_FALLBACK
@_CHAT_TEMPLATE
@click.option("--overwrite", is_flag=True)
@_engine_settings
@JSON_FLAG
def engine_dump(model, tokens, text, chat_file, tags, source, character, out, chat_fallback, chat_template, overwrite,
                as_json,
                **flags) -> None:
    """Capture an rmsnorm dump (R = ffn_inp, hh = the FFN hidden) with llama.cpp: labelled documents
    (stable names, tags plain/chat + --tag, row roles from the model's chat framing)."""
    from exactedit.native.llamacpp import DumpInputs, dump_documents, render_documents

    _refuse_clobber({"--out": out}, {"--model": model, "--tokens": tokens, "--text": text, "--chat": chat_file,
                                     "--chat-template": chat_template})
    inputs = DumpInputs(text=text, tokens=tokens, chat=chat_file, tags=tuple(tags), source=source,
                        character=character or "", chat_fallback=chat_fallback, chat_template=chat_template)
    res = with_progress("capturing", dump_documents, model, inputs, out, settings=_settings(**flags),
                        overwrite=overwrite)
    emit(res, render_documents(res), as_json)


@engine.command("model")
@click.argument("name", type=click.Choice(["qwen", "gemma"]))
def engine_model(name) -> None:
    """Assemble the public model NAME from its installed packages (verified) and print its path."""
    from exactedit.native.llamacpp import locate

    path = str(with_progress(f"assembling {name}", locate, name))
    emit(path, path, as_json=False)


@engine.command("perplexity-chunks")
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (qwen, gemma).")
@click.option("--text", "text_file", required=True, type=click.Path(dir_okay=False, exists=True),
              help="The text llama-perplexity reads (its -f).")
@click.option("--ctx", "n_ctx", default=512, show_default=True, type=click.IntRange(4), help="Its -c: tokens per chunk.")
@click.option("--chunks", "n_chunks", default=None, type=click.IntRange(1), help="Its --chunks: at most this many.")
@click.option("--n-batch", default=512, show_default=True, type=click.IntRange(1), help="Its -b.")
@click.option("--n-ubatch", default=512, show_default=True, type=click.IntRange(1), help="Its -ub.")
@click.option("--threads", "n_threads", default=2, show_default=True, type=click.IntRange(1), help="Its -t.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Dump directory to write.")
@click.option("--overwrite", is_flag=True)
@JSON_FLAG
def engine_perplexity_chunks(model, text_file, n_ctx, n_chunks, n_batch, n_ubatch, n_threads, out, overwrite,
                             as_json) -> None:
    """Dump the chunks llama-perplexity evaluates in TEXT, one document each, as it evaluates them
    (for `exactedit kld --stats llama-perplexity`)."""
    from exactedit.native.llamacpp import dump_text_chunks, render_chunk_dump

    _refuse_clobber({"--out": out}, {"--model": model, "--text": text_file})
    res = with_progress("capturing", dump_text_chunks, model, text_file, n_ctx, out, n_chunks=n_chunks,
                        n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads, overwrite=overwrite)
    emit(res, render_chunk_dump(res), as_json)


@engine.command("run")
@click.option("--metal-gguf", "gguf_path", required=True, type=click.Path(dir_okay=False, exists=True),
              help="The GGUF to load (the production CLI's flag name).")
@click.option("--tokens-file", required=True, type=click.Path(dir_okay=False, exists=True),
              help="Little-endian int32 token ids, no header.")
@click.option("--logits-out", required=True, type=click.Path(dir_okay=False),
              help="Written: little-endian float32 [T, V], one full-vocabulary row per position.")
@_engine_settings
@JSON_FLAG
def engine_run(gguf_path, tokens_file, logits_out, as_json, **flags) -> None:
    """The production engine's contract (strata_window_cli), honoured by llama.cpp."""
    from exactedit.native.verify import render_contract_run, run_llamacpp

    _refuse_clobber({"--logits-out": logits_out}, {"--metal-gguf": gguf_path, "--tokens-file": tokens_file})
    res = with_progress("evaluating", run_llamacpp, gguf_path, tokens_file, logits_out, _settings(**flags))
    emit(res, render_contract_run(res), as_json)


# ---- eval: blind, ledger, register, score, split, test -------------------------------------------

@main.group(name="eval")
def eval_() -> None:
    """Pre-registered protocol, splits, bars, blind sign-off."""


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
@JSON_FLAG
def eval_blind(model, bundle, doc, dev_report, protocol, out, workspace, as_json):
    """The one-shot blind sign-off of BUNDLE on DOC; a second run is refused and recorded."""
    from pathlib import Path

    from exactedit.runs import blind_report, blind_signoff

    out = out or str(Path(workspace) / "blind")
    _refuse_clobber({"--out": out}, {"--model": model, "--bundle": bundle, "--doc": doc, "--dev-report": dev_report,
                                    "--protocol": protocol}, holds_inputs=True)
    r = with_progress("blind run", blind_signoff, model, bundle, doc, dev_report, workspace, out, command_line(),
                      protocol_path=protocol)
    emit(*blind_report(r), as_json)


@eval_.command("ledger")
@click.option("--verify", "check", is_flag=True,
              help="Check the hash chain and every anchor (--against, the blind registry); exit 1 naming the "
                   "first bad entry or the first output the ledger no longer backs.")
@click.option("--against", multiple=True, type=click.Path(exists=True),
              help="An exported head, bundle, report or sign-off, or a directory of them (repeatable; with --verify).")
@click.option("--export", "export", type=click.Path(dir_okay=False),
              help="Write the current head (seq + hash) as JSON to FILE, to commit to git as an anchor.")
@_WORKSPACE
@JSON_FLAG
def eval_ledger(check, against, export, workspace, as_json):
    """List the ledger's entries, export its head, or verify its chain against recorded heads."""
    from exactedit.evals.protocol import Ledger, export_head, render_verification, verify_ledger
    from exactedit.runs import export_report, ledger_report

    if against and not check:
        raise click.UsageError("--against is checked by --verify")
    if export:
        _refuse_clobber({"--export": export}, {"--workspace": workspace})
        emit(*export_report(export_head(workspace, export)), as_json)
    if check:
        v = verify_ledger(workspace, against)
        emit(v, render_verification(v), as_json)
        if not v.ok:
            sys.exit(1)
    if export or check:
        return
    with Ledger.open(workspace, write=False) as ledger:
        entries = ledger.entries()
    emit(*ledger_report(entries), as_json)


@eval_.command("register")
@click.argument("protocol", type=click.Path(dir_okay=False, exists=True))
@_WORKSPACE
@JSON_FLAG
def eval_register(protocol, workspace, as_json):
    """Record PROTOCOL's sha256 (and its traces' dump hashes) in the ledger."""
    from exactedit.runs import register, register_report

    emit(*register_report(register(protocol, workspace, command_line())), as_json)


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
@JSON_FLAG
def eval_score(protocol, model, bundle, edited, shapes, bars, persona_tag, out, unregistered, workspace, as_json):
    """Dev bars of MODEL + a bundle / edited GGUF / shaping rules; the report is recorded."""
    from exactedit.runs import score, score_report
    from exactedit.evals.scoring import ScoreConfig

    with _bad_parameter():
        config = ScoreConfig(heldout_role="dev", bars=bars, shapes=tuple(shapes), persona_tag=persona_tag)
    _refuse_clobber({"--out": out}, {"--protocol": protocol, "--model": model, "--bundle": bundle, "--edited": edited},
                   holds_inputs=True)
    r = with_progress("scoring", score, protocol, workspace, model, out, command_line(), bundle=bundle, edited=edited,
                      config=config, unregistered=unregistered)
    emit(*score_report(r), as_json)


@eval_.command("split")
@click.option("--protocol", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--unregistered", is_flag=True, help="Allow an unregistered or changed protocol (marked).")
@_WORKSPACE
@JSON_FLAG
def eval_split(protocol, unregistered, workspace, as_json):
    """Split the traces' documents into train / dev / test by the protocol's rule; record it."""
    from exactedit.runs import split, split_report

    emit(*split_report(split(protocol, workspace, command_line(), unregistered)), as_json)


@eval_.command("test")
@click.option("--protocol", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--bundle", required=True, type=click.Path(file_okay=False, exists=True))
@click.option("--bars", type=click.Choice(["anti-slop", "persona", "all"]), default="anti-slop", show_default=True)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Directory for test-report.*")
@click.option("--unregistered", is_flag=True, help="Allow an unregistered or changed protocol (marked).")
@click.option("--release-stale-claim", is_flag=True,
              help="Release the test claim a killed run left on this bundle (recorded), then score; refused "
                   "while the claiming process is alive.")
@_WORKSPACE
@JSON_FLAG
def eval_test(protocol, model, bundle, bars, out, unregistered, release_stale_claim, workspace, as_json):
    """Score the test split of BUNDLE, once. A repeat prints the recorded result and fails."""
    from exactedit.evals.protocol import LedgerRefusal
    from exactedit.runs import recorded_test_report, score_test, test_report
    from exactedit.evals.scoring import ScoreConfig

    with _bad_parameter():
        config = ScoreConfig(heldout_role="test", bars=bars)
    _refuse_clobber({"--out": out}, {"--protocol": protocol, "--model": model, "--bundle": bundle}, holds_inputs=True)
    try:
        r = with_progress("scoring test", score_test, protocol, workspace, model, bundle, out, command_line(),
                          config=config, unregistered=unregistered, release_stale_claim=release_stale_claim)
    except LedgerRefusal as exc:
        if exc.recorded is not None:
            emit(*recorded_test_report(exc.recorded), as_json)
        raise
    emit(*test_report(r), as_json)


# ---- shape: compile, rates -----------------------------------------------------------------------

@main.group()
def shape() -> None:
    """Sampler-side shaping rules: compile for a model, rates in generation (docs/shaping.md), export
    for other engines (docs/rules-where.md)."""


@shape.command("compile")
@click.argument("rules", type=click.Path(dir_okay=False, exists=True), required=False)
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (qwen, gemma).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The compiled rules (JSON) to write.")
@click.option("--phrases", type=click.Path(dir_okay=False, exists=True),
              help="Add a prefix penalty on these phrases (one per line, or discover's JSON with --top).")
@_TOP
@_KIND
@click.option("--bias", default=6.0, show_default=True, type=float, help="The --phrases penalty (nats).")
@JSON_FLAG
def shape_compile_cmd(rules, model, out, phrases, top, kind, bias, as_json) -> None:
    """Resolve a rules file (TOML) against MODEL's tokenizer, specials and chat template; --phrases
    adds a prefix penalty on a list (phrases whose last word is several tokens are skipped, listed)."""
    from exactedit.native.shaping import compile_file, render_compile

    if rules is None and phrases is None:
        raise click.UsageError("give a RULES file, --phrases, or both")
    _refuse_clobber({"--out": out}, {"RULES": rules, "--model": model, "--phrases": phrases})
    r = compile_file(rules, model, out, phrases=_phrases(phrases, top, kind) if phrases else (), bias=bias)
    emit(r, render_compile(r), as_json)


@shape.command("rates")
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (qwen, gemma).")
@click.option("--rules", required=True, type=click.Path(dir_okay=False, exists=True), help="Compiled rules (JSON).")
@click.option("--prompts", required=True, type=click.Path(dir_okay=False, exists=True), help="One user prompt per line.")
@click.option("--edited", type=click.Path(dir_okay=False, exists=True), help="Edited GGUF: adds the weights and both arms.")
@click.option("--phrases", type=click.Path(dir_okay=False, exists=True),
              help="Phrases to rate (default: the rules'; or discover's JSON, with --top).")
@_TOP
@_KIND
@_gen_options
@click.option("--n-boot", default=1000, show_default=True, type=click.IntRange(0), help="Bootstrap resamples.")
@click.option("--slots", default=16, show_default=True, type=click.IntRange(1),
              help="Replies decoded together (1: one at a time; up to 3: bitwise the one-at-a-time loop).")
@_RULES_MODE
@_engine_settings
@JSON_FLAG
def shape_rates_cmd(model, rules, prompts, edited, phrases, top, kind, max_new, temperature, top_k, seeds, n_boot, slots,
                    rules_mode, as_json, **flags) -> None:
    """Phrase rates and KL of base / rules / weights / both on the same prompts and seeds."""
    from exactedit.native.shaping import render_shape_rates, shape_rates

    r = with_progress("sampling", shape_rates, model, rules, _lines(prompts), _phrases(phrases, top, kind) if phrases else None,
                      edited=edited, config=_gen_config(max_new, temperature, top_k), seeds=seeds or (0,),
                      settings=_settings(**flags), n_boot=n_boot, slots=slots, rules_mode=rules_mode)
    emit(r, render_shape_rates(r), as_json, allow_nan=False)


@shape.command("export")
@click.option("--rules", required=True, type=click.Path(dir_okay=False, exists=True),
              help="Compiled rules (JSON, exactedit shape compile).")
@click.option("--format", "fmt", required=True, type=click.Choice(("vllm", "hf", "banned-strings", "gbnf")),
              help="vllm: bad_words body; hf: transformers sequence_bias; banned-strings: koboldcpp / exllama / "
                   "TabbyAPI / ik_llama.cpp list; gbnf: a llama.cpp grammar (docs/rules-where.md).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The file to write.")
@click.option("--list", "list_style", type=click.Choice(("lines", "json")),
              help="banned-strings: one per line or a JSON list (default: a list for a .json --out, else lines).")
@click.option("--case", default="rules", show_default=True, type=click.Choice(("rules", "fold")),
              help="gbnf: the forms the rules match (as written, Capitalized), or every letter in either case.")
@click.option("--max-states", type=click.IntRange(1),
              help="gbnf: refuse a grammar whose automaton needs more states, one rule each (default 60,000).")
@click.option("--max-tokenizations", type=click.IntRange(1),
              help="hf: sequences per form of a phrase, its prefix's tokenizations, fewest tokens first (default 16).")
@JSON_FLAG
def shape_export_cmd(rules, fmt, out, list_style, case, max_states, max_tokenizations, as_json) -> None:
    """The rules' phrase bans for another engine: vLLM, transformers, the rewinding phrase-ban
    engines, or a llama.cpp grammar; says what each loses against the rule."""
    from exactedit.solvers.shaping import ExportConfig, export_rules, render_export

    _refuse_clobber({"--out": out}, {"--rules": rules})
    with _bad_parameter():
        config = ExportConfig(fmt, list_style, case, max_states, max_tokenizations)
    r = export_rules(rules, out, config)
    emit(r, render_export(r), as_json)


# ---- solve: head, wfld ---------------------------------------------------------------------------

@main.group()
def solve() -> None:
    """Solvers: `solve head`, `solve wfld`."""


@solve.command("head")
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True), help="GGUF model.")
@click.option("--train", "train", required=True, multiple=True, type=click.Path(file_okay=False, exists=True),
              help="Dump whose train documents (by the protocol's split) are fitted (repeatable).")
@click.option("--dev", "dev", required=True, multiple=True, type=click.Path(file_okay=False, exists=True),
              help="Dump whose dev documents pick the step (repeatable).")
@click.option("--test", "test", multiple=True, type=click.Path(file_okay=False, exists=True),
              help="Dump whose test documents are scored once, at the chosen step (repeatable).")
@click.option("--protocol", required=True, type=click.Path(dir_okay=False, exists=True),
              help="Registered protocol file (split, stopping rule, edit set, bars).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Bundle directory to write.")
@click.option("--rank", default=1, show_default=True, type=click.IntRange(0), help="Rank of dW_S; 0 = full rows.")
@click.option("--null-k", default=32, show_default=True, type=click.IntRange(0),
              help="Top eigenvectors of the train anchors' mix covariance the edit must not move.")
@click.option("--lr", default=1e-3, show_default=True, type=float, help="Adam learning rate.")
@click.option("--adam-b1", default=0.9, show_default=True, type=float)
@click.option("--adam-b2", default=0.999, show_default=True, type=float)
@click.option("--adam-eps", default=1e-8, show_default=True, type=float)
@click.option("--w-nll", default=1.0, show_default=True, type=float, help="Weight of the reply NLL.")
@click.option("--w-margin", default=0.0, show_default=True, type=float, help="Weight of the step-0 margin.")
@click.option("--margin", default=1.0, show_default=True, type=float, help="The margin m (nats).")
@click.option("--w-ul", default=0.0, show_default=True, type=float, help="Weight of the opener unlikelihood.")
@click.option("--w-close", default=0.0, show_default=True, type=float, help="Weight of the closer unlikelihood.")
@click.option("--w-kl", default=100.0, show_default=True, type=float, help="Weight of the exact KL on anchor rows.")
@click.option("--w-guard", default=1.0, show_default=True, type=float, help="Weight of the special-token guard.")
@click.option("--guard-eps", default=0.05, show_default=True, type=float, help="Specials may rise by e^eps.")
@click.option("--ridge", default=0.0, show_default=True, type=float, help="lambda of lambda ||dW_S||^2.")
@click.option("--opener", "openers", multiple=True, help="Opener set O: token text or #ID (repeatable).")
@click.option("--closer", "closers", multiple=True, help="Closer set Cl: token text or #ID (repeatable).")
@click.option("--hold", type=click.Choice(["none", "paragraph"]), default="none", show_default=True,
              help="Rows of the protocol's anchors traces added to the exact-KL term: paragraph = the rows that "
                   "predict a paragraph's first token (after a blank line).")
@click.option("--backend", type=click.Choice(["jax", "numpy"]), default="jax", show_default=True,
              help="jax: float32 jitted steps; numpy: the float64 reference loop.")
@TILE_ROWS
@click.option("--device", type=click.Choice(["cpu", "gpu", "auto"]), default="auto", show_default=True,
              help="Where the full-vocab passes and dev tracking run: cpu = the host numpy path; gpu = JAX's "
                   "CUDA device (exact float32); auto = gpu if JAX sees one, else cpu.")
@click.option("--unregistered", is_flag=True, help="Allow an unregistered or changed protocol (marked).")
@click.option("--workspace", type=click.Path(file_okay=False), default=".exactedit", show_default=True,
              help="Directory holding this project's ledger.")
@click.option("--overwrite", is_flag=True, help="Replace an existing bundle directory.")
@JSON_FLAG
def solve_head_cmd(model, train, dev, test, protocol, out, workspace, overwrite, as_json, openers, closers, device,
                   **flags) -> None:
    """Solve an exact edit of output-head rows under a registered protocol; write a bundle."""
    from exactedit.runs import head_solve_report, solve_head, write_head_bundle
    from exactedit.solvers.head import HeadSolveConfig

    with _bad_parameter():
        cfg = HeadSolveConfig(openers=_head_tokens(openers), closers=_head_tokens(closers), **flags)
    _refuse_clobber({"--out": out}, {"--model": model, "--train": train, "--dev": dev, "--test": test,
                                    "--protocol": protocol})
    result = with_progress("solve head", solve_head, cfg, model=model, train=train, dev=dev, test=test,
                           protocol=protocol, workspace=workspace, command=command_line(), device=device)
    bundle = write_head_bundle(result, out, overwrite=overwrite)
    emit(*head_solve_report(result, bundle), as_json)


@solve.command("wfld")
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True), help="GGUF model.")
@click.option("--phrases", required=True, type=click.Path(dir_okay=False, exists=True),
              help="Banned phrases, one per line ('#' comments).")
@click.option("--train", required=True, multiple=True, type=_DUMP,
              help="Dump of the FTPO targets and the words' legitimate uses to hold (repeatable).")
@click.option("--heldout", multiple=True, type=_DUMP, help="Separate held-out documents, scored only (repeatable).")
@click.option("--collateral", multiple=True, type=_DUMP,
              help="Legitimate uses of the words, scored only: bar (d) (repeatable).")
@click.option("--anchors", required=True, multiple=True, type=_DUMP,
              help="Plain and chat background: metric, special-token holds, bar (e) (repeatable).")
@click.option("--null", "null_", multiple=True, type=_DUMP,
              help="More legitimate uses for the null space, never scored (repeatable).")
@click.option("--protocol", type=click.Path(dir_okay=False, exists=True),
              help="Protocol file whose bars' thresholds and special tokens to use.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Bundle directory to write.")
@click.option("--margin", default=1.0, show_default=True, type=float,
              help="Nats the rejected token must end below its best alternative.")
@click.option("--phrase-margin", "phrase_margins", multiple=True, metavar="PHRASE=NATS",
              help="Margin of one phrase (repeatable).")
@click.option("--same-sense", "same_sense", multiple=True, metavar="PHRASE=WORD[,WORD]",
              help="Paraphrases of a phrase's final token, held with it and never raised (repeatable).")
@click.option("--delta-cho", default=0.5, show_default=True, type=float,
              help="Raise of the natural alternatives (> 0: the freed mass goes to real words).")
@click.option("--alternatives", default=3, show_default=True, type=click.IntRange(1),
              help="Natural alternatives per position (top non-rejected, non-special tokens).")
@click.option("--alt-floor", default=0.01, show_default=True, type=float,
              help="Base probability an alternative needs at its position (the best one is kept anyway).")
@click.option("--alt-pool", default=32, show_default=True, type=click.IntRange(1),
              help="Top base tokens the alternatives and the held variants are drawn from.")
@click.option("--ship", type=click.Choice(["auto", "feedback", "round"]), default="auto", show_default=True,
              help="feedback: choose the shipped codes to keep the held directions; round: ggml's quantizer; "
                   "auto: feedback on coarse types (Q6_K).")
@click.option("--ship-hold-weight", default=1e4, show_default=True, type=float,
              help="Weight of the held directions against the background when shipping by feedback.")
@click.option("--ship-sweeps", default=1, show_default=True, type=click.IntRange(0),
              help="Polish sweeps (single-code moves) after the feedback rounding.")
@click.option("--capitalized/--no-capitalized", default=True, show_default=True,
              help="Also match each phrase with a capital first letter.")
@click.option("--null-rank", default=8, show_default=True, type=click.IntRange(0),
              help="Null-space directions per word (its legitimate uses' top singular vectors).")
@click.option("--null-tol", default=1e-6, show_default=True, type=float,
              help="Singular values below this share of a word's largest are dropped.")
@click.option("--ridge", default=1e-2, show_default=True, type=float,
              help="Ridge of the background metric, relative to its mean diagonal.")
@click.option("--key", type=click.Choice(["dense", "discriminative", "units", "gated"]), default="dense", show_default=True,
              help="The edit's input side: dense (every hh direction); discriminative (per word, the directions "
                   "with the most slop energy per unit of plausible-context energy); units (per word, only the "
                   "FFN units far more active after the prefix than at the word's plausible contexts); gated (one unit of "
                   "the last FFN rewritten as a detector of the phrase's context: its gate and up rows and its "
                   "down column; rmsnorm tails, ffn_down in Q6_K or Q8_0; one phrase per unit).")
@click.option("--key-dims", default=4, show_default=True, type=click.IntRange(1),
              help="Per word, directions (discriminative) or units (units) at most.")
@click.option("--key-floor", default=0.05, show_default=True, type=float,
              help="Plausible contexts: rows where the base gives the word at least this probability.")
@click.option("--key-min-ratio", default=5.0, show_default=True, type=float,
              help="units: a unit's mean |h| after the prefix over its mean at plausible contexts, at least.")
@click.option("--key-null-rank", default=0, show_default=True, type=click.IntRange(0),
              help="Per word, null-space directions inside a discriminative or units key.")
@click.option("--word-holds", default=0, show_default=True, type=click.IntRange(0),
              help="Per word, its likeliest plausible contexts in the train and null dumps (p >= --key-floor, "
                   "outside the slop contexts) whose logit the solve holds (soft, --word-hold-eps); 0: none.")
@click.option("--word-hold-eps", default=1e-4, show_default=True, type=float,
              help="Relative Tikhonov weight of the word holds (a slop-like context may give).")
@click.option("--strength", default=1.0, show_default=True, type=float,
              help="Every FTPO target scaled by this (the edit's strength).")
@click.option("--strength-grid", "strength_grid", default="", metavar="S,S,...",
              help="Choose the strength on dev among these: the largest whose held-out (dev) traces' "
                   "legitimate uses pass bar (d); the solve runs at --strength, then at the chosen one.")
@click.option("--unmeasured-strength", default=0.3, show_default=True, type=float,
              help="With --strength-grid: the most a phrase gets whose word has too few legitimate uses on dev "
                   "for bar (d) to measure (the protocol's collateral_min_uses); the report names the word.")
@click.option("--background", type=click.Choice(["anchors", "anchors+train"]), default="anchors", show_default=True,
              help="Rows of the background metric: the anchors, or the anchors and the train dumps (less "
                   "every slop context).")
@click.option("--special-rows", default=256, show_default=True, type=click.IntRange(0),
              help="Anchor rows whose special-token logits are held.")
@click.option("--special", "specials", multiple=True,
              help="Special token to hold (repeatable; default: the model's own, read from its GGUF).")
@click.option("--turn-end", default="", help="The turn-end special token (default: the model's own).")
@click.option("--gn-iters", default=4, show_default=True, type=click.IntRange(1), help="Gauss-Newton rounds.")
@click.option("--gn-tol", default=0.02, show_default=True, type=float,
              help="Stop once no exact logit moves more than this in a round.")
@click.option("--target-eps", default=1e-6, show_default=True, type=float,
              help="Relative Tikhonov weight of the target conditions.")
@click.option("--hold-eps", default=1e-9, show_default=True, type=float,
              help="Relative Tikhonov weight of the special-token holds.")
@click.option("--same-doc-heldout", default=0.33, show_default=True, type=float,
              help="Share of the FTPO positions held out (bar (b)), at most that share of each train document's and of each banned word's.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the same-document hold-out.")
@click.option("--heldout-role", type=click.Choice(["dev", "test"]), default="dev", show_default=True,
              help="Split role of the --heldout documents in the bars.")
@click.option("--backend", type=click.Choice(["jax", "numpy"]), default="jax", show_default=True,
              help="jax: float32 VJPs; numpy: the float64 reference.")
@TILE_ROWS
@click.option("--device", type=click.Choice(["cpu", "gpu", "auto"]), default="auto", show_default=True,
              help="Where the full-vocab passes run: cpu = the host path; gpu = JAX's CUDA device (exact "
                   "float32); auto = gpu if JAX sees one, else cpu.")
@click.option("--unregistered", is_flag=True, help="Allow an unregistered or changed --protocol (marked).")
@click.option("--workspace", type=click.Path(file_okay=False), default=".exactedit", show_default=True,
              help="Directory holding this project's ledger (checked when --protocol is given).")
@click.option("--overwrite", is_flag=True, help="Replace an existing bundle directory.")
@JSON_FLAG
def solve_wfld_cmd(model, phrases, train, heldout, collateral, anchors, null_, protocol, out, phrase_margins,
                   same_sense, specials, workspace, overwrite, as_json, device, **flags) -> None:
    """Solve the anti-slop edit of the last layer's shared-expert down projection; write a bundle."""
    from exactedit.runs import WfldInputs, solve_wfld, wfld_solve_report
    from exactedit.solvers.l47 import WfldConfig, parse_phrase_margin, parse_same_sense

    with _bad_parameter():
        flags["strength_grid"] = _floats(flags["strength_grid"], "--strength-grid")
        cfg = WfldConfig(phrase_margins=tuple(parse_phrase_margin(p) for p in phrase_margins),
                         same_sense=tuple(parse_same_sense(p) for p in same_sense),
                         specials=tuple(specials), **flags)
    inputs = WfldInputs(model, phrases, tuple(train), tuple(heldout), tuple(collateral), tuple(anchors),
                        tuple(null_), protocol)
    _refuse_clobber({"--out": out}, {"--model": model, "--phrases": phrases, "--train": train, "--heldout": heldout,
                                    "--collateral": collateral, "--anchors": anchors, "--null": null_,
                                    "--protocol": protocol})
    r = with_progress("solve wfld", solve_wfld, cfg, inputs, out, overwrite=overwrite, workspace=workspace,
                      device=device, command=command_line())
    emit(*wfld_solve_report(r), as_json)


# ---- verify: engine, live, shaping ---------------------------------------------------------------

@main.group()
def verify() -> None:
    """Live verification on a compiled engine."""


@verify.command("engine")
@click.option("--command", "template", default=None,
              help="Engine command template with {gguf} {tokens} {logits} "
                   "(default: strata_window_cli --metal-gguf {gguf} --tokens-file {tokens} --logits-out {logits}).")
@click.option("--extra", default="", help="Extra flags appended to the command.")
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True), help="Base GGUF.")
@click.option("--bundle", required=True, type=click.Path(file_okay=False, exists=True), help="Bundle directory.")
@click.option("--dump", "dump_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="Dump whose tokens the engine reads and whose activations predict its logits.")
@click.option("--match-engine", type=click.Choice(["llamacpp"]), default=None,
              help="Predict with this engine's arithmetic (default: exact float arithmetic).")
@_tolerance
@JSON_FLAG
def verify_engine_cmd(template, extra, model, bundle, dump_dir, match_engine, kl_mean, kl_max, top1, max_abs_rel,
                      as_json) -> None:
    """Apply BUNDLE, run the production engine's command on base and edited files, compare with the
    offline prediction from DUMP; exit 1 on a failure."""
    from exactedit.native.verify import EngineCommand, render_report, verify_engine

    report = with_progress("engine check", verify_engine, EngineCommand.parse(template, extra), model, bundle,
                           dump_dir, tolerance=_tolerance_of(kl_mean, kl_max, top1, max_abs_rel),
                           match_engine=match_engine)
    emit(report, render_report(report), as_json)
    if not report.passed:
        sys.exit(1)


@verify.command("live")
@click.option("--engine", "engine_name", type=click.Choice(["llamacpp"]), default="llamacpp", show_default=True)
@click.option("--model", type=MODEL, required=True, help="Base GGUF path, or a public model name (qwen).")
@click.option("--bundle", required=True, type=click.Path(file_okay=False, exists=True), help="Bundle directory.")
@click.option("--tokens", type=click.Path(dir_okay=False, exists=True), help="int32 token ids file.")
@click.option("--text", type=click.Path(dir_okay=False, exists=True), help="A text file to tokenize.")
@click.option("--edited", type=click.Path(dir_okay=False, exists=True),
              help="Check this already edited GGUF instead of applying the bundle.")
@_tolerance
@_engine_settings
@JSON_FLAG
def verify_live_cmd(engine_name, model, bundle, tokens, text, edited, kl_mean, kl_max, top1, max_abs_rel,
                    as_json, **flags) -> None:
    """Apply BUNDLE, run the engine on base and edited models, compare with the offline prediction."""
    from exactedit.native.verify import render_report, verify_live

    toks = _read_tokens_arg(tokens, text, model)
    report = with_progress("live check", verify_live, model, bundle, toks, settings=_settings(**flags),
                           tolerance=_tolerance_of(kl_mean, kl_max, top1, max_abs_rel), edited=edited)
    emit(report, render_report(report), as_json)
    if not report.passed:
        sys.exit(1)


@verify.command("shaping")
@click.option("--model", type=MODEL, required=True, help="GGUF path, or a public model name (qwen, gemma).")
@click.option("--rules", required=True, type=click.Path(dir_okay=False, exists=True), help="Compiled rules (JSON).")
@click.option("--prompts", required=True, type=click.Path(dir_okay=False, exists=True), help="One user prompt per line.")
@_gen_options
@click.option("--persona/--no-persona", default=None, help="Override the rules' persona gate.")
@_engine_settings
@JSON_FLAG
def verify_shaping_cmd(model, rules, prompts, max_new, temperature, top_k, seeds, persona, as_json, **flags) -> None:
    """Generate with the rules live; the sampler's logits must equal the offline shaping, bitwise."""
    from exactedit.native.shaping import render_shaping_verify, verify_shaping

    r = with_progress("generating", verify_shaping, model, rules, _lines(prompts),
                      config=_gen_config(max_new, temperature, top_k), seeds=seeds or (0,),
                      settings=_settings(**flags), persona=persona)
    emit(r, render_shaping_verify(r), as_json)
    if not r.passed:
        sys.exit(1)


if __name__ == "__main__":
    sys.exit(main())
