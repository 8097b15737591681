"""Where JAX work runs and at what matmul precision: `--device cpu|gpu|auto`, `--precision`.

Precision modes (`DeviceConfig.precision`):
  exact  float32 operands and products, float32 accumulation (XLA precision HIGHEST); the default,
         and the only mode whose results the solvers report as exact;
  tf32   operands rounded to TF32 (10 significand bits, to nearest even), float32 accumulation:
         the tensor cores' float32 mode. Opt-in.
  bf16   operands rounded to bfloat16, float32 accumulation. Opt-in.
The rounding of tf32 and bf16 is done explicitly (`round_operand`), so a mode means the same
numbers on every backend: on a GPU the rounded operands go to the matching tensor-core algorithm,
on the CPU (which has no TF32 unit) to a float32 product of the same rounded values. Faster modes
are opt-in and report their measured KL against exact mode (`solvers.tail.passes.device_pass.measure_precision`).

`scope(cfg)` makes the device and the default matmul precision current for code that does not take
them as arguments (the solvers' jitted steps): inside it, plain `jnp.dot` runs at the mode's
precision on the chosen device. Selecting a GPU that JAX does not see is an error, never a fallback.

Setting up a device (`select`, `pass_device`, `scope`) turns on JAX's persistent compilation cache
(`solvers.tail.forward.jax_cache`: ~/.cache/exactedit/jax, EXACTEDIT_JAX_CACHE=PATH or off), so a fresh
process reuses the XLA programs an earlier one compiled, and, when the user has not set XLA_FLAGS,
sets `--xla_gpu_enable_triton_gemm=false` before JAX's backends start: XLA's Triton gemm autotuning
costs 10-14 s per new matmul shape on an H200, cuBLAS alone compiles in under a second and runs the
exact pass as fast (docs/performance.md). A user's XLA_FLAGS is kept as it is.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from exactedit.errors import ExacteditError
from exactedit.solvers.tail.forward.jax_cache import compilation_cache_state, enable_compilation_cache

#: XLA_FLAGS when the user sets none (read by JAX when its backends start)
DEFAULT_XLA_FLAGS = "--xla_gpu_enable_triton_gemm=false"

DEVICES = ("cpu", "gpu", "auto")
PRECISIONS = ("exact", "tf32", "bf16")

#: jax.default_matmul_precision names of each mode
_JAX_PRECISION = {"exact": "highest", "tf32": "tensorfloat32", "bf16": "bfloat16"}


class DeviceError(ExacteditError):
    """The requested device is not available to JAX, or a device setting is invalid."""


@dataclass(frozen=True)
class DeviceConfig:
    """Device and precision of the JAX paths (CLI: --device, --precision)."""

    device: str = "auto"
    precision: str = "exact"

    def __post_init__(self):
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")


def gpu_devices() -> list:
    """The CUDA devices JAX sees (empty when there is none or no CUDA plugin)."""
    try:
        return list(jax.devices("gpu"))
    except RuntimeError:
        return []


def default_xla_flags(environ=None) -> str:
    """XLA_FLAGS as JAX will start with: the user's when set, else DEFAULT_XLA_FLAGS, written into
    the environment while JAX's backends have not started (after that XLA_FLAGS no longer applies,
    and it is left alone)."""
    import os

    from jax._src import xla_bridge

    env = os.environ if environ is None else environ
    if "XLA_FLAGS" not in env and not xla_bridge.backends_are_initialized():
        env["XLA_FLAGS"] = DEFAULT_XLA_FLAGS
    return env.get("XLA_FLAGS", "")


def _setup() -> None:
    default_xla_flags()
    enable_compilation_cache()


def select(device: str = "auto"):
    """The jax.Device for "cpu", "gpu" (the first CUDA device; DeviceError if none) or "auto"
    (a CUDA device when JAX sees one, else the CPU)."""
    _setup()
    if device not in DEVICES:
        raise DeviceError(f"--device {device!r}: expected one of {', '.join(DEVICES)}")
    if device == "cpu":
        return jax.devices("cpu")[0]
    gpus = gpu_devices()
    if gpus:
        return gpus[0]
    if device == "gpu":
        raise DeviceError("--device gpu: JAX sees no CUDA device (jax.devices('gpu') is empty or the "
                          f"CUDA plugin is not installed; backend {jax.default_backend()!r}); install "
                          "jax[cuda12] or jax[cuda13] on a machine with an NVIDIA GPU, or use --device cpu")
    return jax.devices("cpu")[0]


def is_gpu(dev) -> bool:
    return dev.platform in ("gpu", "cuda", "rocm")


def describe(dev) -> dict:
    """Platform, device kind, JAX version and the XLA / JAX settings that change GPU timings (XLA_FLAGS,
    the persistent compilation cache: {"dir", "on"}), for reports."""
    import os

    return {"platform": dev.platform, "device_kind": getattr(dev, "device_kind", dev.platform),
            "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "compilation_cache": compilation_cache_state()}


def pass_device(device="auto"):
    """Where a solver's full-vocab passes and checkpoint scoring run: None for the host numpy path
    (the reference, bit-for-bit what the solvers did before there was a device path), or a jax.Device.
    "cpu" -> None; "gpu" -> the first CUDA device (DeviceError if JAX sees none); "auto" -> the GPU
    when JAX sees one, else None. A jax.Device is returned as is: the device path on that device
    (how the tests run the device path on the CPU backend)."""
    _setup()
    if not isinstance(device, str):
        return device
    if device not in DEVICES:
        raise DeviceError(f"--device {device!r}: expected one of {', '.join(DEVICES)}")
    if device == "cpu" or (device == "auto" and not gpu_devices()):
        return None
    return select(device)


@contextlib.contextmanager
def scope(cfg: DeviceConfig, device=None):
    """Run the body on cfg's device (or `device`, a jax.Device, when given) with cfg's default matmul
    precision; yields the jax.Device."""
    dev = select(cfg.device) if device is None else device
    with jax.default_device(dev), jax.default_matmul_precision(_JAX_PRECISION[cfg.precision]):
        yield dev


# ---- operand rounding and the product of a mode (traceable) ----------------------------------------

def round_tf32(x):
    """float32 -> the nearest TF32 value (10 significand bits, ties to even), kept as float32;
    inf and NaN unchanged. Overflow past the largest TF32 value gives inf, as the conversion does."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    up = bits + jnp.uint32(0xFFF) + ((bits >> 13) & 1)
    rounded = jax.lax.bitcast_convert_type(up & jnp.uint32(0xFFFFE000), jnp.float32)
    return jnp.where(jnp.isfinite(x), rounded, x)


def round_operand(x, precision: str):
    """An operand as the mode multiplies it: float32 (exact), TF32 values as float32, or bfloat16."""
    if precision == "exact":
        return x.astype(jnp.float32)
    if precision == "tf32":
        return round_tf32(x.astype(jnp.float32))
    if precision == "bf16":
        return x.astype(jnp.bfloat16)
    raise DeviceError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")


def dot_nt(a, b, precision: str, platform: str):
    """a [T, n] @ b [V, n]^T -> float32 [T, V], operands already rounded by `round_operand`.

    exact: precision HIGHEST (float32 products and sums). tf32: on a GPU the TF32 tensor-core
    algorithm (the operands are TF32 values, so it rounds nothing more); on the CPU the float32
    product of the same values. bf16: bfloat16 operands, float32 accumulation."""
    dims = (((1,), (1,)), ((), ()))
    if precision == "tf32" and platform in ("gpu", "cuda"):
        prec = jax.lax.DotAlgorithmPreset.TF32_TF32_F32
    elif precision == "bf16":
        prec = jax.lax.Precision.DEFAULT
    else:
        prec = jax.lax.Precision.HIGHEST
    return jax.lax.dot_general(a, b, dims, precision=prec, preferred_element_type=jnp.float32)
