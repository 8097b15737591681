"""The inputs every loop command reads: a loop's bundled files for a public model (`exactedit demo
--model NAME`: runs/bundled/NAME/LOOP/, with the model's texts/ and chat_template.jinja one folder up),
the user's own files in their place, one-per-line text files, and the bundled settings TOML."""
from __future__ import annotations

from pathlib import Path

from exactedit.errors import FieldError
from exactedit.files import MAX_TEXT_BYTES, check_regular, decode_utf8, read_regular, text_newlines

BUNDLED = Path(__file__).resolve().parent.parent / "bundled"
MAX_LINES_BYTES = 16 << 20      # a one-per-line file (prompts, watch list, same-sense words), read whole

__all__ = ["BUNDLED", "InputError", "MAX_LINES_BYTES", "bundled_dir", "bundled_file", "bundled_template", "lines",
           "read_settings", "text_files"]


class InputError(FieldError):
    """A loop's input file cannot be used: not a regular file, too large, not UTF-8, a directory of
    no texts (names the file, the field and why)."""


def lines(path) -> tuple[str, ...]:
    """A text file's lines, stripped, without blank lines and # comments: a regular file (a FIFO or
    a device is refused, not waited on) of at most MAX_LINES_BYTES, UTF-8, else InputError."""
    text = decode_utf8(read_regular(path, MAX_LINES_BYTES, InputError, "lines"), path, InputError, "lines")
    rows = text_newlines(text).split("\n")
    return tuple(line.strip() for line in rows if line.strip() and not line.lstrip().startswith("#"))


def bundled_dir(model, loop: str, marker: str | None = None) -> Path | None:
    """runs/bundled/MODEL/LOOP/ when `model` names a public model with bundled inputs for `loop` (and,
    where `marker` is given, that file in it), else None (a path is never a bundled name)."""
    name = str(model)
    folder = BUNDLED / name / loop
    if "/" in name or name in ("", ".", "..") or not folder.is_dir():
        return None
    return folder if marker is None or (folder / marker).is_file() else None


def bundled_file(given, bundled: Path | None, flag: str, filename: str, model, error: type[Exception]) -> Path:
    """The file given for --FLAG, else the bundled model's `filename`; neither: `error` naming the flag."""
    if given is not None:
        return Path(given)
    path = (bundled or BUNDLED / "-") / filename
    if not path.is_file():
        raise error(f"--{flag.replace('_', '-')}: not given, and {model!r} has no bundled {filename} (bundled "
                    f"inputs: {sorted(p.name for p in BUNDLED.iterdir())}); give the file")
    return path


def bundled_template(given, bundled: Path | None):
    """The chat template a run renders with (quant.model.chat_template.GivenTemplate): the file given,
    else the bundled model's chat_template.jinja (beside its loops' folders); None: the GGUF's own."""
    from exactedit.native.llamacpp.chat import given_template

    path = given
    if path is None and bundled and (bundled.parent / "chat_template.jinja").is_file():
        path = bundled.parent / "chat_template.jinja"
    return None if path is None else given_template(path)


MAX_TEXTS_BYTES = 4 * MAX_TEXT_BYTES     # --texts all together (each file is also capped at MAX_TEXT_BYTES)


def text_files(given, bundled: Path | None, flag: str = "--texts") -> tuple[Path, ...]:
    """The plain texts of a run: each given path, a directory standing for its *.txt files (sorted);
    none given: the bundled model's texts/ folder (beside its loops' folders), if any. Each must be
    a regular file of at most MAX_TEXT_BYTES (a FIFO, a device, a symlink loop refused), and a
    directory given must hold a .txt file, and all of them together at most MAX_TEXTS_BYTES (each is
    read whole and tokenized: a directory of many capped files was unbounded): else InputError naming
    the path and `flag`."""
    if given is None:
        folder = (bundled or BUNDLED / "-" / "-").parent / "texts"
        return tuple(sorted(folder.glob("*.txt"))) if folder.is_dir() else ()
    out: list[Path] = []
    total = 0
    for t in given:
        p = Path(t)
        found = sorted(p.glob("*.txt")) if p.is_dir() else [p]
        if not found:
            raise InputError(p, flag, "a directory holding no .txt files: no texts")
        for f in found:
            check_regular(f, MAX_TEXT_BYTES, InputError, flag)
            total += f.stat().st_size
            if total > MAX_TEXTS_BYTES:
                raise InputError(f, flag, f"the texts up to this file hold {total} bytes, over the limit of "
                                          f"{MAX_TEXTS_BYTES} for all texts together: give fewer or smaller files")
        out += found
    return tuple(out)


def read_settings(path: Path, cls, error: type[Exception], *, exclude=(), tuples=None) -> dict:
    """A bundled TOML of `cls`'s fields (field = value), checked against each field's default: an
    unknown or excluded field, or a value of the wrong type, raises `error` naming the file and the
    field. `tuples`: field -> element type of the fields that are lists. A field whose default is
    None takes a string when its annotation says str."""
    import dataclasses
    import tomllib

    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise error(f"{path}: cannot read as TOML ({exc})") from None
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in exclude}
    tuples = tuples or {}
    out = {}
    for key, value in raw.items():
        if key not in fields:
            raise error(f"{path}: {key}: not a setting here (one of {sorted(fields)})")
        f = fields[key]
        default = f.default
        if key in tuples:
            if not isinstance(value, list) or not all(isinstance(v, (tuples[key], int)) for v in value):
                raise error(f"{path}: {key}: expected a list of {tuples[key].__name__}, got {value!r}")
            value = tuple(tuples[key](v) for v in value)
        else:
            want = str if default is None and str(f.type).startswith("str") else None if default is None else type(default)
            if want is not None and (isinstance(value, bool) != (want is bool) or (
                    not isinstance(value, want) and not (want is float and isinstance(value, int)))):
                raise error(f"{path}: {key}: expected {want.__name__}, got {value!r}")
        out[key] = float(value) if isinstance(default, float) else value
    return out
