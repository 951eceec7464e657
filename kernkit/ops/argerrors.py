"""Argument errors that torch or tvm-ffi raise while an op hands its arguments over, reworded
to name the argument.

The launchers name the argument of every tensor they check (``'k_cache': ...``). A few bad
arguments fail earlier, in code that does not know the names: tvm-ffi reports a value of the
wrong type by position (``Mismatched type on argument #2``), DLPack refuses a tensor on a
device it cannot describe (``Cannot pack tensors on meta``), ``Tensor.view`` refuses a
non-contiguous tensor, and attribute access fails on a non-tensor. The ops catch those
exceptions (a ``try`` costs nothing until something is raised) and raise what
``named_error`` returns instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

__all__ = ["named_error"]

_FFI_MISMATCH = re.compile(r"Mismatched type on argument #(\d+) when calling: `[^`]*`\. Expected `([^`]*)`")
_DEVICES = ("cpu", "cuda")
_NAMED = re.compile(r"'[A-Za-z_]\w*': ")


def _expected(ffi_type: str) -> str:
    return "a tensor" if ffi_type.startswith("DLTensor") or ffi_type.endswith("Tensor") else ffi_type


def named_error(exc: BaseException, tensors: Sequence[tuple[str, object]],
                ffi_args: Sequence[tuple[str, object]] = (), contiguous: Sequence[str] = ()) -> BaseException:
    """The exception to raise for ``exc``: one that names the offending argument when ``exc``
    is one of the unnamed failures above, else ``exc`` itself.

    ``tensors``: the (name, value) pairs that must be tensors; ``ffi_args``: the (name, value)
    pairs in the order the kernel function takes them, for tvm-ffi's positional messages;
    ``contiguous``: the names of the tensors that must be contiguous (an op that views them
    flat fails in ``view``, or in allocating an output like an expanded input, before the
    launcher can say so).
    """
    msg = str(exc)
    if _NAMED.match(msg):  # a launcher's or an op's own message: already named
        return exc
    for name, value in tensors:
        if not isinstance(value, torch.Tensor):
            return TypeError(f"'{name}': expected a tensor, got {type(value).__name__}")
    m = _FFI_MISMATCH.match(msg)
    if isinstance(exc, TypeError) and m and int(m.group(1)) < len(ffi_args):
        name, value = ffi_args[int(m.group(1))]
        return TypeError(f"'{name}': expected {_expected(m.group(2))}, got {type(value).__name__}")
    for name, value in tensors:
        if value.device.type not in _DEVICES:
            return ValueError(f"'{name}': expected a cuda or cpu tensor, got a {value.device.type} tensor")
    for name, value in tensors:
        if name in contiguous and not value.is_contiguous():
            return ValueError(f"'{name}': expected a contiguous tensor, got shape {list(value.shape)} "
                              f"with strides {list(value.stride())}")
    return exc
