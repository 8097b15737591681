"""A loop's settings checked before anything runs: `exactedit antislop` (and `demo --model`, the same
run) and `exactedit persona`. Each check returns the problems it finds, one string per setting that
names it (its field, and its flag), so that a config refuses every bad setting in one error, not one
per run, and before the minutes of generation a setting used only by a later stage would waste:
- integers of their range, numbers finite and in theirs (a NaN compares False with every bound);
  counts with an upper bound where a larger one is no run's but a memory or time bomb found only
  after the generation: replies per prompt at most MAX_SAMPLES (each reply's seed is listed and
  each reply held), bootstrap resamples at most MAX_BOOT (their weights are an [n_boot, prompts]
  float64 array);
- seeds: the run's `seed` and every seed it derives from it (one per reply: seed + i for the data
  replies, seed + RATE_SEED + i for the rate replies) in llama.cpp's range, 0 <= seed < SEED_LIMIT
  (native/llamacpp/generate.py: the engine takes 32 bits, so a larger seed wraps to another one,
  and -1 means "draw a random seed", which no rerun reproduces and no report could record);
- `downstream(make, fields)`: the config a later stage builds from these settings, built now, its
  refusal named by the settings it came from.
Nothing here reads a file or a model: that is preflight's (runs/loop/preflight.py).
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

from exactedit.native.llamacpp.generate import SEED_LIMIT, seed_problem

__all__ = ["MAX_BOOT", "MAX_SAMPLES", "SEED_LIMIT", "downstream", "flag", "integers", "numbers", "refusal",
           "reply_room", "seeds", "utf8_paths"]

MAX_SAMPLES = 256       # replies per prompt (and side): --samples 10^9 listed a billion seeds after the preflight
MAX_BOOT = 10_000       # bootstrap resamples (default 1000): 10^9 was a [10^9, prompts] array after the generation


def flag(name: str, flags=()) -> str:
    """The setting's name, with its flag where it has one (`flags`): "rules_bias (--rules-bias)"; a
    setting without a flag comes from the model's bundled settings file or the class's default."""
    return f"{name} (--{name.replace('_', '-')})" if name in flags else name


def integers(cfg, lows: Mapping[str, int], flags=(), highs: Mapping[str, tuple[int, str]] | None = None) -> list[str]:
    """Each field of `lows` an integer (not a bool) >= its low, and at most its high where `highs`
    gives one (name -> (high, why the bound))."""
    out = []
    for name, low in lows.items():
        v = getattr(cfg, name)
        high, why = (highs or {}).get(name, (None, ""))
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            most = f" and at most {high}" if high is not None else ""
            out.append(f"{flag(name, flags)}: expected an integer >= {low}{most}, got {v!r}")
        elif high is not None and v > high:
            out.append(f"{flag(name, flags)}: {v} is more than {high} ({why})")
    return out


def numbers(cfg, bounds: Mapping[str, tuple[float | None, float | None, str]], flags=()) -> list[str]:
    """Each field of `bounds` a finite number within (low, high) as `closed` says: "[]", "(]",
    "[)" or "()" (None: unbounded on that side)."""
    out = []
    for name, (low, high, closed) in bounds.items():
        v = getattr(cfg, name)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if ok and low is not None:
            ok = v >= low if closed[0] == "[" else v > low
        if ok and high is not None:
            ok = v <= high if closed[1] == "]" else v < high
        if not ok:
            where = (f"{closed[0]}{'-inf' if low is None else f'{low:g}'}, "
                     f"{'inf' if high is None else f'{high:g}'}{closed[1]}")
            out.append(f"{flag(name, flags)}: expected a finite number in {where}, got {v!r}")
    return out


def seeds(seed, derived: Mapping[str, tuple[int, int]], flags=()) -> list[str]:
    """`seed` and the seeds derived from it, `derived`: what they seed -> (offset, count) (seeds
    seed + offset ... seed + offset + count - 1), all in llama.cpp's range (module doc)."""
    bad = seed_problem(seed, flag("seed", flags))
    if bad is not None:
        return [bad]
    out = []
    for what, (offset, count) in derived.items():
        span = offset + max(int(count), 1) - 1 if isinstance(count, int) else offset
        if span >= SEED_LIMIT:          # no seed gives this many: the count is what to change
            out.append(f"{flag('seed', flags)}: {what} need the seeds seed + {offset} ... seed + {span}, more "
                       f"than llama.cpp's {SEED_LIMIT} seeds: give fewer replies")
        elif int(seed) + span >= SEED_LIMIT:
            out.append(f"{flag('seed', flags)}: {seed} gives {what} the seeds up to seed + {span} = "
                       f"{int(seed) + span}, past llama.cpp's last seed {SEED_LIMIT - 1}: give a seed <= "
                       f"{SEED_LIMIT - 1 - span}")
    return out


def utf8_paths(cfg, names: Sequence[str], flags=()) -> list[str]:
    """Each path-valued field of `names` (a path, or a tuple of them; None: not given) UTF-8 text: a
    file name of bytes that are not UTF-8 reaches Python as a lone surrogate, and the run writes its
    inputs' paths into its protocol, reports and phrase list, where it was a UnicodeEncodeError
    after the generation (the protocol) or at the very end (the report)."""
    from exactedit.files import lone_surrogate

    out = []
    for name in names:
        v = getattr(cfg, name)
        for p in (v if isinstance(v, (tuple, list)) else (v,)):
            at = None if p is None else lone_surrogate(str(p))
            if at is not None:
                out.append(f"{flag(name, flags)}: {ascii(str(p))} is not UTF-8 (a byte no UTF-8 text holds, at "
                           f"character {at}): give a path of UTF-8 text")
                break
    return out


def reply_room(max_new, flags=()) -> list[str]:
    """`max_new` leaves room for a prompt in the engine's context: the loops generate with the
    default EngineSettings (n_ctx 2048), and a reply cap of n_ctx or more was refused only when the
    first generation began, as "needs 1..-N tokens"."""
    from exactedit.native.llamacpp.engine import EngineSettings

    n_ctx = EngineSettings().n_ctx
    if isinstance(max_new, int) and not isinstance(max_new, bool) and max_new >= n_ctx:
        return [f"{flag('max_new', flags)}: {max_new} leaves no room for a prompt in the engine's context of "
                f"{n_ctx} tokens: give at most {n_ctx - 1} (less the longest prompt's tokens)"]
    return []


def downstream(make: Callable[[], object], settings: Sequence[str], flags=()) -> list[str]:
    """The config a later stage builds, built now by `make`: its refusal (a ValueError, or an
    exactedit error) as a problem naming the `settings` it is built from."""
    from exactedit.errors import ExacteditError

    try:
        make()
    except (ValueError, TypeError, ExacteditError) as exc:
        return [f"{', '.join(flag(s, flags) for s in settings)}: {exc}"]
    return []


def refusal(error: type[Exception], what: str, problems: Sequence[str]) -> Exception:
    """One `error` listing every problem, so one fix-and-retry round is enough."""
    n = len(problems)
    return error(f"{what}: {n} setting{'s' * (n != 1)} refused, before any generation:\n"
                 + "\n".join(f"  - {p}" for p in problems))
