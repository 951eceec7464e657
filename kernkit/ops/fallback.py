"""The reference fallback: when no kernel can be built, an op says so once and uses the torch
reference implementation, unless strict mode asks it to raise.

"No kernel can be built" means a compiler the build needs is missing (``ToolchainError``) or
``KERNKIT_JIT=off`` and the specialization is not in the cache (``JitDisabledError``). A
``CompileError`` (a bug in a kernel) and a ``CaptureCompileError`` (a cold key reached inside a
CUDA-graph capture) always raise. The decision is made in an op's cached module factory, once per
specialization, so the per-call path is the same whichever implementation it ends up calling.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from typing import TypeVar

from ..jit import JitDisabledError, ToolchainError, cache_once, is_arch_support_pdl
from ..jit.codegen import INCLUDE_DIR
from ..jit.toolchain import find_cuda_home

__all__ = ["CPU_OPS_VAR", "STRICT_VAR", "cpu_backend", "kernel_for_device", "kernel_or_reference", "strict_mode"]

#: ``KERNKIT_STRICT=1``: never fall back to the torch reference; raise the build error instead.
STRICT_VAR = "KERNKIT_STRICT"
#: ``KERNKIT_CPU_OPS``: how the ops treat CPU tensors. ``auto`` (default): the CPU emulation
#: backend when this machine has what it needs, else the torch reference; ``emu`` or
#: ``reference`` to force one.
CPU_OPS_VAR = "KERNKIT_CPU_OPS"

T = TypeVar("T")

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def strict_mode() -> bool:
    """Whether ``KERNKIT_STRICT`` is set to a true value (read when a factory runs)."""
    return os.environ.get(STRICT_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def kernel_or_reference(op: str, load: Callable[[], T], reference: T) -> T:
    """``load()`` (the kernel), or ``reference`` when no kernel can be built here.

    The fallback warns once per op and reason (``RuntimeWarning``); with ``KERNKIT_STRICT=1`` the
    build error propagates instead."""
    try:
        return load()
    except (ToolchainError, JitDisabledError) as e:
        if strict_mode():
            raise
        reason = "no compiler" if isinstance(e, ToolchainError) else "KERNKIT_JIT=off and not in the cache"
        with _warned_lock:
            first = (op, reason) not in _warned
            _warned.add((op, reason))
        if first:
            warnings.warn(
                f"kernkit: {op}: no kernel can be built ({reason}), using the torch reference implementation "
                f"(slower; set {STRICT_VAR}=1 to raise instead): {e}",
                RuntimeWarning,
                stacklevel=4,
            )
        return reference


def kernel_for_device(op: str, is_cuda: bool, load: Callable[[str, bool], T], reference: T) -> T:
    """The ops' one backend policy: for CUDA tensors ``load("cuda", pdl)`` (PDL where the GPU
    has it), for CPU tensors the emulator build ``load("cpu", False)`` when ``cpu_backend()``
    allows it; ``reference`` where no kernel serves the tensors (``kernel_or_reference``)."""
    if is_cuda:
        return kernel_or_reference(op, lambda: load("cuda", is_arch_support_pdl()), reference)
    if cpu_backend() == "cpu":
        return kernel_or_reference(op, lambda: load("cpu", False), reference)
    return reference


@cache_once
def cpu_backend() -> str:
    """``"cpu"`` when CPU tensors run the kernels on kernkit's CPU emulator, ``"reference"`` when
    they use the torch implementations. Decided once per process, without building anything:
    the emulator needs its runtime header and CUDA's host-side headers (``cuda_fp16.h``...).
    A missing host compiler is handled later like any other build (``kernel_or_reference``)."""
    choice = os.environ.get(CPU_OPS_VAR, "auto").strip().lower()
    if choice not in ("auto", "emu", "reference"):
        raise ValueError(f"{CPU_OPS_VAR} must be auto, emu or reference, got {choice!r}")
    if choice == "reference":
        return "reference"
    home = find_cuda_home()
    if not (INCLUDE_DIR / "kernkit" / "emu" / "runtime.h").is_file():
        missing = "this kernkit has no CPU emulation backend"
    elif home is None or not (home / "include" / "cuda_fp16.h").is_file():
        missing = "the CPU emulator compiles against the CUDA toolkit's headers, and none was found (set CUDA_HOME)"
    else:
        return "cpu"
    if choice == "emu" or strict_mode():
        raise RuntimeError(f"kernkit: CPU tensors cannot run on the CPU emulator: {missing}")
    warnings.warn(f"kernkit: {missing}; CPU tensors use the torch reference ops", RuntimeWarning, stacklevel=3)
    return "reference"
