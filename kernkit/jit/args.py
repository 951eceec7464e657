"""Template arguments: Python values rendered as C++ template arguments."""

from __future__ import annotations

import math

import torch

# torch dtypes -> the C++ aliases kernkit's headers define (kernkit/include/kernkit/utils.cuh)
# or the standard fixed-width integer types.
DTYPE_TO_CPP: dict[torch.dtype, str] = {
    torch.float32: "fp32_t",
    torch.float16: "fp16_t",
    torch.bfloat16: "bf16_t",
    torch.float8_e4m3fn: "fp8_e4m3_t",
    torch.float8_e5m2: "fp8_e5m2_t",
    torch.float64: "double",
    torch.int8: "int8_t",
    torch.int16: "int16_t",
    torch.int32: "int32_t",
    torch.int64: "int64_t",
    torch.uint8: "uint8_t",
    torch.uint16: "uint16_t",
    torch.uint32: "uint32_t",
    torch.uint64: "uint64_t",
    torch.bool: "bool",
}


class CppArgs(tuple):
    """Rendered template arguments.

    A tuple of C++ spellings, so ``load_jit("scale", *args)`` puts them in the build marker, and
    ``str(args)`` joins them with ``", "`` for use inside ``Template<{args}>``.
    """

    __slots__ = ()

    def __str__(self) -> str:
        return ", ".join(self)

    def __repr__(self) -> str:
        return f"CppArgs({', '.join(self)})"


def _render(value: object) -> str:
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"make_cpp_args: a template argument must be finite, got {value!r}")
        text = repr(value)
        return text if any(c in text for c in ".e") else text + ".0"
    if isinstance(value, torch.dtype):
        try:
            return DTYPE_TO_CPP[value]
        except KeyError:
            supported = ", ".join(str(d).removeprefix("torch.") for d in DTYPE_TO_CPP)
            raise TypeError(f"make_cpp_args: no C++ type for {value}; supported: {supported}") from None
    raise TypeError(
        f"make_cpp_args: cannot render {value!r} (type {type(value).__name__}) as a C++ template "
        "argument; expected bool, int, float or torch.dtype"
    )


def make_cpp_args(*args: object) -> CppArgs:
    """Render Python values as C++ template arguments.

    ``bool`` -> ``true``/``false``, ``int`` and ``float`` -> literals, ``torch.dtype`` -> kernkit's
    C++ alias (``torch.bfloat16`` -> ``bf16_t``). Anything else raises ``TypeError``.
    """
    return CppArgs(_render(a) for a in args)
