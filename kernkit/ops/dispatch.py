"""C++ dispatch for the ops' eager calls: a small table in C++ from one tensor argument's dtype,
device type and row shape (its shape without the first dimension) to the specialization's
tvm-ffi function (``kernkit/include/kernkit/dispatch.h``).

Picking the specialization in Python costs about 0.5 us per call on a 2.8 GHz Xeon (reading
``.dtype``, ``.shape`` and ``.is_cuda`` of a torch tensor, hashing the shape, a dict lookup).
With a dispatcher an eager call is one tvm-ffi call: ``call(*args)`` reads the key tensor's
``DLTensor``, which tvm-ffi builds for the call anyway, and forwards the packed arguments
unchanged to the stored function. A miss calls nothing and returns False; the op then picks the
function in Python as before and registers it, so that the next call with that key hits::

    _dispatch = Dispatcher(arg_index=0)

    def op(cache, x):
        if not _dispatch.call(cache, x):
            fn = _op_fn(cache.dtype, cache.shape, cache.is_cuda)
            fn(cache, x)
            _dispatch.add(cache, fn)

An op may use a dispatcher only when the function its Python factory picks depends on nothing
but the key tensor's dtype, device type and shape after the first dimension: a hit skips the
factory. Each ``Dispatcher`` has its own table. Only functions of compiled modules are stored: a
key whose factory picked the torch reference misses every time (one tvm-ffi call that converts
the arguments, on top of the reference). On a hit the key argument is not checked to be a torch
tensor: anything tvm-ffi takes as a tensor (an object with ``__dlpack__``) goes through to the
launcher, as the op's other arguments always did.

The table's module (``kernels/dispatch/make_dispatch.h``) is plain C++, built and cached by
``load_jit`` like any other and loaded once per process. Where it cannot be built (no host
compiler: ``ToolchainError``; ``KERNKIT_JIT=off`` and not in the cache: ``JitDisabledError``; a
cache directory it cannot be written to: ``CacheDirError``) ``call`` always misses, silently: the
op gives the same results through its Python path. A ``CompileError`` raises, since the module is
kernkit's own code. A first call inside a CUDA-graph capture while the module is not built yet
takes the Python path and leaves the load to a later call (kernkit never compiles inside a
capture).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import tvm_ffi

from ..jit import CacheDirError, CaptureCompileError, JitDisabledError, JitRequest, ToolchainError, cache_once

__all__ = ["Dispatcher", "dispatch_module", "dispatch_request", "dispatch_status"]

logger = logging.getLogger("kernkit.ops")


def dispatch_request() -> JitRequest:
    """The build of the dispatch table's host module (plain C++, no CUDA needed)."""
    return JitRequest.make("dispatch", cpp_files=["dispatch/make_dispatch.h"],
                           cpp_wrappers=[("make_dispatch", "make_dispatch")])


def dispatch_status() -> str:
    """How the ops will pick their specializations in this environment, for ``doctor``: whether
    the dispatch table's module is in the cache, can be built on first use, or neither (then
    the ops look up in Python). Compiles nothing."""
    from ..jit import cache as jit_cache
    from ..jit.config import jit_enabled
    from ..jit.toolchain import find_cxx

    spec = dispatch_request().spec()
    entry = jit_cache.Entry.of(spec, jit_cache.key_material(spec))
    if jit_cache.newest_published(entry) is not None:
        return "in C++ (the dispatch table's module is in the cache)"
    if not jit_enabled():
        return "in Python (KERNKIT_JIT=off and the dispatch table's module is not in the cache)"
    try:
        find_cxx()
    except ToolchainError:
        return "in Python (no host C++ compiler to build the dispatch table's module)"
    return "in C++ once the first op call builds the dispatch table's module (a few seconds)"


@cache_once
def dispatch_module() -> tvm_ffi.Module | None:
    """The loaded dispatch module, or None when it cannot be built here."""
    try:
        return dispatch_request().load()
    except (ToolchainError, JitDisabledError, CacheDirError) as e:
        logger.debug("kernkit: no C++ dispatch, the ops pick their kernels in Python: %s", e)
        return None


def _miss(*args: Any) -> bool:
    return False


class Dispatcher:
    """One op's C++ dispatch table (see the module docstring).

    ``call(*args)``: True when ``args[arg_index]`` is a tensor whose key was added, after
    calling the stored function with ``args``; False, without calling anything, otherwise.
    ``add(tensor, fn)``: make calls with ``tensor``'s key go to ``fn``. The module is loaded on
    the first ``call``; ``call`` is then the C++ function itself (an attribute, no Python frame
    in between).
    """

    __slots__ = ("_add", "_arg_index", "_lock", "_resolved", "call")

    def __init__(self, arg_index: int) -> None:
        self._arg_index = arg_index
        self._lock = threading.Lock()
        self._resolved = False
        self._add: Callable[..., object] | None = None
        self.call: Callable[..., bool] = self._first_call

    def _first_call(self, *args: Any) -> bool:
        with self._lock:
            if not self._resolved:
                try:
                    module = dispatch_module()
                except CaptureCompileError:
                    return False  # not built yet, and nothing compiles inside a capture: try later
                if module is None:
                    self.call = _miss
                else:
                    call, add = module.make_dispatch(self._arg_index)
                    self._add = add  # before call, so a thread that sees the new call can add
                    self.call = call
                self._resolved = True
        return self.call(*args)

    def add(self, tensor: object, fn: object) -> None:
        """Send later calls whose key tensor has ``tensor``'s key to ``fn``. Only the functions
        of compiled modules are stored (never a torch reference fallback, which is a Python
        function); a key already present, a tensor of more than 6 dimensions or a full table
        (16 keys) stores nothing."""
        if self._add is not None and isinstance(fn, tvm_ffi.Function):
            self._add(tensor, fn)
