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

from ..jit import JitDisabledError, ToolchainError

__all__ = ["STRICT_VAR", "kernel_or_reference", "strict_mode"]

#: ``KERNKIT_STRICT=1``: never fall back to the torch reference; raise the build error instead.
STRICT_VAR = "KERNKIT_STRICT"

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
