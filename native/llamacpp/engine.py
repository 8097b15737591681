"""llama.cpp (through llama-cpp-python's ctypes API) as a compiled engine.

`LlamaEngine(path, settings)` loads a GGUF once; `engine.evaluate(tokens, capture=...)` runs one
sequence from position 0 with every position's logits requested and returns an `EngineRun`:
full-vocab float32 logits per position, the tensors captured by name through ggml's evaluation
callback (`cb_eval`), and the micro-batch sizes the graph actually ran with.

Why the settings are recorded: llama.cpp's logits depend on how a sequence is cut into batches
(one 512-token batch and token-by-token decoding differ by KL 2e-3 to 9e-3), and its CPU matmuls
pick their kernel by the number of rows in the micro-batch. A dump and the check of an edit made
from it must therefore run with the same `EngineSettings`; `EngineSettings.as_meta()` is what a
dump records and `EngineSettings.from_meta()` reads it back.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from exactedit.errors import FieldError

# ggml_type ids of the tensors a capture can copy (f32 is all a graph node of interest holds).
_GGML_TYPE_F32 = 0
# llama_flash_attn_type: -1 auto, 0 disabled, 1 enabled.
_FLASH_ATTN = {"off": 0, "on": 1}
# Environment switches of ggml-cpu that change which matmul kernel runs (recorded in every run).
_NUMERICS_ENV = ("GGML_CPU_TILED_MM", "GGML_CPU_TILED_MM_FORCE", "GGML_CPU_DISABLE_FUSION")


class EngineError(FieldError):
    """The engine is missing, refused a model, or failed while evaluating."""


# llama.cpp takes the token counts as uint32 and the threads as int32: a larger value wrapped (an
# n_ctx of 2^32 + 2048 ran as 2048 while the dump recorded the other), a million threads crashed
# it, and the batch of a huge n_batch was allocated token by token (a hang)
MAX_SETTING_TOKENS = 1 << 24
MAX_THREADS = 512            # ggml's GGML_MAX_N_THREADS
MAX_GPU_LAYERS = 1 << 16     # n_gpu_layers is an int32; no model has more blocks than this
ALL_LAYERS = -1              # n_gpu_layers: every layer offloaded (llama-cpp-python's -1, passed on as 2^31 - 1)


def gpu_offload() -> bool:
    """Whether the installed llama-cpp-python was built with a GPU backend (llama_supports_gpu_offload);
    False when it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return False
    return bool(llama_cpp.llama_supports_gpu_offload())


def default_gpu_layers() -> int:
    """The engine's default `n_gpu_layers` of the CLI's --gpu-layers: every layer (ALL_LAYERS) when
    llama-cpp-python was built with a GPU backend, else 0 (the CPU backend)."""
    return ALL_LAYERS if gpu_offload() else 0


@dataclass(frozen=True)
class EngineSettings:
    """How llama.cpp evaluates a sequence. Every field changes numbers, so all are recorded.

    n_batch: tokens handed to one `llama_decode` call (1 = token-by-token decoding);
    n_ubatch: the micro-batch the graph runs with (<= n_batch); n_ctx: context size (>= tokens);
    n_threads: CPU threads; flash_attn: "off" or "on"; n_gpu_layers: the model's layers offloaded to a
    GPU backend (-1: all, 0: none). Live verification is bit-exact on the CPU backend (0): the
    engine-faithful prediction does the CPU's operations, a GPU's kernels round otherwise.

    `as_meta()` leaves n_gpu_layers out when it is 0, so a CPU run records (and a dump, a run's stage
    key holds) exactly what it did before the setting existed, and `from_meta` reads a record
    without it as 0."""

    n_ctx: int = 2048
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 2
    flash_attn: str = "off"
    n_gpu_layers: int = 0

    def __post_init__(self):
        for key in ("n_ctx", "n_batch", "n_ubatch", "n_threads"):
            value = getattr(self, key)
            top = MAX_THREADS if key == "n_threads" else MAX_SETTING_TOKENS
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
                raise EngineError("EngineSettings", key, f"expected an integer in [1, {top}], got {value!r}")
        g = self.n_gpu_layers
        if not isinstance(g, int) or isinstance(g, bool) or not ALL_LAYERS <= g <= MAX_GPU_LAYERS:
            raise EngineError("EngineSettings", "n_gpu_layers",
                              f"expected an integer in [{ALL_LAYERS}, {MAX_GPU_LAYERS}] (-1: all layers), got {g!r}")
        if self.n_ubatch > self.n_batch:
            raise EngineError("EngineSettings", "n_ubatch",
                              f"{self.n_ubatch} exceeds n_batch {self.n_batch}")
        if self.flash_attn not in _FLASH_ATTN:
            raise EngineError("EngineSettings", "flash_attn",
                              f"expected one of {sorted(_FLASH_ATTN)}, got {self.flash_attn!r}")

    def as_meta(self) -> dict:
        meta = asdict(self)
        if not meta["n_gpu_layers"]:        # the CPU backend: recorded as before the setting existed
            del meta["n_gpu_layers"]
        return meta

    @property
    def offloaded(self) -> bool:
        """Whether layers run on a GPU backend (then live verification is not bit-exact: class doc)."""
        return self.n_gpu_layers != 0

    @classmethod
    def from_meta(cls, meta: Mapping, where="meta") -> EngineSettings:
        if not isinstance(meta, Mapping):
            raise EngineError(where, "engine_settings", f"expected an object, got {meta!r}")
        unknown = sorted(set(meta) - set(cls.__dataclass_fields__))
        if unknown:
            raise EngineError(where, "engine_settings", f"unknown keys {unknown}")
        return cls(**dict(meta))


@dataclass(frozen=True)
class EngineRun:
    """One evaluated sequence: logits [T, V] float32 (row t predicts token t+1), captured tensors
    by graph name ([T, width] float32, rows in token order), and the micro-batch sizes used."""

    tokens: np.ndarray
    logits: np.ndarray
    captured: Mapping[str, np.ndarray]
    ubatch_sizes: tuple[int, ...]
    settings: EngineSettings
    engine: Mapping[str, str] = field(default_factory=dict)

    def meta(self) -> dict:
        """What a dump or a report records about how these numbers were made."""
        return {"engine": dict(self.engine), "engine_settings": self.settings.as_meta(),
                "ubatch_sizes": list(self.ubatch_sizes)}


def _llama():
    try:
        import llama_cpp
        from llama_cpp import llama_cpp as lib
    except ImportError as exc:  # the engine lives in the `live` extra
        raise EngineError("llama-cpp-python", "import",
                          f"not installed ({exc}); install the live extra: pip install -e '.[live]'") from None
    return llama_cpp, lib


class _TensorHead(ctypes.Structure):
    """The leading fields of ggml's `struct ggml_tensor` (type, buffer, ne[4], nb[4])."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4)]


class _Capture:
    """Collects named f32 graph tensors during `llama_decode`; rows accumulate per micro-batch."""

    def __init__(self, names: Sequence[str], ggml):
        self.names = frozenset(names)
        self.parts: dict[str, list[np.ndarray]] = {n: [] for n in self.names}
        self.error: str | None = None
        self._ggml = ggml

    def __call__(self, tensor, ask, _user_data) -> bool:
        try:
            name = self._ggml.ggml_get_name(tensor).decode("utf-8", "replace")
            if ask:
                return name in self.names
            if name not in self.names:
                return True
            head = _TensorHead.from_address(tensor)
            if head.type != _GGML_TYPE_F32 or not self._ggml.ggml_is_contiguous(tensor):
                self.error = f"tensor {name}: expected a contiguous f32 tensor, got ggml type {head.type}"
                return False
            ne = [int(head.ne[i]) for i in range(4)]
            if ne[2] != 1 or ne[3] != 1:
                self.error = f"tensor {name}: expected 2 dims, got ne={ne}"
                return False
            out = np.empty((ne[1], ne[0]), dtype=np.float32)
            self._ggml.ggml_backend_tensor_get(tensor, out.ctypes.data, 0, out.nbytes)
            self.parts[name].append(out)
            return True
        except Exception as exc:  # noqa: BLE001 - an exception must not cross the C boundary
            self.error = f"capture callback failed: {exc!r}"
            return False  # aborts the graph

    def reset(self) -> None:
        """Forget what was seen (the next sequence of a context: LlamaEngine.sequences)."""
        self.parts = {n: [] for n in self.names}
        self.error = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The tensors seen, rows concatenated (a name the graph never produced is absent)."""
        return {n: np.concatenate(p, axis=0) for n, p in self.parts.items() if p}


def _ggml_lib():
    from llama_cpp._ggml import libggml

    libggml.ggml_get_name.argtypes = [ctypes.c_void_p]
    libggml.ggml_get_name.restype = ctypes.c_char_p
    libggml.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
    libggml.ggml_is_contiguous.restype = ctypes.c_bool
    libggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                ctypes.c_size_t]
    libggml.ggml_backend_tensor_get.restype = None
    return libggml


_LOG_CALLBACK = None  # the C logger callback must outlive every model; it only drops messages


def _silence(lib) -> None:
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:
        _LOG_CALLBACK = lib.llama_log_callback(lambda level, text, user_data: None)
        lib.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))


class LlamaEngine:
    """A GGUF loaded into llama.cpp: its CPU backend, or with `settings.n_gpu_layers` layers on a
    GPU backend (refused when llama-cpp-python has none). Close it (or use `with`) to free the model."""

    def __init__(self, model_path, settings: EngineSettings | None = None):
        self.path = Path(model_path)
        self.settings = settings or EngineSettings()
        if not self.path.is_file():
            raise EngineError(self.path, "model", "does not exist or is not a regular file")
        llama_cpp, lib = _llama()
        self._lib = lib
        _silence(lib)
        lib.llama_backend_init()
        if self.settings.offloaded and not bool(lib.llama_supports_gpu_offload()):
            raise EngineError(self.path, "n_gpu_layers", f"{self.settings.n_gpu_layers} layers to offload, but the "
                              "installed llama-cpp-python was built without a GPU backend: give 0 (--gpu-layers 0)")
        mparams = lib.llama_model_default_params()
        mparams.use_mmap = True
        g = self.settings.n_gpu_layers
        mparams.n_gpu_layers = 0x7FFFFFFF if g == ALL_LAYERS else g     # as llama-cpp-python's Llama passes -1
        self._model = lib.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            raise EngineError(self.path, "model", "llama.cpp could not load this GGUF")
        self._vocab = lib.llama_model_get_vocab(self._model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self.n_embd = int(lib.llama_model_n_embd(self._model))
        self.n_layer = int(lib.llama_model_n_layer(self._model))
        self.info = {"llama_cpp_python": llama_cpp.__version__,
                     "system": lib.llama_print_system_info().decode("utf-8", "replace").strip(),
                     **{k: os.environ[k] for k in _NUMERICS_ENV if k in os.environ}}

    def __enter__(self) -> LlamaEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if getattr(self, "_model", None):
            self._lib.llama_model_free(self._model)
            self._model = None

    # ---- tokens ---------------------------------------------------------------------------------
    def is_eog(self, token: int) -> bool:
        """Whether llama.cpp ends generation on `token` (the model's end-of-generation tokens)."""
        return bool(self._lib.llama_vocab_is_eog(self._vocab, int(token)))

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> np.ndarray:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (self._lib.llama_token * cap)()
        n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise EngineError(self.path, "tokenize", f"needs {-n} tokens, more than {cap}")
        return np.array(buf[:n], dtype=np.int32)

    def bos_if_added(self) -> int | None:
        """The BOS id when the vocabulary adds one to a tokenized text (llama_vocab_get_add_bos), else None."""
        if not self._lib.llama_vocab_get_add_bos(self._vocab):
            return None
        return int(self._lib.llama_vocab_bos(self._vocab))

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = self._lib.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, True)
        return buf.raw[:max(n, 0)]

    # ---- evaluation -----------------------------------------------------------------------------
    def evaluate(self, tokens, *, capture: Sequence[str] = (),
                 progress: Callable[[int, int], None] | None = None) -> EngineRun:
        """Run `tokens` from position 0 in a fresh context, logits for every position."""
        with self.sequences(capture=capture) as run:
            return run(tokens, progress)

    @contextlib.contextmanager
    def sequences(self, *, capture: Sequence[str] = ()):
        """One context for many sequences: yields `run(tokens, progress=None) -> EngineRun`, which
        evaluates `tokens` as `evaluate` does, the context's memory cleared first (KV cells and
        their data zeroed, as llama.cpp leaves a new context's), so each run gives the numbers of a
        fresh context (tests/native/llamacpp/test_live_sequences.py) without making one per
        sequence (a corpus window's prefill is a few hundred ms, a context ~50 ms)."""
        lib = self._lib
        cap = _Capture(capture, _ggml_lib()) if capture else None
        callback = lib.ggml_backend_sched_eval_callback(cap) if cap else None
        ctx = self._context(callback)
        held = {"batch": None, "size": 0}

        def run(tokens, progress: Callable[[int, int], None] | None = None) -> EngineRun:
            return self._sequence(ctx, held, cap, tokens, progress)

        try:
            yield run
        finally:
            if held["batch"] is not None:
                lib.llama_batch_free(held["batch"])
            lib.llama_free(ctx)

    def _sequence(self, ctx, held: dict, cap: _Capture | None, tokens, progress) -> EngineRun:
        lib, s = self._lib, self.settings
        toks = np.asarray(tokens)
        if toks.ndim != 1 or toks.size == 0 or not np.issubdtype(toks.dtype, np.integer):
            raise EngineError(self.path, "tokens", f"expected a non-empty 1-D integer array, got {toks.shape}")
        if int(toks.min()) < 0 or int(toks.max()) >= self.n_vocab:
            raise EngineError(self.path, "tokens", f"ids must lie in [0, {self.n_vocab})")
        if toks.size > s.n_ctx:
            raise EngineError(self.path, "tokens", f"{toks.size} tokens exceed n_ctx {s.n_ctx}")
        toks = toks.astype(np.int32)
        T, V = toks.size, self.n_vocab
        if held["size"] < min(s.n_batch, T):      # a decode call takes at most T tokens (a huge n_batch is not allocated)
            if held["batch"] is not None:
                lib.llama_batch_free(held["batch"])
                held["batch"] = None
            held["batch"], held["size"] = lib.llama_batch_init(min(s.n_batch, T), 0, 1), min(s.n_batch, T)
        batch = held["batch"]
        lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
        if cap is not None:
            cap.reset()
        logits = np.empty((T, V), dtype=np.float32)
        for start in range(0, T, s.n_batch):
            n = min(s.n_batch, T - start)
            for i in range(n):
                batch.token[i] = int(toks[start + i])
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            batch.n_tokens = n
            rc = lib.llama_decode(ctx, batch)
            if cap is not None and cap.error:
                raise EngineError(self.path, "capture", cap.error)
            if rc != 0:
                raise EngineError(self.path, "llama_decode", f"returned {rc} at token {start}")
            out = lib.llama_get_logits(ctx)
            logits[start:start + n] = np.ctypeslib.as_array(out, shape=(n * V,)).reshape(n, V)
            if progress is not None:
                progress(start + n, T)
        captured = cap.arrays() if cap else {}
        for name, arr in captured.items():
            if arr.shape[0] != T:
                raise EngineError(self.path, "capture", f"tensor {name} has {arr.shape[0]} rows for "
                                  f"{T} tokens (is the name right, and are all positions kept?)")
        ubatches = _ubatch_sizes(cap, T, s)
        return EngineRun(toks, logits, captured, ubatches, s, dict(self.info))

    def _context(self, callback, *, n_seq: int = 1, n_ctx: int | None = None):
        """A fresh llama.cpp context with these settings; `n_seq` > 1 gives that many sequences,
        each its own KV stream of n_ctx / n_seq cells (batched sampling, native/llamacpp/batched.py)."""
        lib, s = self._lib, self.settings
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = s.n_ctx if n_ctx is None else int(n_ctx)
        cparams.n_batch = s.n_batch
        cparams.n_ubatch = s.n_ubatch
        cparams.n_seq_max = int(n_seq)
        if n_seq > 1:
            cparams.kv_unified = False
        cparams.n_threads = s.n_threads
        cparams.n_threads_batch = s.n_threads
        cparams.flash_attn_type = _FLASH_ATTN[s.flash_attn]
        cparams.no_perf = True
        if callback is not None:
            cparams.cb_eval = callback
            cparams.cb_eval_user_data = None
        ctx = lib.llama_init_from_model(self._model, cparams)
        if not ctx:
            raise EngineError(self.path, "context", f"llama.cpp refused the context settings {s}")
        return ctx


def sampler_chain(lib, top_k: int, temperature: float, seed: int, first=()):
    """llama.cpp's sampler chain of every generation loop here: `first` (samplers of ours, in
    order), then top-k, temperature and the seeded `dist` sampler."""
    chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
    for smp in first:
        lib.llama_sampler_chain_add(chain, smp)
    lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(top_k))
    lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(temperature))
    lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(seed))
    return chain


def _ubatch_sizes(cap: _Capture | None, T: int, s: EngineSettings) -> tuple[int, ...]:
    """The micro-batch sizes the graph ran with: seen by the capture when there is one, else
    derived from the settings (a batch of n_batch tokens is split into n_ubatch pieces)."""
    if cap is not None:
        for parts in cap.parts.values():
            if parts:
                return tuple(int(p.shape[0]) for p in parts)
    sizes = []
    for start in range(0, T, s.n_batch):
        n = min(s.n_batch, T - start)
        sizes += [min(s.n_ubatch, n - u) for u in range(0, n, s.n_ubatch)]
    return tuple(sizes)
