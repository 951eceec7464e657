"""``scale``: element-wise ``x * factor`` (the kernel of ``docs/tutorial-add-a-kernel.md``)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch
import tvm_ffi
from torch.compiler import is_dynamo_compiling

from ..jit import JitRequest, cache_once, is_arch_support_pdl, make_cpp_args
from . import reference
from .argerrors import named_error
from .fallback import kernel_for_device

__all__ = ["scale", "specializations"]

#: The dtypes ``scale`` is specialized for.
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def scale_request(dtype: torch.dtype, use_pdl: bool, backend: str = "cuda") -> JitRequest:
    """The build of one ``scale`` specialization, shared by the module factory and warmup."""
    args = make_cpp_args(dtype, use_pdl)
    return JitRequest.make(
        "scale", *args,
        cuda_files=["elementwise/scale.cuh"],
        cuda_wrappers=[("scale", f"scale<{args}>")],
        backend=backend,
    )


@cache_once
def _scale_module(dtype: torch.dtype, is_cuda: bool) -> tvm_ffi.Module:
    # Runs once per (dtype, device kind), so this is where the dtype check costs nothing.
    if dtype not in SCALE_DTYPES:
        raise TypeError(f"'src': unsupported dtype {dtype}; supported: float16, bfloat16, float32")
    # No kernel can be built here: the reference, in a namespace shaped like the module.
    fallback = SimpleNamespace(scale=reference.scale)
    return kernel_for_device("scale", is_cuda, lambda backend, pdl: scale_request(dtype, pdl, backend).load(),
                             fallback)


def scale(src: torch.Tensor, factor: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``src * factor``, computed in fp32 and rounded once to ``src.dtype``.

    ``src``: a contiguous float16, bfloat16 or float32 tensor, on a CUDA device (or on the CPU,
    through kernkit's CPU emulator). ``out``: optional, same dtype, device and number of
    elements. Returns ``out`` (a new tensor shaped like ``src`` when not given).
    """
    if is_dynamo_compiling():  # traced by torch.compile: the custom ops (kernkit/ops/library.py)
        if out is None:
            return torch.ops.kernkit.scale(src, factor)
        torch.ops.kernkit.scale_out(out, src, factor)
        return out
    # Per-call path: pick the module, allocate, call. Tensor checks live in the C++ launcher.
    try:
        if out is None:
            out = torch.empty_like(src)
        _scale_module(src.dtype, src.is_cuda).scale(out.view(-1), src.view(-1), factor)
    except (AttributeError, TypeError, RuntimeError) as e:  # what torch or tvm-ffi could not name
        tensors = (("src", src),) if out is None else (("src", src), ("out", out))
        err = named_error(e, tensors, (("out", out), ("src", src), ("factor", factor)), contiguous=("src", "out"))
        if err is e:
            raise
        raise err from e
    return out


def specializations(dtypes: torch.dtype | Sequence[torch.dtype] = SCALE_DTYPES, *,
                    backend: str = "cuda") -> list[JitRequest]:
    """The builds ``scale`` needs for ``dtypes``, for ahead-of-time compilation
    (``python -m kernkit.jit warmup scale --dtype bf16``)."""
    dtypes = [dtypes] if isinstance(dtypes, torch.dtype) else list(dtypes)
    bad = [d for d in dtypes if d not in SCALE_DTYPES]
    if bad:
        raise TypeError(f"scale: unsupported dtype {bad[0]}; supported: float16, bfloat16, float32")
    use_pdl = is_arch_support_pdl() if backend == "cuda" else False
    return [scale_request(d, use_pdl, backend) for d in dict.fromkeys(dtypes)]
