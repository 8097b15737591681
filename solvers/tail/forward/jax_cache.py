"""JAX's persistent compilation cache and a compile counter.

The cache: XLA programs compiled once are kept on disk and reused by the next process, so a fresh
`exactedit solve ...` on a GPU does not pay the compiles again. On by default, in
$XDG_CACHE_HOME/exactedit/jax (~/.cache/exactedit/jax when XDG_CACHE_HOME is unset);
EXACTEDIT_JAX_CACHE=PATH puts it elsewhere, EXACTEDIT_JAX_CACHE=off turns it off; without
EXACTEDIT_JAX_CACHE, JAX's own JAX_COMPILATION_CACHE_DIR is kept when set. Every program is
cached, however small or quick to compile (thresholds at zero). `enable_compilation_cache` is
called where the device configuration is set up (`solvers.tail.forward.device`); `compilation_cache_state`
is what the benches report.

The counter: `CompileCounter` listens to JAX's monitoring events while it is open and counts the
backend compiles (XLA compiles and persistent-cache loads, `/jax/core/compile/backend_compile_duration`),
their seconds, the persistent-cache hits and the traces.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from exactedit.errors import ExacteditError

ENV = "EXACTEDIT_JAX_CACHE"
OFF = ("off", "0", "no", "false", "none")

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_SAVED_EVENT = "/jax/compilation_cache/compile_time_saved_sec"


class JaxCacheError(ExacteditError):
    """The compilation cache directory cannot be created."""


def cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The cache directory the environment asks for (None: off): EXACTEDIT_JAX_CACHE (a path or
    off), else JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/exactedit/jax or ~/.cache/exactedit/jax."""
    env = os.environ if environ is None else environ
    value = env.get(ENV, "").strip()
    if value.lower() in OFF:
        return None
    if value:
        return str(Path(value).expanduser())
    if env.get("JAX_COMPILATION_CACHE_DIR", "").strip():    # JAX's own variable, when set, is kept
        return str(Path(env["JAX_COMPILATION_CACHE_DIR"].strip()).expanduser())
    base = env.get("XDG_CACHE_HOME", "").strip() or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return str(Path(base).expanduser() / "exactedit" / "jax")


def enable_compilation_cache(environ: Mapping[str, str] | None = None) -> dict:
    """Point JAX's persistent compilation cache at `cache_dir(environ)` (or turn it off), with the
    size and compile-time thresholds at zero so every program is cached. Idempotent; a change of
    directory (or on/off) after JAX has compiled something resets JAX's cache state so it applies.
    Returns `compilation_cache_state()`."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    path = cache_dir(environ)
    cfg = jax.config
    was = (cfg.jax_compilation_cache_dir, cfg.jax_enable_compilation_cache)
    want = {"jax_enable_compilation_cache": False} if path is None else {
        "jax_enable_compilation_cache": True, "jax_compilation_cache_dir": path,
        "jax_persistent_cache_min_compile_time_secs": 0.0, "jax_persistent_cache_min_entry_size_bytes": -1}
    if path is not None:
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise JaxCacheError(f"JAX compilation cache {path}: cannot create the directory ({e.strerror}); "
                                f"set {ENV}=PATH to another directory or {ENV}=off") from None
    for name, value in want.items():
        if getattr(cfg, name) != value:
            cfg.update(name, value)
    if (cfg.jax_compilation_cache_dir, cfg.jax_enable_compilation_cache) != was:
        cc.reset_cache()
    return compilation_cache_state()


def compilation_cache_state() -> dict:
    """{"dir": the directory or None, "on": whether JAX will use it} for reports."""
    import jax

    path = jax.config.jax_compilation_cache_dir
    return {"dir": path, "on": bool(path) and bool(jax.config.jax_enable_compilation_cache)}


class CompileCounter:
    """Counts JAX's backend compiles while open: `with CompileCounter() as c: ...; c.to_dict()`."""

    def __init__(self):
        self.compiles = 0
        self.compile_s = 0.0
        self.traces = 0
        self.cache_hits = 0
        self.saved_s = 0.0
        self.phases: dict[str, dict] = {}
        self._last = (0, 0.0)

    def _duration(self, event: str, seconds: float, **_):
        if event == COMPILE_EVENT:
            self.compiles += 1
            self.compile_s += float(seconds)
        elif event == TRACE_EVENT:
            self.traces += 1
        elif event == CACHE_SAVED_EVENT:
            self.saved_s += float(seconds)

    def _event(self, event: str, **_):
        if event == CACHE_HIT_EVENT:
            self.cache_hits += 1

    def __enter__(self) -> "CompileCounter":
        import jax.monitoring as mon

        mon.register_event_duration_secs_listener(self._duration)
        mon.register_event_listener(self._event)
        return self

    def __exit__(self, *exc) -> None:
        import jax.monitoring as mon

        for name, fn in (("unregister_event_duration_listener", self._duration),
                         ("unregister_event_listener", self._event)):
            try:
                getattr(mon, name)(fn)
            except (AttributeError, ValueError, AssertionError):  # an older JAX without unregistering
                pass

    def mark(self, phase: str) -> None:
        """Attribute the compiles since the previous mark (or the start) to `phase`."""
        n, s = self._last
        self.phases[phase] = {"compiles": self.compiles - n, "compile_s": round(self.compile_s - s, 3)}
        self._last = (self.compiles, self.compile_s)

    def to_dict(self) -> dict:
        """compiles (XLA compiles + persistent-cache loads), their seconds, cache hits, fresh compiles
        (not from the cache), the seconds the hits saved, traces, and the compiles of each marked phase."""
        d = {"compiles": self.compiles, "compile_s": round(self.compile_s, 3), "cache_hits": self.cache_hits,
             "fresh_compiles": self.compiles - self.cache_hits,
             "compile_time_saved_s": round(self.saved_s, 3), "traces": self.traces}
        if self.phases:
            d["by_phase"] = dict(self.phases)
        return d
