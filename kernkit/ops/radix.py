"""``compare_key``: the common-prefix length of two token sequences, for radix-tree matching."""

from __future__ import annotations

import torch
from torch.compiler import is_dynamo_compiling

from ..jit import JitRequest, cache_once
from . import reference
from .argerrors import named_error
from .fallback import kernel_or_reference

__all__ = ["compare_key", "specializations"]


def compare_key_request() -> JitRequest:
    """The build of the host module (plain C++, no CUDA needed)."""
    return JitRequest.make("compare_key", cpp_files=["radix/compare_key.h"],
                           cpp_wrappers=[("compare_key", "compare_key")])


@cache_once
def _compare_key_fn():
    return kernel_or_reference("compare_key", lambda: compare_key_request().load().compare_key,
                               reference.compare_key)


def compare_key(a: torch.Tensor, b: torch.Tensor) -> int:
    """The number of leading positions where the 1-d int32 CPU tensors ``a`` and ``b`` hold the
    same token (compared up to the shorter length)."""
    if is_dynamo_compiling():  # traced by torch.compile: the custom op (kernkit/ops/library.py)
        return torch.ops.kernkit.compare_key(a, b)
    try:
        return _compare_key_fn()(a, b)
    except (TypeError, RuntimeError) as e:  # what tvm-ffi could not name (a non-tensor, a meta tensor)
        err = named_error(e, (("a", a), ("b", b)), (("a", a), ("b", b)))
        if err is e:
            raise
        raise err from e


def specializations() -> list[JitRequest]:
    """The one build ``compare_key`` needs, for ahead-of-time compilation."""
    return [compare_key_request()]
