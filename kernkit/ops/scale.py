"""``scale``: element-wise ``x * factor`` (the kernel of ``docs/tutorial-add-a-kernel.md``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..jit import JitSpec, cache_once, is_arch_support_pdl, make_cpp_args
from .registry import register_op

#: The dtypes ``scale`` is specialized for.
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def scale_spec(dtype: torch.dtype, backend: str | None = None) -> JitSpec:
    """The build of one ``scale`` specialization: the factory below and ``warmup`` share it."""
    if dtype not in SCALE_DTYPES:
        raise TypeError(f"'src': unsupported dtype {dtype}; supported: float16, bfloat16, float32")
    args = make_cpp_args(dtype, backend != "emu" and is_arch_support_pdl())
    return JitSpec.make("scale", *args, cuda_files=["elementwise/scale.cuh"],
                        cuda_wrappers=[("scale", f"scale<{args}>")], backend=backend)


@cache_once
def _module(dtype: torch.dtype, is_cuda: bool):
    # Runs once per (dtype, device kind): the place for what Python must check.
    return scale_spec(dtype, None if is_cuda else "emu").build_and_load()


def _out(src: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(src, memory_format=torch.contiguous_format)


def _specializations(dtypes: Sequence[torch.dtype] = SCALE_DTYPES, backend: str | None = None) -> list[JitSpec]:
    return [scale_spec(d, backend) for d in dict.fromkeys(dtypes)]


@register_op(fake=_out, specializations=_specializations)
def scale(src: torch.Tensor, factor: float, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``src * factor``, computed in fp32 and rounded once to ``src.dtype``.

    Parameters
    ----------
    src
        A contiguous float16, bfloat16 or float32 tensor, on a CUDA device (or on the CPU,
        through kernkit's CPU emulator).
    factor
        The scale factor.
    out
        Optional, contiguous, same shape, dtype and device as ``src``.

    Returns
    -------
    torch.Tensor
        ``out``, or a new tensor shaped like ``src``.

    Example
    -------
    >>> x = torch.randn(1000, dtype=torch.bfloat16)
    >>> torch.equal(scale(x, 1.5), (x.float() * 1.5).to(torch.bfloat16))  # doctest: +SKIP
    True
    """
    if out is None:
        out = _out(src, factor)
    _module(src.dtype, src.is_cuda).scale(out, src, factor)
    return out
